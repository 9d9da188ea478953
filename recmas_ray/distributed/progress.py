"""Per-question progress from agent actors: the final decode's rows report when they stop, as they stop.

    agent actor, final decode: on_token = RowsStopped(RelayReport(relay, key))   a row's id turns None
        --relay.put(key, rows), fire and forget, only at steps where rows stop-->  DoneRelay (async actor)
    caller's process: `eval.progress.QuestionProgress` thread --relay.take(timeout)--> its bar

A batch's results come back together from its orchestrator; these reports are what lets a bar move per
question on Ray, as the in-process decode's callback does locally.
"""

from __future__ import annotations

import asyncio

import ray


@ray.remote(num_cpus=0)
class DoneRelay:
    """Queues of (batch key, stopped rows) reports, one per open scope (a progress bar); a key is
    "SCOPE:BATCH". `take` waits without blocking `put` (async actor); reports of a scope not open are dropped."""

    def __init__(self):
        self.queues: dict[str, asyncio.Queue] = {}

    async def open(self, scope: str) -> None:
        self.queues.setdefault(scope, asyncio.Queue())

    async def close(self, scope: str) -> None:
        self.queues.pop(scope, None)

    async def put(self, key: str, rows: list[int]) -> None:
        queue = self.queues.get(key.partition(":")[0])
        if queue is not None:
            queue.put_nowait((key, rows))

    async def take(self, scope: str, timeout_s: float) -> list[tuple[str, list[int]]]:
        """Every report of `scope` queued, waiting up to `timeout_s` for the first one."""
        queue = self.queues.get(scope)
        if queue is None:
            return []
        try:
            reports = [await asyncio.wait_for(queue.get(), timeout_s)]
        except asyncio.TimeoutError:
            return []
        while not queue.empty():  # their order does not matter: each names its rows
            reports.append(queue.get_nowait())
        return reports


class RelayReport:
    """`RowsStopped`'s report from an agent actor: sends the rows to the relay under the batch's key."""

    def __init__(self, relay, key: str):
        self.relay, self.key = relay, key

    def __call__(self, rows: list[int]) -> None:
        self.relay.put.remote(self.key, rows)


def start_relay():
    """A fresh relay actor (no CPU reserved: it only moves small lists)."""
    return DoneRelay.remote()
