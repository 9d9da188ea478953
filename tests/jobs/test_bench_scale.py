"""jobs/bench/scale.py: a dead --address fails at once in one line; the simulated cluster stays on 127.0.0.1."""

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


def test_steady_rate_is_the_true_rate_however_completions_bunch():
    """Six whole systems, 2 batches in flight each, finish in bunches of six every 8 s: the steady-state
    rate is 6 / 8 per s wherever the window's edges fall (a count of whole completions jumps by six as an edge
    crosses a bunch)."""
    from jobs.bench.scale import steady_window

    # 6 replicas x 12 batches; batch i of a replica enters when batch i - 2 finishes (0 and 1 at once)
    decodes = [(8.0 * i + 0.5, 8.0 * i + 8.5) for i in range(12) for _ in range(6)]
    entries = [0.0 if i < 2 else 8.0 * (i - 2) + 8.5 for i in range(12) for _ in range(6)]
    t_a, t_b, done = steady_window(decodes, entries)
    assert (t_a, t_b) == (16.5, 80.5)  # the 12th end (the burst's last batch) to the last entry
    assert abs(done / (t_b - t_a) - 6 / 8) < 1e-9
    # the same with the replicas out of step by 1 s each (a pool's copies)
    decodes = [(8.0 * i + 0.5 + r, 8.0 * i + 8.5 + r) for i in range(12) for r in range(6)]
    entries = [(0.0 if i < 2 else 8.0 * (i - 2) + 8.5) + r for i in range(12) for r in range(6)]
    t_a, t_b, done = steady_window(decodes, entries)
    assert (t_a, t_b) == (21.5, 85.5) and abs(done / (t_b - t_a) - 6 / 8) < 1e-9


def test_without_a_steady_state_the_whole_run_counts():
    from jobs.bench.scale import steady_window

    decodes = [(0.0, 8.0), (0.0, 8.0)]  # both batches entered at once: no window
    assert steady_window(decodes, [0.0, 0.0]) == (0.0, 8.0, 2.0)
