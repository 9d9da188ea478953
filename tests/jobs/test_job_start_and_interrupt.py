"""Every job talks from its first second, and Ctrl-C stops every job with one line and exit status 130.

First line: each job runs as a child process under `python -X importtime`, which writes a line to stderr as each
module is imported; the job's first console line ("checking inputs ...") must come before torch, Ray or
transformers is imported, and soon after the process starts (a generous bound: two seconds beyond what a bare
interpreter that imports the config layer takes here, so a loaded machine does not fail it).

Ctrl-C: the job runs in a session of its own (`start_new_session`), on the tiny preset, until it is in its heavy part
(Ray Train stepping, agents answering, serving); then SIGINT goes to its process group, as a terminal's Ctrl-C
does. It must exit 130 with one line ("interrupted; ...") and no traceback; Ray Train's own SIGINT handler (which
made train_inner exit 1 silently) never takes over.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ROOT / "jobs" / "examples" / "questions.jsonl"
HEAVY = ("torch", "ray", "transformers")


def _env() -> dict:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # each job starts its own private cluster, never the session fixture's
    return env


def _cmd(job: str, out: Path) -> list[str]:
    """A command line of `job` that does real work (its checks pass; on a terminal it would run to the end)."""
    tiny = ["--preset", "tiny"]
    return {
        "run": ["-m", "jobs.run", "--style", "sequential_light", *tiny, "--dataset", str(QUESTIONS),
                "--output_path", str(out)],
        "serve": ["-m", "jobs.serve", "--style", "sequential_light", *tiny, "--port", str(_free_port()),
                  "--log_dir", str(out)],
        "train_inner": ["-m", "jobs.train_inner", "--style", "sequential", "--mas_role", "planner", *tiny,
                        "--dataset_name", "synthetic:16", "--save_dir", str(out), "--max_steps", "5000",
                        "--save_every", "5"],
        "train_outer": ["-m", "jobs.train_outer", "--style", "sequential_light", *tiny, "--dataset_name",
                        "synthetic:8", "--save_dir", str(out), "--num_recursive_rounds", "1",
                        "--max_latent_tokens", "4", "--max_steps", "5000", "--save_every", "5"],
        "push_links": ["-m", "jobs.push_links", str(out), "--repo", "org/name", "--dry_run"],
        "demo": [str(ROOT / "jobs" / "demo.py"), *tiny, "--quick", "--backend", "local", "--output_path", str(out)],
    }[job]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _interpreter_start_s() -> float:
    """Seconds a bare interpreter takes here to import the config layer (the part of a job before its first line)."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import recmas_ray.config.cli"], cwd=ROOT, env=_env(), check=True,
                   timeout=120)
    return time.monotonic() - t0


@pytest.mark.parametrize("job", ["run", "serve", "train_inner", "train_outer", "push_links", "demo"])
def test_first_line_comes_before_heavy_imports_and_within_two_seconds(job, tmp_path):
    baseline = _interpreter_start_s()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-X", "importtime", *_cmd(job, tmp_path / "out")], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    imported, first, latency = [], None, None
    try:
        for line in proc.stderr:  # import lines ("import time: ... | module") until the job's own first line
            if not line.startswith("import time:"):
                first, latency = line.strip(), time.monotonic() - t0
                break
            imported.append(line.rsplit("|", 1)[-1].strip())
            assert time.monotonic() - t0 < 300, "no console line in 300 s"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # only the group this test started
        proc.wait(timeout=60)
    assert first == "checking inputs ...", (first, imported[-5:])
    heavy = sorted({m for m in imported if m.split(".")[0] in HEAVY})
    assert heavy == [], f"{job} imported {heavy[:5]} before its first line"
    assert latency < 2.0 + 2 * baseline, f"{job}: first line after {latency:.2f} s (bare start {baseline:.2f} s)"


