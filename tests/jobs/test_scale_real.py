"""jobs/bench/scale_real.py: a cost table without the roles' models is refused before anything is written; the
cores probe measures CPU; and (slow) the whole comparison runs on tiny random-weight agents."""

import json

import pytest

from jobs.bench import scale_real
from jobs.bench.scale_fit import fit_model


def test_a_fit_without_the_roles_models_exits_2_before_writing(tmp_path, capsys):
    costs = tmp_path / "scale_costs.json"
    costs.write_text(json.dumps({"fit": {"pkg:smollm2-135m-instruct": {"sim_params": {}}}}))
    out = tmp_path / "out"
    rc = scale_real.main(["--costs", str(costs), "--output_path", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "no fit for ['pkg:gemma3-270m']" in err and err.count("\n") == 1, err
    assert not (out / "scale_real.config.json").exists()


def test_the_probe_reads_cpu_seconds_per_second():
    cores = scale_real.probe_cores(1, 0.3)
    assert 0 < cores <= 1.05


def _tiny_fit(model: str) -> dict:
    pts = [{"rows": r, "prompt_tokens": 30, "prefill_ms": 2.0 + r, "prefill_ms_samples": [],
            "latent_step_ms": 1.0 + 0.1 * r, "latent_step_ms_samples": [], "decoded_token_ms": 1.0 + 0.1 * r,
            "decoded_token_ms_samples": []} for r in (1, 2)]
    return fit_model({"model": model, "points": pts})


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_tiny_agents_run_both_layouts_beside_the_model(tmp_path):
    costs = tmp_path / "scale_costs.json"
    costs.write_text(json.dumps({"fit": {m: _tiny_fit(m) for m in ("tiny:qwen3", "tiny:llama", "tiny:gemma3")}}))
    rc = scale_real.main(["--preset", "tiny", "--costs", str(costs), "--num_batches", "4", "--in_flight", "2",
                          "--repeats", "1", "--timeout_s", "600", "--output_path", str(tmp_path)])
    report = json.loads((tmp_path / "scale_real.json").read_text())
    assert rc == 0 and set(report["layouts"]) == {"whole_system", "per_role_pools"}
    for lay in report["layouts"].values():
        assert lay["measured_throughput_batches_per_s"] > 0 and lay["modelled_throughput_batches_per_s"] > 0
        assert lay["probed_cores"] > 0
