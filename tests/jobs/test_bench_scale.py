"""jobs/bench/scale.py: a dead --address fails at once in one line; the simulated cluster stays on 127.0.0.1.
(The model, windows and accounting it reads runs with: tests/jobs/test_bench_scale_model.py.)"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_address_fails_fast_in_one_line(tmp_path, capsys):
    from jobs.bench import scale as bench_scale

    out = tmp_path / "out"
    t0 = time.perf_counter()
    rc = bench_scale.main(["--address", f"127.0.0.1:{_free_port()}", "--output_path", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--address 127.0.0.1:" in err and "no Ray cluster" in err, err
    assert time.perf_counter() - t0 < 60  # bounded (ray.init retries a dead address for minutes)
    assert not (out / "config.json").exists()  # refused before anything is written


SCRIPT = """
import json, sys
from types import SimpleNamespace
import ray
from jobs.bench.scale import start_cluster
cluster = start_cluster(SimpleNamespace(address=None, nodes=1, cpus_per_node=1, gpus_per_node=1))
try:
    print(json.dumps({"gcs": cluster.address, "driver": ray.util.get_node_ip_address(),
                      "nodes": [n["NodeManagerAddress"] for n in ray.nodes()]}))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.integration  # a Ray cluster of its own (its own process): ~40 s on a busy machine
def test_simulated_cluster_binds_to_loopback_only():
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_TMPDIR=tempfile.mkdtemp(prefix="rbs", dir="/tmp"),
               RAY_ADDRESS="")
    env.pop("RAY_ADDRESS")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["gcs"].startswith("127.0.0.1:") and seen["driver"] == "127.0.0.1"
    assert seen["nodes"] and set(seen["nodes"]) == {"127.0.0.1"}, seen
