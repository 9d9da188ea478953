"""A progress bar that counts questions as each one is done, on both backends.

A question counts once, at the first of: its row of the final decode stopped (EOS; reported by the decode's
`on_token` as it happens: called in-process, or relayed from the agent actor on Ray,
`distributed.progress`), or its result arrived (rows that used the whole budget end with their batch). So
the bar moves per question, not per batch, and its count is never ahead of the work done. Its rate is
questions over the seconds since it opened: the caller closes it right after taking the run's wall time.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Hashable, Iterable

from recmas_ray.engine.decoding import RowsStopped

log = logging.getLogger(__name__)


class QuestionProgress:
    """Counts each question once on `bar` (a tqdm bar; a disabled one makes this a no-op).

    Register each batch with `batch(key, names)` (names: one hashable per row, e.g. sample keys), pass the
    returned `on_token` to the batch's run, and call `done(names)` when results arrive. `relay` (Ray): True
    (start a relay actor, killed by `close`) or a running one (`RayReplicas.progress_relay`, left running);
    agent actors report stopped rows there under `scoped(key)`, read here by a thread until `close()`; other
    bars on the same relay have their own scopes.
    """

    def __init__(self, bar, *, relay=None, poll_s: float = 0.5):
        self.bar, self.poll_s = bar, poll_s
        self._lock = threading.Lock()
        self._counted: set = set()
        self._rows: dict[str, list] = {}
        self._closed = False
        self.scope = os.urandom(6).hex()
        """This bar's prefix of relayed batch keys: a late report of an earlier run never counts here."""
        self.relay = self._thread = None
        self._owns_relay = relay is True
        if relay and not bar.disable:
            if relay is True:
                # lazy: Ray reads env settings on import; this module loads before the console sets them
                from recmas_ray.distributed.progress import start_relay

                relay = start_relay()
            self.relay = relay
            relay.open.remote(self.scope)  # sent before any batch of this bar runs
            self._thread = threading.Thread(target=self._pump, name="question-progress", daemon=True)
            self._thread.start()

    def scoped(self, key: str) -> str:
        """The key a batch's relayed reports carry."""
        return f"{self.scope}:{key}"

    @property
    def enabled(self) -> bool:
        return not self.bar.disable

    def batch(self, key: str, names: Iterable[Hashable], *, stream: bool = True):
        """Register a batch's rows; returns the `on_token` for its final decode (None with the bar off, or
        `stream=False`: a run that takes no `on_token`, whose questions count when results arrive)."""
        if not self.enabled or not stream:
            return None
        with self._lock:
            self._rows[key] = list(names)
        if self.relay is not None:
            # lazy: Ray reads env settings on import; this module loads before the console sets them
            from recmas_ray.distributed.progress import RelayReport

            return RowsStopped(RelayReport(self.relay, self.scoped(key)))
        return RowsStopped(lambda rows: self.rows_done(key, rows))

    def rows_done(self, key: str, rows: list[int]) -> None:
        """Rows of batch `key` stopped decoding."""
        with self._lock:
            names = self._rows.get(key, [])
            self._count([names[b] for b in rows if b < len(names)])

    def done(self, names: Iterable[Hashable]) -> None:
        """Results arrived for these questions (those not counted yet count now)."""
        with self._lock:
            self._count(names)

    def _count(self, names) -> None:
        new = {n for n in names if n not in self._counted}
        if new and not self._closed:
            self._counted |= new
            self.bar.update(len(new))

    def _pump(self) -> None:
        import ray  # lazy: Ray reads env settings on import; this module loads before the console sets them

        while not self._closed:
            try:
                reports = ray.get(self.relay.take.remote(self.scope, self.poll_s), timeout=self.poll_s + 30)
            except Exception as e:  # noqa: BLE001 - the relay is gone (closed, or Ray shut down): stop counting
                if not self._closed:
                    log.debug("progress relay stopped: %s", e)
                return
            for key, rows in reports:
                self.rows_done(key.partition(":")[2], rows)

    def close(self) -> None:
        """Close the bar (its rate is read now), then stop the relay; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.bar.close()
        if self.relay is not None:
            import ray  # lazy: Ray reads env settings on import; this module loads before the console sets them

            try:
                if self._owns_relay:
                    ray.kill(self.relay)
                else:
                    self.relay.close.remote(self.scope)
            except Exception:  # noqa: BLE001 - already gone with its cluster
                pass
