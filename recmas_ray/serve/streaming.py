"""Tokens from the final agent's decode loop to the replica, as they are decoded.

The engine calls `on_token(ids)` once per decoding step (`Agent.decode`). In-process (backend local)
the replica's callback is called directly. On Ray the final agent runs in its own actor, so the
callback there is a `RelaySink`: a picklable object that sends each step to the replica's `TokenRelay`
actor (fire and forget: decoding never waits for it); the replica awaits `TokenRelay.take` for its batch.
"""

from __future__ import annotations

import asyncio

import ray

from recmas_ray.distributed.progress import take_queued


@ray.remote(num_cpus=0)
class TokenRelay:
    """Per-batch queues of decoding steps (async actor: `take` waits without blocking `put`)."""

    def __init__(self):
        self.queues: dict[str, asyncio.Queue] = {}
        self.closed: set[str] = set()

    def _queue(self, key: str) -> asyncio.Queue:
        return self.queues.setdefault(key, asyncio.Queue())

    async def put(self, key: str, step: int, ids: list) -> None:
        if key not in self.closed:
            self._queue(key).put_nowait((step, ids))

    async def take(self, key: str, timeout_s: float) -> list:
        """Every step queued for `key`, waiting up to `timeout_s` for the first one; in step order."""
        return sorted(await take_queued(self._queue(key), timeout_s), key=lambda item: item[0])

    async def close(self, key: str) -> None:
        self.queues.pop(key, None)
        self.closed.add(key)
        if len(self.closed) > 10_000:  # late steps of old batches are all in by now
            self.closed.clear()


class RelaySink:
    """`on_token` that runs in the agent actor and forwards each step to a `TokenRelay`."""

    def __init__(self, relay, key: str):
        self.relay, self.key, self.step = relay, key, 0

    def __call__(self, ids: list) -> None:
        self.relay.put.remote(self.key, self.step, ids)
        self.step += 1
