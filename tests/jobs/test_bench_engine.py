"""jobs/bench/engine.py at a tiny size: every mode runs, the steady-state figures and latency percentiles are
written per round with their load, and every batched run's text and latents match the unbatched path's."""

import json

from jobs.bench import engine


def test_the_engine_benchmark_compares_batched_runs_with_the_unbatched_path(tmp_path, tiny_cache):
    argv = ["--model", "tiny:llama", "--repeats", "2", "--in_flight", "3", "--num_batches", "4",
            "--latent_steps", "3", "--tokens", "4", "--output_path", str(tmp_path)]
    assert engine.main(argv) == 0
    report = json.loads((tmp_path / "engine.json").read_text())
    assert report["identical_outputs"] and report["rounds_done"] == 2
    assert [rd["order"] for rd in report["rounds"]] == [["unbatched", "batched_3"], ["batched_3", "unbatched"]]
    for rd in report["rounds"]:
        unbatched, batched = rd["runs"]["unbatched"], rd["runs"]["batched_3"]
        assert unbatched["batches"] == 4 and batched["batches"] == 9  # 3 x the places in flight
        assert batched["vs_unbatched"]["compared_batches"] == 4 and batched["vs_unbatched"]["text_identical"]
        assert batched["rows_per_step"] > 1 and batched["prefills"] <= 2 * 9
        for run in (unbatched, batched):
            assert run["latency_p50_s"] <= run["latency_p95_s"] and run["steady_window_batches"] > 0
            assert run["loadavg_1m_before"] >= 0
    summary = report["summary"]["batched_3"]["throughput_ratio_vs_unbatched"]
    assert summary["min"] <= summary["median"] <= summary["max"] and len(summary["values"]) == 2
