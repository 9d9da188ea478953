"""`ray job submit` end to end: a private head on loopback, jobs/run.py on the tiny preset, results checked.

The head is started by this test with `ray start --head --block` in its own session and with a
marker variable in its environment; teardown kills exactly the processes that carry the marker
(head services, workers, the job driver), never a blanket `ray stop`, so the session cluster of
the same pytest run and any other Ray process on the host are left alone. Nothing here calls
`ray.init`: the job joins the head through RAY_ADDRESS, set by Ray's job supervisor.
"""

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
MARKER = "RECMAS_TEST_HEAD"


def free_ports(n: int) -> list[int]:
    """n distinct free ports (all sockets stay open until every port is chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def marked_pids(marker_value: str) -> list[int]:
    """Processes whose environment carries this head's marker (inherited by every Ray child)."""
    needle = f"{MARKER}={marker_value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone or not ours
            pass
    return pids


def kill_marked(head: subprocess.Popen, marker_value: str) -> list[int]:
    """SIGKILL the head's process group and every marked process; return what was still alive after."""
    try:
        os.killpg(head.pid, signal.SIGKILL)  # SIGTERM would make the node drain for up to 30 s
    except ProcessLookupError:
        pass
    for _ in range(3):
        for pid in marked_pids(marker_value):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    head.wait(timeout=30)
    return [p for p in marked_pids(marker_value) if Path(f"/proc/{p}/status").exists()
            and "State:\tZ" not in Path(f"/proc/{p}/status").read_text()]


@pytest.fixture
def private_head(tiny_cache):
    """A Ray head on 127.0.0.1 with its own ports and temp dir (short path: AF_UNIX limit)."""
    tmp = tempfile.mkdtemp(prefix="rj", dir="/tmp")
    names = ("port", "dashboard-port", "ray-client-server-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")
    ports = dict(zip(names, free_ports(len(names))))
    # The job must find the package through the uploaded working dir, not through this checkout.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env.update({MARKER: tmp, "RAY_TMPDIR": tmp, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                "RECMAS_CACHE": str(tiny_cache), "OMP_NUM_THREADS": "1"})
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           "--num-cpus=4", "--num-gpus=0", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           f"--temp-dir={tmp}", f"--object-store-memory={200 * 2**20}", "--disable-usage-stats",
           *[f"--{name}={port}" for name, port in ports.items()]]
    log = open(os.path.join(tmp, "head.log"), "w")
    head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{address}/api/version", timeout=2).read()
                break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"head did not come up: {Path(tmp, 'head.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield {"address": address, "tmp": tmp, "env": env}
    finally:
        left = kill_marked(head, tmp)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"processes of the test head survived teardown: {left}"


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_ray_job_submit_runs_jobs_run_py(private_head, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(2, 3), (10, 7), (4, 4), (21, 5)]]
    qfile = write_jsonl(tmp_path / "questions.jsonl", rows)
    out_dir = tmp_path / "out"
    sub_id = f"recmas-test-{os.getpid()}-{int(time.time())}"
    client_env = {k: v for k, v in private_head["env"].items() if k != "RAY_TMPDIR"}
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", private_head["address"],
           "--submission-id", sub_id, "--working-dir", str(ROOT), "--runtime-env", "cluster/runtime_env.yaml",
           "--", "python", "jobs/run.py", "--style", "sequential_light", "--preset", "tiny",
           "--dataset", str(qfile), "--backend", "ray", "--placement", "cpu", "--num_recursive_rounds", "2",
           "--latent_steps", "4", "--max_new_tokens", "8", "--batch_size", "2", "--timeout_s", "120",
           "--no_progress", "--output_path", str(out_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=client_env, capture_output=True, text=True, timeout=240)
    seconds = time.perf_counter() - t0
    client = JobSubmissionClient(private_head["address"])
    status = client.get_job_status(sub_id)
    logs = client.get_job_logs(sub_id)
    assert status == JobStatus.SUCCEEDED, f"job {status} (rc {proc.returncode}):\n{logs[-3000:]}\n{proc.stderr[-2000:]}"
    assert proc.returncode == 0
    info = client.get_job_info(sub_id)
    assert info.runtime_env["env_vars"]["HF_HUB_OFFLINE"] == "1"  # cluster/runtime_env.yaml reached the job
    assert info.runtime_env["working_dir"].startswith(("gcs://", "file://"))  # uploaded, not a local path

    samples = glob.glob(str(out_dir / "samples_questions_*.jsonl"))
    results = glob.glob(str(out_dir / "results_*.json"))
    assert len(samples) == 1 and len(results) == 1, (os.listdir(out_dir), logs[-2000:])
    recs = [json.loads(line) for line in Path(samples[0]).read_text().splitlines()]
    assert sorted(r["question"] for r in recs) == sorted(r["question"] for r in rows)
    assert all(r["method"] == "recursive_mas" and isinstance(r["prediction"], str) for r in recs)
    # sequential_light, R = 2, m = 4: planner and critic roll out every round, solver in round 1
    assert all(r["latent_steps"] == 5 * 4 for r in recs), [r["latent_steps"] for r in recs]
    payload = json.loads(Path(results[0]).read_text())
    assert payload["config"]["backend"] == "ray" and payload["config"]["placement"]["preset"] == "cpu"
    assert list(payload["results"]) == ["questions/recursive_mas"]
    print(f"job submit to SUCCEEDED: {seconds:.1f}s")
