"""The jobs' console: by default no Ray, Ray Train, HF or math-verify line reaches the terminal, the job's
logs/ folder holds them, and no process the job started outlives it. `job_console` itself is checked in-process.

The subprocess runs use the tiny preset with the smallest budgets (2 steps, 3 questions); each starts its own
private Ray cluster on 127.0.0.1 (the session fixture's cluster is not theirs to join).
"""

import logging
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from recmas_ray.console import current, job_console

ROOT = Path(__file__).resolve().parents[2]

LIBRARY_LINE = re.compile(r"pid=\d+\)|\b(INFO|WARNING|ERROR)\b|\w*Warning\b|Traceback|\bRay\b|\bray[._:/]|raylet|"
                          r"PlacementGroup|TrainController|RayTrainWorker|transformers|huggingface|math.verify|"
                          r"core_worker|\w+\.(py|cc):\d+")
"""A line printed by Ray (driver, forwarded workers, daemons), Ray Train, HF or math-verify, or any log record."""


OWN_PHASE = re.compile(r"^(checking inputs|starting Ray \(a private local cluster\)|joining the Ray cluster|"
                       r"starting agents \(Ray actors\)|inner training|outer training)")
"""The job's own phase lines (console.py), which name Ray as what they do."""


def library_lines(text: str) -> list[str]:
    return [ln for ln in text.replace("\r", "\n").splitlines() if LIBRARY_LINE.search(ln) and not OWN_PHASE.match(ln)]


def _descendants(psutil, root: int) -> dict[int, float]:
    """pid -> start time of every live process below `root` (start times tell a reused pid apart)."""
    try:
        kids = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    seen = {}
    for p in kids:
        try:
            seen[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            pass
    return seen


def _survivors(psutil, started: dict[int, float]) -> list[str]:
    """The recorded processes still alive (same pid and start time), zombies excluded."""
    alive = []
    for pid, t0 in started.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == t0 and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return alive


def run_job_watched(args: list[str], *, timeout_s: float = 400.0):
    """Run `python -m jobs.<args>` in a fresh process, recording every process below it while it runs; returns
    (completed process, recorded pid -> start time, recorded processes still alive 20 s after it exited)."""
    psutil = pytest.importorskip("psutil")
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # its own private cluster, never the session fixture's
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    started: dict[int, float] = {}
    deadline = time.monotonic() + timeout_s
    out_chunks, err_chunks = [], []

    def drain(stream, into):
        into.append(stream.read())

    readers = [threading.Thread(target=drain, args=(proc.stdout, out_chunks), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, err_chunks), daemon=True)]
    for t in readers:
        t.start()
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs.{args[0]} ran past {timeout_s} s")
            started.update(_descendants(psutil, proc.pid))
            time.sleep(0.2)
    finally:
        if proc.poll() is None:  # only the process this test started, and what it started
            for pid in _descendants(psutil, proc.pid):
                try:
                    psutil.Process(pid).kill()
                except psutil.NoSuchProcess:
                    pass
            proc.kill()
            proc.wait(timeout=30)
    for t in readers:
        t.join(timeout=30)
    alive = _survivors(psutil, started)
    for _ in range(40):  # Ray's daemons may take a moment after the driver exits
        if not alive:
            break
        time.sleep(0.5)
        alive = _survivors(psutil, started)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "".join(out_chunks), "".join(err_chunks))
    return done, started, alive


JOBS = {
    "run": (["jobs.run", "--style", "sequential_light", "--preset", "tiny", "--dataset", "{questions}",
             "--backend", "ray", "--num_recursive_rounds", "1", "--latent_steps", "2", "--max_new_tokens", "4",
             "--num_samples", "3", "--output_path", "{out}"], "run.log"),
    "train_inner": (["jobs.train_inner", "--style", "sequential", "--mas_role", "planner", "--preset", "tiny",
                     "--dataset_name", "synthetic:16", "--save_dir", "{out}", "--max_steps", "2", "--save_every", "2"],
                    "train_inner.log"),
    "train_outer": (["jobs.train_outer", "--style", "sequential_light", "--preset", "tiny", "--dataset_name",
                     "synthetic:8", "--save_dir", "{out}", "--num_recursive_rounds", "1", "--max_latent_tokens", "4",
                     "--max_steps", "2", "--save_every", "2"], "train_outer.log"),
}


