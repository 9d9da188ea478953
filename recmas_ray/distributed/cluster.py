"""Joining or starting a Ray cluster: `init_ray` (an address, $RAY_ADDRESS, or a private local cluster),
`start_ray` (the same, retrying a local start-up that timed out), `init_local_ray` (token auth, 127.0.0.1 only), `check_reachable` (a dead address fails in seconds) and
`loopback_only` (in-process multi-node test clusters).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path

import ray
from ray._private import ray_constants

from recmas_ray import console


@contextlib.contextmanager
def loopback_only():
    """Inside: Ray nodes started in this process (`ray.cluster_utils.Cluster`, given
    `node_ip_address="127.0.0.1"`) and the driver joining them keep 127.0.0.1 instead of the machine's
    routable address (see `init_local_ray`: Ray resolves loopback away while multi-node is on)."""
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def check_reachable(address: str, *, timeout_s: float = 10.0) -> None:
    """Fail within `timeout_s` with one line when a HOST:PORT cluster address does not answer
    (`ray.init` keeps retrying a dead address for minutes); other forms (auto, ray://) pass through.
    ValueError: the address is the user's input, refused before anything runs."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ValueError(f"--address {address}: no Ray cluster answers there within {timeout_s:g}s "
                         f"({e.strerror or e}); start one (ray start --head) or pass a live address") from None


def init_ray(address: str | None = None, **kwargs) -> None:
    """Join the cluster at `address` (or $RAY_ADDRESS, Ray's own convention: `ray job submit` sets it),
    else start a private local cluster.

    Nothing else picks the cluster: Ray's address file (/tmp/ray/ray_current_cluster, under a
    world-writable folder, so any local user can plant one) is never read, unless the caller asks for
    it with address="auto" (Ray's explicit "the cluster `ray start` runs on this machine";
    `RAY_ADDRESS=auto python -m jobs.run ...` attaches every job to it and skips the private start-up: see
    docs/cluster.md, "Attaching to a running local cluster"). A job's console shows the start-up as a phase.
    """
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    if address != "local":
        where = "the Ray cluster running on this machine" if address == "auto" else f"the Ray cluster at {address}"
        kwargs = {**console.ray_starting(f"joining {where}"), **kwargs}  # a quiet job's Ray logs to its log file
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as e:
            if address != "auto":
                raise
            raise ValueError(f"RAY_ADDRESS=auto: no Ray cluster runs on this machine ({_one_line(e)}); start one "
                             "with `ray start --head`, or unset RAY_ADDRESS for a private cluster") from None
        console.ray_started(_resources())
        return
    kwargs = {**console.ray_starting("starting Ray (a private local cluster)"), **kwargs}
    # A fresh local cluster: workers inherit this environment, so a checkout that is not
    # pip-installed still imports in every actor.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    # Logical CPUs above the core count: agents, the orchestrator and Ray Data clients mostly
    # wait on each other, and Ray Data needs free CPUs for its read tasks.
    kwargs.setdefault("num_cpus", max(8, os.cpu_count() or 1))
    os.environ.pop("RAY_ADDRESS", None)
    init_local_ray(include_dashboard=False, **kwargs)
    console.ray_started(_resources())


def _resources() -> str:
    """The cluster's size in a few words (the Ray phase's result)."""
    try:
        res = ray.cluster_resources()
    except Exception:  # noqa: BLE001 - only informational
        return ""
    gpus = f", {res['GPU']:g} GPUs" if res.get("GPU") else ""
    return f"{res.get('CPU', 0):g} CPUs{gpus}, {len(ray.nodes())} node(s)"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def start_ray(address: str | None = None, **kwargs) -> None:
    """`init_ray`, retrying a local start-up that timed out (a busy machine)."""
    if ray.is_initialized():
        return
    for attempt in range(3):  # Ray waits only 30 s for its raylet: a busy machine can overrun that
        try:
            init_ray(address, **kwargs)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            if "timed out during startup" not in str(e):
                raise  # another cause (a bad address, a refused option): as init_ray raises it
            if attempt == 2:
                raise RuntimeError(f"Ray did not start: {e}") from e
            logging.getLogger(__name__).warning("Ray start-up timed out (busy machine); retrying")
            ray.shutdown()


def init_local_ray(**kwargs) -> None:
    """Start a fresh single-machine Ray cluster that keeps Ray's default token auth and listens on 127.0.0.1 only.

    Ray turns ``_node_ip_address="127.0.0.1"`` into the machine's routable address (so GCS, raylet and
    workers would listen on every interface) unless it believes multi-node clusters are off; a local
    cluster has no other node, so that belief is held just for the start-up. Auth is whatever
    RAY_AUTH_MODE says, by default token (Ray >= 2.59 for local clusters); only tests turn it off.

    The token Ray generates (~/.ray/auth_token) is written with the umask's mode (often 0644): it is
    made owner-only before and after the start (and ~/.ray is created 0700), so other local users
    cannot read it and call into the cluster.
    """
    token = Path.home() / ".ray" / "auth_token"

    def owner_only() -> None:
        try:
            token.parent.mkdir(mode=0o700, exist_ok=True)
            if token.is_file() and token.stat().st_uid == os.getuid() and token.stat().st_mode & 0o077:
                token.chmod(0o600)
        except OSError:  # a read-only home: nothing Ray could have written there either
            pass

    owner_only()
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", _node_ip_address="127.0.0.1", **kwargs)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        owner_only()