# The job starts as a terminal's child would: SIGINT unblocked and at its default action. A child inherits its
# parent's blocked and ignored signals across exec, and Python installs its KeyboardInterrupt handler only where
# SIGINT starts at its default, so a mask left in this test process by a library would make the job deaf to
# Ctrl-C here and nowhere else. A small launcher resets both and execs the job (preexec_fn is unsafe with the
# threads Ray starts in this process).
_TERMINAL_SIGNALS = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
                     "signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def _signal_lines(pid: int) -> str:
    """The job's signal masks as the kernel holds them (blocked, ignored, caught): said when an assertion fails."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return " ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError:
        return "(gone)"


def _interrupt(cmd: list[str], marker: str, *, settle_s: float = 2.0, timeout_s: float = 600.0):
    """Run `cmd` in its own session until `marker` shows in its output, then SIGINT its process group; returns
    (exit status, stdout, stderr, the job's signal masks when SIGINT was sent)."""
    proc = subprocess.Popen([sys.executable, "-c", _TERMINAL_SIGNALS, *cmd], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    chunks = {"out": [], "err": []}

    def pump(name, stream):
        while data := os.read(stream.fileno(), 65536):
            chunks[name].append(data)

    readers = [threading.Thread(target=pump, args=(n, s), daemon=True) for n, s in
               (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()

    def text(name):
        return b"".join(chunks[name]).decode(errors="replace")

    deadline = time.monotonic() + timeout_s
    try:
        while marker not in text("out") + text("err"):
            assert proc.poll() is None, f"exited {proc.returncode} before {marker!r}: {text('err')[-3000:]}"
            assert time.monotonic() < deadline, f"no {marker!r} in {timeout_s} s: {text('err')[-3000:]}"
            time.sleep(0.2)
        time.sleep(settle_s)
        masks = _signal_lines(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit 180 s after SIGINT (job's {masks}): {text('err')[-3000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    for t in readers:
        t.join(timeout=30)
    return rc, text("out"), text("err"), masks


def _assert_one_interrupt_line(rc, out, err, masks):
    lines = [ln.strip() for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    assert rc == 130, f"exit {rc} (job's {masks}): {err[-3000:]}"
    assert "Traceback" not in err and "error:" not in err, err[-3000:]
    assert lines[-1].startswith("interrupted; "), lines[-5:]
    assert sum("interrupted" in ln for ln in lines) == 1, lines  # the one line (no phase closed as interrupted)


@pytest.mark.integration  # Ray Train on tiny models until its steps run (~1 min on 2 busy cores)
@pytest.mark.timeout(900)
def test_ctrl_c_stops_train_inner_with_one_line_and_it_resumes(tmp_path, tiny_cache):
    out = tmp_path / "inner"
    rc, stdout, err, masks = _interrupt(_cmd("train_inner", out), "step/s", settle_s=3.0)  # Ray Train is stepping
    _assert_one_interrupt_line(rc, stdout, err, masks)
    assert "rerun with --resume" in err


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_ctrl_c_stops_train_outer_with_one_line(tmp_path, tiny_cache):
    rc, stdout, err, masks = _interrupt(_cmd("train_outer", tmp_path / "outer"), "step/s", settle_s=3.0)
    _assert_one_interrupt_line(rc, stdout, err, masks)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_ctrl_c_stops_run_with_one_line(tmp_path, tiny_cache):
    rc, stdout, err, masks = _interrupt(_cmd("run", tmp_path / "run"), "starting agents", settle_s=3.0)
    _assert_one_interrupt_line(rc, stdout, err, masks)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_ctrl_c_stops_serve_with_one_line(tmp_path, tiny_cache):
    rc, stdout, err, masks = _interrupt(_cmd("serve", tmp_path / "serve"), "serving 'sequential_light'", settle_s=1.0)
    _assert_one_interrupt_line(rc, stdout, err, masks)
    assert "stopped serving" in err


def test_ctrl_c_before_the_job_starts_work_is_one_line_too(tmp_path):
    """SIGINT while the job is still checking its inputs (the first second): the same line and status."""
    rc, stdout, err, masks = _interrupt(_cmd("push_links", tmp_path / "missing"), "checking inputs", settle_s=0.0,
                                        timeout_s=120)
    assert rc in (130, 2), err  # 2: the (missing) folder was refused before the signal arrived
    if rc == 130:
        _assert_one_interrupt_line(rc, stdout, err, masks)


def test_phase_lines_go_to_stderr_and_results_to_stdout(tmp_path, capfd):
    """Off a terminal: each phase's start line at once and its final line; results on stdout; the announced first
    phase is continued by the job's console; bad input takes the open phase back (the error is the one line)."""
    from recmas_ray import console
    from recmas_ray.console import job_console

    console.announce(argv=[])
    assert capfd.readouterr().err == "checking inputs ...\n"
    with job_console(tmp_path / "logs", verbose=False, name="t") as con:
        con.start("starting agents")
        con.done("ready")
        con.line("| table |")
    out, err = capfd.readouterr()
    assert out == "| table |\n"
    assert err.splitlines()[0].startswith("checking inputs (") and err.splitlines()[1] == "starting agents ..."
    assert err.splitlines()[2].startswith("starting agents: ready (")
    console.announce(argv=[])
    capfd.readouterr()
    with pytest.raises(ValueError):
        with job_console(tmp_path / "bad" / "logs", verbose=False, name="t"):
            raise ValueError("--lr must be > 0")
    assert capfd.readouterr().err == "" and not (tmp_path / "bad").exists()  # no "checking inputs: failed"
    console.announce(argv=["--help"])  # --help and --print_config print nothing else
    assert capfd.readouterr().err == "" and console._announced is None


def test_adaptive_rounds_line_per_method():
    from recmas_ray.eval.results import adaptive_lines

    samples = [{"method": "recursive_mas", "rounds": 2}] * 6 + [{"method": "recursive_mas", "rounds": 3}] * 2 + \
        [{"method": "recursive_mas", "rounds": 1, "error": "x"}]
    assert adaptive_lines(["recursive_mas", "textmas"], 0.01, 3, samples) == [
        "adaptive rounds (recursive_mas, threshold 0.01): 6 stopped after round 2, 2 ran all 3 (mean 2.25 rounds "
        "per question)"]
    assert adaptive_lines(["recursive_mas"], None, 3, samples) == []
