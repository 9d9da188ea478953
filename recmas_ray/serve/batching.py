"""Dynamic batching of concurrent requests (asyncio, no Ray): compatible requests run as one batch.

Requests carry a key (method, R, m, decoding settings: `GenRequest.batch_key`) and a number of rows.
A batch of one key starts when it holds `max_batch_size` rows, or `batch_wait_timeout_s` after its
oldest request arrived or a running batch last finished, whichever is later; at most
`max_concurrent_batches` run at once, and while they do, arriving requests keep gathering (under load
batches grow by themselves). The wait after a batch finishes lets its clients' next requests join the
waiting ones: without it, closed-loop clients split into groups that take turns in half-full batches. A request
larger than `max_batch_size` rows runs as a batch of its own. Requests of different keys never share a
batch. Within a key, requests are served first come, first served.

Ray Serve's `@serve.batch` gathers the calls of one method whatever their arguments; here the
settings must match, so the queue is our own (one per replica).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable


@dataclass
class Job:
    """One request waiting in (or running from) the queue."""

    key: str
    rows: int
    payload: Any
    arrived: float = field(default_factory=time.monotonic)
    future: asyncio.Future | None = None


class Batcher:
    """`await batcher.submit(key, rows, payload)` -> what `run(key, jobs)` returned for that job."""

    def __init__(self, run: Callable[[str, list[Job]], Awaitable[list[Any]]], *, max_batch_size: int,
                 batch_wait_timeout_s: float, max_concurrent_batches: int):
        self.run, self.max_batch_size = run, max_batch_size
        self.wait_s, self.max_running = batch_wait_timeout_s, max_concurrent_batches
        self.pending: dict[str, list[Job]] = {}
        self.running = 0
        self.freed_at = 0.0  # when a running batch last finished
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch (the queue depth)."""
        return sum(j.rows for jobs in self.pending.values() for j in jobs)

    async def submit(self, key: str, rows: int, payload: Any) -> Any:
        if self._loop_task is None or self._loop_task.done():
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._dispatch_loop())
        job = Job(key, rows, payload, future=asyncio.get_running_loop().create_future())
        self.pending.setdefault(key, []).append(job)
        self._wake.set()
        return await job.future

    def _take(self, now: float) -> tuple[list[Job] | None, float | None]:
        """The next batch to start (oldest key first) and, if none is ready, when one will be."""
        next_due = None
        for key, jobs in sorted(self.pending.items(), key=lambda kv: kv[1][0].arrived):
            due = max(jobs[0].arrived, self.freed_at) + self.wait_s
            if sum(j.rows for j in jobs) >= self.max_batch_size or now >= due:
                batch, rows = [], 0
                while jobs and (not batch or rows + jobs[0].rows <= self.max_batch_size):
                    rows += jobs[0].rows
                    batch.append(jobs.pop(0))
                if not jobs:
                    del self.pending[key]
                return batch, None
            next_due = due if next_due is None else min(next_due, due)
        return None, next_due

    async def _dispatch_loop(self) -> None:
        while True:
            self._wake.clear()
            while self.running < self.max_running:
                batch, next_due = self._take(time.monotonic())
                if batch is None:
                    break
                self.running += 1
                asyncio.get_running_loop().create_task(self._run(batch))
            else:
                next_due = None  # at capacity: a finishing batch wakes the loop
            timeout = None if next_due is None else max(0.0, next_due - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    async def _run(self, batch: list[Job]) -> None:
        try:
            results = await self.run(batch[0].key, batch)
            for job, result in zip(batch, results):
                if not job.future.done():
                    job.future.set_result(result)
        except Exception as e:  # noqa: BLE001 - every request of the batch gets the failure
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(e)
        finally:
            self.running -= 1
            self.freed_at = time.monotonic()
            self._wake.set()
