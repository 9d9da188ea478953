"""A run's call logs read alike for the scaling benchmark's Ray runs and its discrete-event model: each role's
busy fraction (host time or simulated device time), the steady window of a run and its summary (throughput and
busy fractions in that window). Pure Python: the agents' call logs ({ROLE#K: [call, ...]} per replica, each call
with t0, t1, method and device_s) are all it reads.
"""

from __future__ import annotations


def busy_by_role(logs: dict, t0: float, t1: float, *, device: bool = False) -> dict:
    """Each role's busy time in [t0, t1] / (t1 - t0), averaged over its copies (call logs ROLE, ROLE#K):
    host time (the calls' spans), or with `device` their simulated device time, spread over each span."""
    wall, per = max(t1 - t0, 1e-9), {}
    for name, calls in logs.items():
        busy = 0.0
        for c in calls:
            overlap = max(0.0, min(c["t1"], t1) - max(c["t0"], t0))
            if device:
                overlap *= (c.get("device_s") or 0.0) / max(c["t1"] - c["t0"], 1e-12)
            busy += overlap
        per.setdefault(name.split("#")[0], []).append(busy / wall)
    return {role: sum(v) / len(v) for role, v in per.items()}


def steady_window(decodes: list[tuple[float, float]], entries: list[float]) -> tuple[float, float, float]:
    """(t_a, t_b, batches done in [t_a, t_b]) in the steady state, given each batch's decode (its last call)
    and each batch's first call (`entries`).

    A run starts with a burst: the D batches in flight enter at once (D: those that entered before the first
    one finished) and queue at the first roles. The window opens when the D-th batch finishes, so every
    batch still in flight entered one at a time, as finished ones made room; it closes when the last batch
    enters, after which the upstream roles run dry and the pipeline drains (or at the last decode end if
    no batch waited). It holds N - 2D completions: a run needs N > 2D batches (3D gives a window of D).
    Batches done count each decode by the share of it inside the window: whole systems started together
    finish in bunches, and counting only whole completions would make the rate depend on where a bunch
    falls at the window's edges. Without a window (N <= 2D) the whole active run is used."""
    ends = sorted(t1 for _, t1 in decodes)
    depth = sum(1 for t in entries if t < ends[0])
    t_a, t_b = ends[max(depth, 1) - 1], max(entries)
    if t_b - t_a <= 0:
        t_a, t_b = min(t0 for t0, _ in decodes), ends[-1]
    done = sum(max(0.0, min(t1, t_b) - max(t0, t_a)) / max(t1 - t0, 1e-9) for t0, t1 in decodes)
    return t_a, t_b, done


def summarize(logs: list[dict], entries: list[float]) -> dict:
    """Throughput (batches/s) and per-role busy fractions (host and device time) in the steady window of
    a run's call logs (one {ROLE#K: calls} per replica; `entries`: each batch's first call's start)."""
    calls = [c for log in logs for cs in log.values() for c in cs]
    done = [(c["t0"], c["t1"]) for c in calls if c["method"] == "decode"]
    sa, sb, n_steady = steady_window(done, entries)
    a, b = min(c["t0"] for c in calls), max(c["t1"] for c in calls)

    def role_busy(t_a, t_b, device):
        busy = [busy_by_role(log, t_a, t_b, device=device) for log in logs]
        return {r: sum(x[r] for x in busy) / len(busy) for r in busy[0]}

    host, dev = role_busy(sa, sb, False), role_busy(sa, sb, True)
    return {"throughput_batches_per_s": n_steady / (sb - sa), "steady_s": sb - sa, "steady_batches": n_steady,
            "active_s": b - a, "throughput_active_window": len(done) / (b - a),
            "busy_by_role": dev, "min_role_busy": min(dev.values()),
            "host_busy_by_role": host, "min_role_host_busy": min(host.values()),
            "device_s": sum(c.get("device_s") or 0.0 for c in calls),
            "host_s": sum(c["t1"] - c["t0"] for c in calls)}
