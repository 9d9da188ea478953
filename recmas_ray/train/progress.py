"""Per-step training progress on the driver's console, whatever happens to the workers' own output.

    rank-0 worker  --post_step(queue, "inner planner", step, total)-->  Ray Queue actor (num_cpus=0)
    driver thread  <--get_nowait_batch every 0.5 s--                   one console bar per description

A quiet job keeps every worker's output in its log file; the steps still reach the console through this
queue. Posting never blocks and never fails a step: progress is best effort.
"""

from __future__ import annotations

import threading

from ray.util.queue import Queue

POLL_S = 0.5
"""Seconds between the driver's reads of the queue."""


class StepBoard:
    """Context manager: a queue the workers post steps on (`queue`, None when off) and a thread drawing them."""

    def __init__(self, console, *, enabled: bool):
        self.console, self.enabled = console, enabled
        self.queue = None
        self._bars: dict[str, object] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "StepBoard":
        if self.enabled:
            self.queue = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
            self._thread = threading.Thread(target=self._run, name="step-board", daemon=True)
            self._thread.start()
        return self

    def _draw(self) -> None:
        n = self.queue.qsize()
        if not n:
            return
        for desc, step, total in self.queue.get_nowait_batch(n):
            bar = self._bars.get(desc)
            if bar is None:  # from the step before the first one posted (a resumed run starts past 0)
                bar = self._bars[desc] = self.console.bar(total, desc, unit="step", initial=step - 1)
            if step > bar.n:
                bar.update(step - bar.n)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._draw()
            except Exception:  # noqa: BLE001 - the queue actor went away (Ray shutting down): stop drawing
                return

    def __exit__(self, *exc) -> None:
        if self.queue is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            self._draw()  # the last steps posted before the run ended
        except Exception:  # noqa: BLE001 - best effort, as above
            pass
        for bar in self._bars.values():
            bar.close()
        self.queue.shutdown()


def post_step(queue, desc: str, step: int, total: int) -> None:
    """Tell the driver's board that `desc` reached `step` of `total` (no-op without a board)."""
    if queue is None:
        return
    try:
        queue.put_nowait((desc, step, total))
    except Exception:  # noqa: BLE001 - a full or vanished queue must not fail training
        pass
