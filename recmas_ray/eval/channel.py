"""What crosses a token-like link, summarised per edge from a run's samples (issue 48, item 4).

Each rollout through a token link records, per question, its message's mean top-1 softmax probability, the
residual's mean share of the output norm and the nearest-token string (`service.AgentService._channel`, over
`links.token_channel`); the runner puts them into the sample's trace (`channel`). `channel_summary` reads them
back per edge: the mean over every message of the run's `recursive_mas` samples, and the strings of the first
three questions (doc ids in sorted order, rollout 0). The results file records it as `channel` (absent when no
link is token-like, so other runs' results are unchanged); `jobs.inspect_links` prints it.
"""

from __future__ import annotations

NUM_SHOWN = 3
"""Questions whose nearest-token strings are recorded."""


def channel_summary(samples: list[dict], method: str = "recursive_mas") -> dict:
    """edge -> {"mean_top1", "mean_residual_share", "num_messages", "nearest": [{"doc_id", "round", "text"}]}
    over the samples of `method` that carry channel records ({} when none does)."""
    sums: dict[str, dict] = {}
    rows = [s for s in samples if s.get("method") == method and not s.get("error")]
    shown = sorted({str(s["doc_id"]) for s in rows if s.get("rollout", 0) == 0})[:NUM_SHOWN]
    for s in sorted(rows, key=lambda s: (str(s["doc_id"]), s.get("rollout", 0))):
        for step in s.get("trace") or []:
            for edge, c in (step.get("channel") or {}).items():
                acc = sums.setdefault(edge, {"top1": 0.0, "share": 0.0, "n": 0, "nearest": []})
                acc["top1"] += float(c["top1"])
                acc["share"] += float(c["residual_share"])
                acc["n"] += 1
                if str(s["doc_id"]) in shown and s.get("rollout", 0) == 0:
                    acc["nearest"].append({"doc_id": s["doc_id"], "round": step.get("round"), "text": c["nearest"]})
    return {e: {"mean_top1": a["top1"] / a["n"], "mean_residual_share": a["share"] / a["n"], "num_messages": a["n"],
                "nearest": a["nearest"]} for e, a in sorted(sums.items())}


def channel_record(samples: list[dict]) -> dict:
    """The results file's `channel` entry of a run (nothing when no token-like link sent a message)."""
    summary = channel_summary(samples)
    return {"channel": summary} if summary else {}


def channel_lines(summary: dict) -> list[str]:
    """Console lines of a `channel_summary`: one per edge, then its shown messages."""
    lines = []
    for edge, c in summary.items():
        lines.append(f"{edge}: mean top-1 probability {c['mean_top1']:.3f}, residual share of the output norm "
                     f"{c['mean_residual_share']:.3f} ({c['num_messages']} messages)")
        lines += [f"  question {n['doc_id']} round {n['round']}: {n['text']!r}" for n in c["nearest"]]
    return lines


__all__ = ["channel_summary", "channel_record", "channel_lines"]
