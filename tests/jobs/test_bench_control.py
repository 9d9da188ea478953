"""jobs.bench.control's capacity sweep: every batch of every run counted, and the capacity is the best run."""

import pytest

from jobs.bench import control
from jobs.bench.control import ControlBenchConfig


def test_capacity_is_the_highest_median_of_the_sweep_each_run_with_its_batches_per_slot(monkeypatch, tmp_path):
    asked = []

    def measure(cfg):
        asked.append((cfg.in_flight, cfg.num_batches))
        rate = {2: 100.0, 8: 300.0, 4: 200.0}[cfg.in_flight]
        return {"median_calls_per_s": rate, "orchestrator_cpu_ms_per_call": 1000.0 / rate,
                "calls_per_orchestrator_cpu_s": rate, "runs": []}

    monkeypatch.setattr(control, "measure", measure)
    cap = control.capacity(ControlBenchConfig(capacity_in_flight=[2, 8, 4], capacity_batches_per_slot=3,
                                              output_path=str(tmp_path)))
    assert asked == [(2, 6), (8, 24), (4, 12)]
    assert (cap["calls_per_s"], cap["in_flight"]) == (300.0, 8)
    assert [r["in_flight"] for r in cap["sweep"]] == [2, 8, 4]


@pytest.mark.integration
def test_capacity_sweep_on_ray_counts_every_agent_call(ray_cluster, tmp_path):
    """Zero-cost agents through one orchestrator at 2 and 4 in flight: every batch's 9 calls (R = 3, three roles)
    reach the agents' logs, whether alone or in a bulk Ray call."""
    cfg = ControlBenchConfig(capacity_in_flight=[2, 4], capacity_batches_per_slot=2, repeats=1,
                             timeout_s=120, output_path=str(tmp_path))
    cap = control.capacity(cfg)
    for row in cap["sweep"]:
        (run,) = row["runs"]
        assert run["agent_calls"] == 9 * row["num_batches"] == 9 * 2 * row["in_flight"]
        assert 1 <= run["ray_calls"] <= run["agent_calls"]
    assert cap["calls_per_s"] == max(r["median_calls_per_s"] for r in cap["sweep"]) > 0
