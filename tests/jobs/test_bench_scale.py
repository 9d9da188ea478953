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
from jobs.bench.scale_setup import start_cluster
cluster = start_cluster(SimpleNamespace(address=None, nodes=1, cpus_per_node=1, gpus_per_node=1, object_store_mib=128))
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


@pytest.mark.timeout(300)
def test_the_ray_call_figure_reads_every_message_on_its_receiver(ray_cluster):
    """Before, the receiving agents never touched the message (a mapped buffer), so the figure left out reading
    what the transport delivered; now each call reads the whole message it was handed, and the figure says so."""
    from types import SimpleNamespace

    from jobs.bench.scale_costs import ray_call_cost
    from recmas_ray.config.placement import PlacementConfig
    from recmas_ray.distributed.launch import start_agents
    from recmas_ray.system.plan import simulated_plan

    plan = simulated_plan("sequential_light", "sim:hidden=2048,step_ms=0,token_ms=0,tokens=1")
    agents = start_agents(plan, backend="ray", timeout_s=120,
                          placement=PlacementConfig(preset="cpu", cpus_per_agent=0.05, agent_max_restarts=0))
    try:
        row = ray_call_cost(agents.systems[0].handles, SimpleNamespace(batch_size=2, timeout_s=120, call_chain=4),
                            32 * 2**10, "fp32")
    finally:
        agents.shutdown()
    assert row["message_bytes"] == 32 * 2**10 and row["bytes_read_per_call"] == row["message_bytes"]
