"""jobs/gpu_check.sh: the dry run (--dry_run: the CPU, tiny shapes) runs every step and leaves one JSON and one
log; the step limits fit the 9-minute plan; a step past the budget is recorded as skipped and the rest still
run; the bandwidth floor follows the detected card; bad arguments exit 2 in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.bench.gpu_check import hbm_floor, record

ROOT = Path(__file__).resolve().parents[2]
SINGLE_GPU_STEPS = ("env", "engine", "speed", "latent_step", "costs", "backend", "replicas_local", "replicas_ray",
                    "replicas_compare")


def _run(*args, timeout=600):
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    return subprocess.run(["bash", str(ROOT / "jobs/gpu_check.sh"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(2400)  # 4 x the 480 s plan at most; ~1-2 min on 2 idle cores
def test_dry_run_exercises_every_step_into_one_json_and_one_log(tmp_path):
    out = tmp_path / "gc"
    res = _run("--dry_run", "--out", str(out), timeout=2400)
    data = json.loads((out / "gpu_check.json").read_text())
    assert res.returncode == 0, (res.stdout[-3000:], (out / "gpu_check.log").read_text()[-3000:])
    assert sorted(os.listdir(out)) == ["gpu_check.json", "gpu_check.log"]
    steps = data["steps"]
    assert [s for s in SINGLE_GPU_STEPS if steps[s]["status"] != "ok"] == []
    plan = steps["plan"]["result"]
    assert plan["dry_run"] is True and plan["device"] == "cpu" and plan["limit_scale"] == 4
    # the single-GPU plan's limits fit the 9-minute slot with ~60 s for the wheels' install and start-up
    assert sum(plan["plan_s"][s] for s in SINGLE_GPU_STEPS) <= plan["budget_s"] <= 540 - 60
    env = steps["env"]["result"]
    assert env["internals"]["ok"], env["internals"]
    assert env["hbm_bytes_per_s"] is None  # no card on a CPU run
    fit = steps["costs"]["result"]["fit"]
    assert set(fit) == {"pkg:smollm2-135m-instruct", "pkg:gemma3-270m"}
    assert steps["replicas_compare"]["result"]["same_predictions"] == steps["replicas_compare"]["result"]["samples"]
    assert "== replicas_ray" in (out / "gpu_check.log").read_text()


def test_steps_past_the_budget_are_recorded_as_skipped_and_none_is_lost(tmp_path):
    out = tmp_path / "gc"
    res = _run("--dry_run", "--out", str(out), "--budget_s", "0", timeout=300)
    assert res.returncode == 1
    steps = json.loads((out / "gpu_check.json").read_text())["steps"]
    assert {s: steps[s]["status"] for s in SINGLE_GPU_STEPS} == {s: "skipped" for s in SINGLE_GPU_STEPS}


@pytest.mark.parametrize("args, message", [(["--device", "tpu"], "--device 'tpu'"), (["--budget_s", "9m"], "'9m'"),
                                           (["--fast"], "unknown argument '--fast'")])
def test_bad_arguments_exit_2_in_one_line(tmp_path, args, message):
    res = _run(*args, "--out", str(tmp_path / "gc"), timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert not (tmp_path / "gc").exists()


@pytest.mark.parametrize("name, bw", [("NVIDIA H100 80GB HBM3", 3.35e12), ("NVIDIA H100 PCIe", 2.0e12),
                                      ("NVIDIA H100 NVL", 3.9e12), ("NVIDIA H200", 4.8e12), ("NVIDIA A10G", None)])
def test_the_bandwidth_floor_follows_the_card(name, bw):
    assert hbm_floor(name)[1] == bw


def test_record_keeps_each_steps_status_and_result(tmp_path):
    part = tmp_path / "engine.part.json"
    part.write_text(json.dumps({"speedup": 3.0}))
    record(str(tmp_path), "engine", 0, 12, 75, str(part))
    record(str(tmp_path), "speed", 124, 60, 60, str(tmp_path / "missing.part.json"))
    record(str(tmp_path), "backend", 1, 3, 60, None)
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert steps["engine"] == {"status": "ok", "rc": 0, "seconds": 12, "limit_s": 75, "result": {"speedup": 3.0}}
    assert steps["speed"]["status"] == "timeout" and steps["backend"]["status"] == "failed"
    assert not part.exists()  # folded into the one JSON
