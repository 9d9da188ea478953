"""What attaching to a running local Ray cluster saves over a job's private start-up: `init_ray()` in fresh
processes, alternately starting a private cluster (the jobs' default) and joining one that `ray start --head` runs
on this machine (what `RAY_ADDRESS=auto` does in every job), with the wall and CPU seconds of each and the CPU
seconds of the private cluster's processes by title (what makes its start slow).

    python -m jobs.bench.ray_attach                     # 3 of each, interleaved
    python -m jobs.bench.ray_attach --repeats 5 --output_path out/bench_ray_attach

The head this script starts (`ray start --head --block` on 127.0.0.1, a free port, a temporary folder of its own)
is the only cluster it joins (by address, never via Ray's shared address file) and is stopped at the end by its
process group. Prints one JSON object (medians and their ratio) and writes it to <output_path>/bench_ray_attach.json.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

from recmas_ray.config.checks import Range
from recmas_ray.config.cli import run_job

HERE = Path(__file__).resolve().parents[2]


@dataclass(kw_only=True)
class RayAttachBenchConfig:
    """How many start-ups of each kind are measured."""

    repeats: Annotated[int, Range(1, 20)] = 3
    """Private start-ups and attachments measured (alternating)."""
    timeout_s: Annotated[float, Range(10, 3600)] = 300.0
    """Longest wait for one start-up (and for the head to come up)."""
    output_path: str = "out/bench_ray_attach"
    """Folder of bench_ray_attach.json."""


CHILD = """
import json, os, sys, time
t0 = time.perf_counter()
from recmas_ray.distributed.cluster import init_ray
from jobs.bench.start import tree_cpu
import ray
t1 = time.perf_counter()
init_ray(sys.argv[1] if len(sys.argv) > 1 else None)
t2 = time.perf_counter()
time.sleep(2.0)  # the private cluster's daemons finish starting: their CPU is counted
cpu, by = tree_cpu()
print("RESULT " + json.dumps({"import_s": round(t1 - t0, 2), "init_s": round(t2 - t1, 2), "cpu_s": round(cpu, 2),
                              "cpu_by_process": {k: round(v, 2) for k, v in sorted(by.items())}}))
ray.shutdown()
"""


def _env() -> dict:
    """This environment without a cluster address, this checkout first on the import path, and Ray's multi-node
    mode off, so the head and the drivers keep 127.0.0.1 (as `init_local_ray` does for a private cluster)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return env


def _child(address: str | None, timeout_s: float) -> dict:
    env = _env()
    if address:  # joining by address: the driver sends this user's token only in token mode (Ray sets it for "auto")
        env.setdefault("RAY_AUTH_MODE", "token")
    done = subprocess.run([sys.executable, "-c", CHILD, *([address] if address else [])], capture_output=True,
                          text=True, timeout=timeout_s, env=env, cwd=HERE)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"init_ray({address}) failed (exit {done.returncode}): {done.stderr[-1500:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _start_head(timeout_s: float) -> tuple[subprocess.Popen, str]:
    """`ray start --head --block` on 127.0.0.1 in its own session; returns (process, address) once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="rb-")  # short: Ray's socket paths are limited to 108 bytes
    ray_bin = Path(sys.executable).with_name("ray")
    env = _env()
    proc = subprocess.Popen([str(ray_bin), "start", "--head", "--block", f"--port={port}",
                             "--node-ip-address=127.0.0.1", "--num-cpus=8", "--include-dashboard=false",
                             f"--temp-dir={temp}", "--disable-usage-stats"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    address, deadline = f"127.0.0.1:{port}", time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"ray start --head did not come up on {address}")
            time.sleep(0.5)
    time.sleep(3.0)  # the raylet registers after the GCS answers
    return proc, address


def bench(cfg: RayAttachBenchConfig) -> dict:
    head, address = _start_head(cfg.timeout_s)
    private, attach = [], []
    try:
        for _ in range(cfg.repeats):
            private.append(_child(None, cfg.timeout_s))
            attach.append(_child(address, cfg.timeout_s))
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # only the head this script started, and what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
    med = {name: {k: statistics.median(r[k] for r in rows) for k in ("init_s", "cpu_s")}
           for name, rows in (("private", private), ("attach", attach))}
    return {"config": asdict(cfg), "load_average": os.getloadavg(), "cores": os.cpu_count(),
            "median": med, "ratio_init_private_over_attach": round(med["private"]["init_s"]
                                                                  / max(med["attach"]["init_s"], 1e-3), 2),
            "private": private, "attach": attach}


def main_cfg(cfg: RayAttachBenchConfig) -> int:
    out = bench(cfg)
    Path(cfg.output_path).mkdir(parents=True, exist_ok=True)
    (Path(cfg.output_path) / "bench_ray_attach.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("median", "ratio_init_private_over_attach", "load_average")}, indent=2))
    return 0


def main(argv=None) -> int:
    return run_job(main_cfg, RayAttachBenchConfig, argv, prog="python -m jobs.bench.ray_attach", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
