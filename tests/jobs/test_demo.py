"""The demo's --quick path on the tiny preset: inner + outer training, evaluation at R = 1, 2, 3, table, plot."""

import json

import pytest

from jobs import demo as demo_job


@pytest.mark.integration
def test_demo_quick_on_tiny_preset(tmp_path, ray_cluster, capsys):
    out = tmp_path / "demo"
    assert demo_job.main(["--preset", "tiny", "--quick", "--backend", "local", "--output_path", str(out),
                          "--no_progress"]) == 0
    printed = capsys.readouterr().out
    assert "heldout R=3|recursive_mas" in printed and "Token reduction" in printed
    assert (out / "demo_vs_rounds.png").stat().st_size > 1000
    results = json.loads((out / "demo_results.json").read_text())["results"]
    assert set(results) == {f"R={r}/{m}" for r in (1, 2, 3) for m in ("recursive_mas", "recursive_textmas")}
    for role in ("planner", "critic", "solver"):
        assert (out / "inner" / role / "links.safetensors").exists()
    assert (out / "outer" / "links.safetensors").exists()
    # fewer generated tokens than text recursion at every R, on the same questions
    for r in (1, 2, 3):
        assert results[f"R={r}/recursive_mas"]["tokens_per_sample,none"] < results[f"R={r}/recursive_textmas"][
            "tokens_per_sample,none"]