@pytest.mark.integration  # three jobs, each starting its own Ray cluster: ~1 min each on 2 busy cores
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("job", sorted(JOBS))
def test_job_console_is_quiet_and_leaves_no_process(job, tmp_path, tiny_cache):
    args, log_name = JOBS[job]
    questions = ROOT / "jobs" / "examples" / "questions.jsonl"
    out = tmp_path / "out"
    done, started, alive = run_job_watched([a.format(questions=questions, out=out) for a in args])
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    assert library_lines(console) == [], console[-3000:]
    log = (out / "logs" / log_name).read_text(encoding="utf-8")
    assert re.search(r"pid=\d+\)", log), log[-2000:]  # Ray workers' forwarded output landed in the log
    assert library_lines(log), log[-2000:]
    assert len(started) >= 3, started  # at least Ray's GCS, raylet and a worker were seen (the watch works)
    assert alive == [], alive
    if job == "train_outer":  # human lines on stdout, the same figures as JSON beside the links
        import json

        assert json.loads((out / "train_summary.json").read_text())["step"] == 2
        assert f"outer links: {out} (step 2, loss " in done.stdout, done.stdout
    else:
        assert "%|" in done.stderr  # the progress bar (samples or steps) was drawn


@pytest.mark.integration  # one more Ray Train run (~45 s)
@pytest.mark.timeout(900)
def test_verbose_restores_the_libraries_output(tmp_path, tiny_cache):
    args, log_name = JOBS["train_inner"]
    out = tmp_path / "out"
    done, _, alive = run_job_watched([a.format(out=out) for a in args] + ["--verbose"])
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert re.search(r"pid=\d+\)", done.stdout + done.stderr)  # the workers' output, on the console again
    assert not (out / "logs").exists() and alive == []


def test_job_console_routes_library_output_to_the_log(tmp_path, capfd):
    log_dir = tmp_path / "o" / "logs"
    with job_console(log_dir, verbose=False, name="t") as console:
        assert current() is console
        console.settle_logs()
        logging.getLogger("ray.train").warning("ray train says hi")
        logging.getLogger("math_verify.grader").warning("math-verify says hi")
        print("a stray print")
        os.write(2, b"C code on fd 2\n")
        warnings.warn("a library warning")
        console.line("| result table |")
        console.warn("user-facing note")
    out, err = capfd.readouterr()
    assert out == "| result table |\n" and err == "warning: user-facing note\n"
    log = (log_dir / "t.log").read_text()
    for text in ("ray train says hi", "math-verify says hi", "a stray print", "C code on fd 2", "a library warning"):
        assert text in log
    print("after the job")  # streams are restored
    assert capfd.readouterr().out == "after the job\n"


def test_verbose_console_shows_everything_and_writes_no_log(tmp_path, capfd):
    with job_console(tmp_path / "logs", verbose=True, name="t") as console:
        print("a stray print")
        console.line("result")
    assert capfd.readouterr().out == "a stray print\nresult\n" and not (tmp_path / "logs").exists()


def test_bad_input_before_any_work_writes_no_log(tmp_path):
    with pytest.raises(ValueError):
        with job_console(tmp_path / "o" / "logs", verbose=False, name="t"):
            print("checking inputs")
            raise ValueError("--lr must be > 0")
    assert not (tmp_path / "o").exists()
    with pytest.raises(RuntimeError):  # a run that failed after starting keeps its log
        with job_console(tmp_path / "p" / "logs", verbose=False, name="t") as console:
            console.start("training")
            print("worker died")
            raise RuntimeError("worker died")
    assert "worker died" in (tmp_path / "p" / "logs" / "t.log").read_text()


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
