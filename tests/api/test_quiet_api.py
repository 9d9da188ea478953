"""The Python API prints what the CLI jobs print: on the Ray backend, Ray's, Ray Data's, the workers' and the graders'
output goes to the System's log file (`verbose=True` shows it); the progress bar and the table stay.

Each case runs a fresh Python process with its own private Ray cluster on 127.0.0.1 (the session fixture's cluster
is not its to join)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.test_quiet_jobs import library_lines

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import recmas_ray as rm

with rm.System.build("sequential_light", preset="tiny", backend="ray", log_dir=sys.argv[1],
                     verbose=sys.argv[3] == "verbose") as system:
    out = system.generate(["What is 1 + 1?", "What is 2 + 2?"], num_recursive_rounds=1, latent_steps=2,
                          max_new_tokens=4)
    assert [len(a) for a in out] == [1, 1]
    report = system.evaluate("jobs/examples/questions.jsonl", num_samples=3, num_recursive_rounds=1, latent_steps=2,
                             max_new_tokens=4, output_path=sys.argv[2])
    print(report["table"])  # evaluate returns its table; the caller prints it (once)
    print("LOG", system.log_path)
"""


def _run(tmp_path, mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "logs"), str(tmp_path / "out"), mode],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.integration  # its own Ray cluster: ~1-2 min on 2 busy cores
@pytest.mark.timeout(1000)
def test_python_api_on_ray_prints_no_library_line_and_logs_them(tmp_path, tiny_cache):
    done = _run(tmp_path, "quiet")
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    assert library_lines(console) == [], console[-3000:]
    assert done.stdout.count("|questions|recursive_mas|accuracy,strict|") == 1  # the table, printed once by the caller
    assert "sample/s" in done.stderr or "s/sample" in done.stderr  # its progress bar
    logs = list((tmp_path / "logs").glob("api-*.log"))
    assert len(logs) == 1, logs
    log = logs[0].read_text(encoding="utf-8")
    assert "Ray session logs:" in log and library_lines(log), log[-2000:]  # Ray's lines landed there
