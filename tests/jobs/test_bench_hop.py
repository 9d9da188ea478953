"""jobs/bench/hop.py: a latent hop between nodes counts only when the receiver read the sender's bytes.

The default tier checks the pieces without Ray (the message's shape, the checksum, the check of a reply, the
figures' arithmetic); the integration test runs the benchmark at a tiny size on its own simulated 2-node cluster,
in its own process (this session may hold a Ray connection already), and reads the JSON it writes.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from jobs.bench.hop import HOP_TRANSPORTS, PAIRS, checksum, delivered, figures, message_shape
from tests.distributed.test_multinode import MARKER, _kill_marked

ROOT = Path(__file__).resolve().parents[2]


def test_message_shape_is_whole_latent_steps_of_the_size():
    assert message_shape(1, 4, 2048) == [4, 32, 2048]  # 1 MiB of float32
    assert message_shape(64, 4, 2048) == [4, 2048, 2048]
    assert message_shape(0.01, 1, 256) == [1, 10, 256]  # nearest whole step: 10 KiB of the asked 10.24


def test_checksum_reads_every_byte_and_ignores_nothing():
    x = torch.randn(2, 8, 16)
    total = checksum(x.numpy())
    assert checksum(x.clone().numpy()) == total  # the same bytes elsewhere: the same sum
    assert checksum(torch.zeros_like(x).numpy()) != total  # a buffer that was never filled
    last = x.clone()
    last.view(-1)[-1] = -last.view(-1)[-1]  # one sign bit of the last word
    assert checksum(last.numpy()) != total


def test_a_reply_counts_only_with_the_senders_checksum_shape_and_dtype():
    good = {"checksum": 7, "shape": [1, 2, 3], "dtype": "float32"}
    assert delivered(good, 7, [1, 2, 3])
    assert not delivered({**good, "checksum": 8}, 7, [1, 2, 3])
    assert not delivered({**good, "shape": [1, 3, 2]}, 7, [1, 2, 3])
    assert not delivered({**good, "dtype": "bfloat16"}, 7, [1, 2, 3])


def test_figures_give_medians_rates_and_the_ratio_within_the_run():
    def run(times, fetched=True):  # the receiver's fetch time: None where the tensor arrived with the call
        return {"times_s": times, "fetch_s": [0.0 if fetched else None] * len(times), "read_s": [0.001] * len(times),
                "received": {5}}

    measured = {"sizes": {"1MiB": [4, 32, 2048]},
                "runs": {("cross_node", "1MiB", "object_store"): run([0.2, 0.1, 0.3]),
                         ("cross_node", "1MiB", "rdt:gloo"): run([0.1, 0.05, 0.3], fetched=False)}}
    row = figures(measured)["cross_node"]["1MiB"]
    assert row["bytes"] == 2**20
    assert row["object_store"]["s_per_hop"] == 0.2 and row["object_store"]["mib_per_s"] == pytest.approx(5.0)
    assert row["rdt:gloo"]["s_per_hop"] == 0.1 and "fetch_s" not in row["rdt:gloo"]  # arrives before the call
    assert row["ratio_rdt_gloo_to_object_store"] == pytest.approx(0.5)
    assert row["ratio_median_of_repeats"] == pytest.approx(0.5)  # per repeat: 0.5, 0.5, 1.0
    assert row["rdt:gloo"]["checksums_received"] == [5] and row["object_store"]["times_s"] == [0.2, 0.1, 0.3]


@pytest.mark.multinode
@pytest.mark.integration  # a simulated 2-node Ray cluster of its own (its own process): ~30-60 s on a busy machine
@pytest.mark.timeout(600)
def test_both_transports_deliver_the_senders_bytes_across_nodes(tmp_path):
    tmp = tempfile.mkdtemp(prefix="rhp", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({MARKER: tmp, "RAY_TMPDIR": tmp, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    out = tmp_path / "out"
    repeats, warmup = 2, 1
    argv = ["--sizes_mib", "0.01", "--hidden", "256", "--batch_size", "1", "--repeats", str(repeats),
            "--warmup", str(warmup), "--timeout_s", "120", "--output_path", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "jobs.bench.hop", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        _kill_marked(proc.pid, tmp)
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"jobs.bench.hop timed out:\n{stderr[-3000:]}")
    finally:  # only what this test started: its process group and the processes carrying its marker
        _kill_marked(proc.pid, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, f"rc {proc.returncode}:\n{stderr[-3000:]}"
    report = json.loads((out / "bench_hop.json").read_text())
    assert json.loads((out / "config.json").read_text())["repeats"] == repeats  # the resolved config beside it
    assert report["errors"] == {} and report["mismatches"] == [] and report["checksums_match"] is True
    nodes = report["nodes"]
    assert nodes["cross_node"] != nodes["sender"] and nodes["same_node"] == nodes["sender"]
    (label, shape), = report["sizes"].items()
    assert shape == [1, 10, 256]
    # the sender's checksum is of the payload itself (not of an empty buffer): recomputed here from its seed
    payload = torch.randn(*shape, generator=torch.Generator().manual_seed(report["message_seeds"][label]))
    assert report["checksums_sent"][label] == checksum(payload.numpy())
    assert report["hops_verified"] == len(PAIRS) * len(HOP_TRANSPORTS) * (repeats + warmup)
    for pair in PAIRS:
        row = report["figures"][pair][label]
        for transport in HOP_TRANSPORTS:
            fig = row[transport]
            assert fig["checksums_received"] == [report["checksums_sent"][label]], (pair, transport)
            assert len(fig["times_s"]) == repeats and fig["s_per_hop"] > 0 and fig["mib_per_s"] > 0
        assert row["ratio_rdt_gloo_to_object_store"] > 0
    assert "checksums match on every receiver: True" in stdout
