"""Sandboxed code cannot reach the Ray cluster: no route to its ports, no view of its session dir or sockets;
and the project's own local clusters keep token auth and listen on 127.0.0.1 only."""
from __future__ import annotations

import errno
import os

import pytest

from recmas_ray.sandbox import run_python

PROBE = '''
import ctypes, os, socket
print("tmp_ray", os.path.exists("/tmp/ray"), os.path.exists(SESSION))
print("listening", sorted(int(l.split()[1].split(":")[1], 16) for l in open("/proc/net/tcp").readlines()[1:]))
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2)
    print("python connect ok")
except OSError as e:
    print("python connect refused", type(e).__name__)
libc = ctypes.CDLL(None, use_errno=True)
d = libc.dlsym
d.restype, d.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
sock = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, use_errno=True)(d(None, b"socket"))
print("native socket", sock(2, 1, 0), ctypes.get_errno())
'''


def _host_listening_ports() -> set[int]:
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.sandbox
def test_sandbox_cannot_reach_the_ray_cluster(ray_cluster) -> None:
    ray = ray_cluster
    gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
    session = ray._private.worker._global_node.get_session_dir_path()
    assert gcs_port in _host_listening_ports() and os.path.isdir(session)  # really there, on the host
    res = run_python(PROBE.replace("PORT", str(gcs_port)).replace("SESSION", repr(session)))
    assert res.exit_code == 0, res
    lines = res.stdout.splitlines()
    assert lines[0] == "tmp_ray False False"
    assert lines[1] == "listening []"  # the namespace's own loopback: nothing of the host's
    assert lines[2].startswith("python connect refused")
    assert lines[3] == f"native socket -1 {errno.EPERM}"  # past the audit hook, seccomp still says no


def test_local_clusters_keep_token_auth_and_bind_to_loopback(monkeypatch) -> None:
    import ray
    from ray._private import ray_constants

    from recmas_ray.distributed import cluster

    seen = {}

    def fake_init(**kwargs):
        seen.update(kwargs, enable_cluster=ray_constants.ENABLE_RAY_CLUSTER,
                    auth=os.environ.get("RAY_AUTH_MODE"))

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr("ray._private.utils.read_ray_address", lambda *a, **k: None)
    before = ray_constants.ENABLE_RAY_CLUSTER
    cluster.init_ray(num_cpus=1)
    assert seen["address"] == "local" and seen["_node_ip_address"] == "127.0.0.1"
    # Without this, Ray resolves 127.0.0.1 to the routable address and listens on every interface.
    assert seen["enable_cluster"] is False and ray_constants.ENABLE_RAY_CLUSTER == before
    assert seen["auth"] is None  # not forced to "disabled": Ray's default (token) applies
