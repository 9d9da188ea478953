"""Tokens from the final agent's decode loop to the replica, as they are decoded, in step order.

The engine calls `on_token(ids)` once per decoding step (`Agent.decode`). In-process (backend local)
the replica's callback is called directly. On Ray the final agent runs in its own actor, so the
callback there is a `RelaySink`: a picklable object that sends each step to the replica's `TokenRelay`
actor (fire and forget: decoding never waits for it); the replica awaits `TokenRelay.take` for its batch.

The relay is an async actor, and Ray does not promise that an async actor runs one submitter's calls in
the order they were sent (it does only for synchronous single-threaded actors: Ray docs, "Actor Task
Execution Order"). So each put carries its step number and the relay hands out only the steps that follow,
without a gap, the last one taken; a step that arrives early is held until the ones before it are in.
"""

from __future__ import annotations

import asyncio

import ray


class _Steps:
    """One batch's steps: those arrived but not yet taken, and the step the next take must start with."""

    def __init__(self):
        self.held: dict[int, list] = {}
        self.next_step = 0
        self.ready = asyncio.Event()  # set while `next_step` is held

    def put(self, step: int, ids: list) -> None:
        if step >= self.next_step:  # a step already taken (a resent one) is dropped
            self.held[step] = ids
            if step == self.next_step:
                self.ready.set()

    def take_run(self) -> list:
        """The held steps from `next_step` on, up to the first gap."""
        out = []
        while self.next_step in self.held:
            out.append((self.next_step, self.held.pop(self.next_step)))
            self.next_step += 1
        self.ready.clear()
        return out

    def take_all(self) -> list:
        """Every held step in step order, gaps skipped (the batch is over: no earlier step will come)."""
        out = sorted(self.held.items())
        self.held.clear()
        self.ready.clear()
        if out:
            self.next_step = out[-1][0] + 1
        return out


@ray.remote(num_cpus=0)
class TokenRelay:
    """Per-batch steps of decoding, handed out in step order (async actor: `take` waits without blocking
    `put`)."""

    def __init__(self):
        self.batches: dict[str, _Steps] = {}
        self.closed: set[str] = set()

    def _steps(self, key: str) -> _Steps:
        return self.batches.setdefault(key, _Steps())

    async def put(self, key: str, step: int, ids: list) -> None:
        if key not in self.closed:
            self._steps(key).put(step, ids)

    async def take(self, key: str, timeout_s: float, *, flush: bool = False) -> list:
        """(step, ids) of the steps that follow the last one taken, in order, waiting up to `timeout_s` for the
        first ([] when it did not come). `flush` (the batch has finished and the relay stayed quiet): every
        step still held, in order, even past a gap."""
        steps = self._steps(key)
        if flush:
            return steps.take_all()
        try:
            await asyncio.wait_for(steps.ready.wait(), timeout_s)
        except asyncio.TimeoutError:
            return []
        return steps.take_run()

    async def close(self, key: str) -> None:
        self.batches.pop(key, None)
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
