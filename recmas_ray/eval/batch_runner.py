"""Where an evaluation's batches run: its agents in-process or on a Ray system (`BatchRunner`), and agents kept
across the evaluations of one job (`keep_agents`).

A job that evaluates several rows of one saved system (the main job's product pipeline: own latents, shuffled,
zeroed, the single agent, TextMAS, the text relay ...) would otherwise start and load the same agents once per
`jobs.run`. Inside `with keep_agents():` the agents an evaluation starts stay up when it ends, and a later
evaluation in the same process whose agents would be identical (the plan's manifest, agent specs and link
weights, and every start-up setting) runs on them; the block shuts them all down. Each evaluation is still its
whole job (its questions, samples file, fingerprint and results): only the start-up is shared, so a row run
alone (`python -m jobs.run ...`) gives the same predictions (tests/eval/test_keep_agents.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.console import current
from recmas_ray.distributed.launch import start_agents
from recmas_ray.engine.pool import LocalPool
from recmas_ray.engine.runner import run_batch
from recmas_ray.eval import stream
from recmas_ray.eval.config import EvalConfig
from recmas_ray.eval.fingerprint import link_hashes
from recmas_ray.eval.progress import QuestionProgress
from recmas_ray.eval.samples import sample_key
from recmas_ray.eval.stream import (for_rollout, planned_client_cpus, planned_depth, solve_and_grade, stream_samples,
                                    with_batch_retries)

log = logging.getLogger(__name__)


def recursion_for(cfg: EvalConfig, method: str, rollout: int) -> RecursionConfig:
    """The run's recursion settings for one method and rollout (decode seed = seed + rollout)."""
    rc = dataclasses.replace(cfg.recursion, method=method,
                             decode=dataclasses.replace(cfg.recursion.decode, seed=cfg.system.seed))
    return for_rollout(rc, rollout)


def memory_args(cfg: EvalConfig, plan) -> dict:
    """The memory plan's load of this run: its batch size, and the batches an agent may take at once."""
    num_actors = len(plan.style.roles) + sum(n - 1 for n in cfg.placement.role_replicas.values())
    return {"recursion": cfg.recursion, "batch_size": cfg.batch_size,
            "calls_at_once": planned_depth(cfg.stream, num_actors)}


class BatchRunner:
    """Runs batches in-process or on a Ray system; `stream` yields graded sample records."""

    def __init__(self, cfg: EvalConfig, plan, system=None):
        self.cfg, self.plan, self.owned = cfg, plan, system is None
        self.system = self.pool = None
        if isinstance(system, LocalPool):  # the in-process agents of a Python API System: reused
            if cfg.backend != "local" or {r: s.spec for r, s in system.services.items()} != plan.specs \
                    or cfg.outer_init != "trained":  # (their links are those they were built with)
                raise ValueError(f"the given local agents do not match this run's {plan.manifest()} "
                                 f"(backend {cfg.backend}, outer_init {cfg.outer_init})")
            self.pool = system
        elif system is not None:  # a running system of the same plan (sweeps, tests): reused, not shut down
            if cfg.backend != "ray" or system.plan.manifest() != plan.manifest() or system.plan.specs != plan.specs:
                raise ValueError(f"the given Ray system runs {system.plan.manifest()}, which does not match "
                                 f"this run's {plan.manifest()} (backend {cfg.backend})")
            self.system = system
        else:
            # agent actors of one replica: every role, plus the extra copies named (auto copies come later)
            num_actors = len(plan.style.roles) + sum(n - 1 for n in cfg.placement.role_replicas.values())
            if cfg.backend == "ray":
                # lazy: Ray reads env settings on import; this module loads before the console sets them
                from recmas_ray.distributed.cluster import start_ray

                start_ray()  # a phase of its own on a job's console; retried where a busy machine timed it out
            if cfg.backend == "ray" and cfg.placement.wants_gpus():  # a plan that cannot fit stops before loading
                # lazy: Ray reads env settings on import; this module loads before the console sets them
                from recmas_ray.distributed.memory import check_memory

                check_memory(plan, cfg.placement, **memory_args(cfg, plan))
            settings = dict(backend=cfg.backend, placement=cfg.placement, timeout_s=cfg.timeout_s,
                            torch_threads=cfg.torch_threads, transport=cfg.transport,
                            client_cpus=planned_client_cpus(cfg.stream, num_actors),
                            recursion=_agent_recursion(cfg.recursion),
                            max_batches=planned_depth(cfg.stream, num_actors), progress_relay=cfg.progress)
            console = current()  # one object for the phase's start and end (a Python caller's is made per call)
            agents = _KEPT.find(plan, settings)
            if agents is not None:
                self.owned = False  # the keep_agents block shuts it down
                console.line("agents: the running ones of an earlier evaluation in this job (same models, links, "
                             "prompts and settings)")
            else:
                console.start(f"starting agents ({'Ray actors' if cfg.backend == 'ray' else 'in-process'}): "
                              + ", ".join(f"{r}={m}" for r, m in plan.role_models.items()))
                try:
                    agents = start_agents(plan, **settings)
                except BaseException as e:
                    console.finish_open(e)
                    raise
                if _KEPT.add(plan, settings, agents):
                    self.owned = False
                console.done("ready")
            self.pool, self.system = (agents, None) if cfg.backend == "local" else (None, agents)

    def stream(self, batches, method, counter: QuestionProgress | None = None):
        """Yield graded sample records as batches finish (Ray: several in flight, arrival order); `counter`
        is told each batch's questions and gets their final decode's stopped rows as they stop."""
        cfg, decoder = self.cfg, self.plan.style.decoder
        sinks = {}
        for batch, rollout in batches:
            key = stream.batch_key(method, rollout, batch)
            names = [sample_key({"method": method, "doc_id": i["doc_id"], "rollout": rollout}) for i in batch]
            streams = cfg.recursion.adaptive_threshold is None  # adaptive rounds take no on_token
            sinks[key] = counter.batch(key, names, stream=streams) if counter is not None else None
        if self.system is not None:
            relayed = (counter.relay, counter.scope) if counter is not None and counter.relay is not None else None
            yield from stream_samples(self.system, batches, method, recursion_for(cfg, method, 0), cfg.grader,
                                      cfg.format_retry, cfg.stream, timeout_s=cfg.timeout_s,
                                      max_batch_retries=cfg.max_batch_retries, progress=relayed)
            return

        def solve(qs, ts, rc, on_token=None):
            return run_batch(self.pool, self.plan.style, qs, ts, rc,
                             **({} if on_token is None else {"on_token": on_token}))

        def retry(texts, suffixes, n, decode, context=None):
            return self.pool.get(self.pool.retry_format(decoder, texts, suffixes, n, cfg=decode, context=context),
                                 what="format retry")

        rc, fail_docs = recursion_for(cfg, method, 0), stream.FAULTS.fail_docs
        for batch, rollout in batches:
            on_token = sinks[stream.batch_key(method, rollout, batch)]

            def attempt(batch=batch, rollout=rollout, on_token=on_token):
                return solve_and_grade(batch, rollout, method, rc, cfg.grader,
                                       lambda qs, ts, rc: solve(qs, ts, rc, on_token),
                                       retry if cfg.format_retry else None), 0

            yield from with_batch_retries(batch, rollout, method, rc, cfg.max_batch_retries, attempt,
                                          fail_docs=fail_docs,
                                          on_error=lambda n, e: log.warning("batch failed (attempt %d): %s", n + 1, e))

    def progress_relay(self):
        """Where the agents report stopped rows: the replicas' relay, True (a bar's own) on a bare Ray system,
        None in-process (the decode's callback is called here)."""
        if self.system is None:
            return None
        return getattr(self.system, "progress_relay", None) or True

    def close(self):
        if self.system is not None and self.owned:
            self.system.shutdown()
        elif self.pool is not None and self.owned:
            self.pool.shutdown()


def _agent_recursion(rc: RecursionConfig) -> RecursionConfig:
    """The part of the recursion settings the agents are started with (R, m and the decode budget size their
    copies, `distributed.role_copies`): a method or a latent ablation is given per call, so evaluations that
    differ only there share agents."""
    return dataclasses.replace(rc, method=RecursionConfig.method, latent_ablation=RecursionConfig.latent_ablation)


class _KeptAgents:
    """The agents `keep_agents` holds: (identity of the plan, start-up settings, agents) per started system, the
    latest last."""

    def __init__(self):
        self.entries: list[tuple[tuple, dict, object]] | None = None  # None: no keep_agents block is open
        self.max_systems = 1

    @staticmethod
    def identity(plan) -> tuple:
        return plan.manifest(), plan.specs, link_hashes(plan)

    def find(self, plan, settings: dict):
        if self.entries is None:
            return None
        identity = self.identity(plan)
        return next((agents for i, s, agents in self.entries if i == identity and s == settings), None)

    def add(self, plan, settings: dict, agents) -> bool:
        """Keep `agents` (True) when a keep_agents block is open; beyond its `max_systems`, the oldest kept agents
        are shut down (their models' memory is free before the next system's load, not at the block's end)."""
        if self.entries is None:
            return False
        self.entries.append((self.identity(plan), settings, agents))
        while len(self.entries) > self.max_systems:
            self.entries.pop(0)[2].shutdown()
        return True


_KEPT = _KeptAgents()


@contextlib.contextmanager
def keep_agents(max_systems: int = 1):
    """Evaluations inside the block share the agents they would start identically; at most `max_systems` systems
    stay up at once (a job that runs the rows of one system together needs 1), and all are shut down at the
    block's end (also on an error). Not re-entrant: an inner block would end the outer one's agents."""
    if _KEPT.entries is not None:
        raise RuntimeError("keep_agents() is already open in this process")
    if max_systems < 1:
        raise ValueError(f"keep_agents(max_systems={max_systems}): expected at least 1")
    _KEPT.entries, _KEPT.max_systems = [], max_systems
    try:
        yield
    finally:
        entries, _KEPT.entries = _KEPT.entries, None
        for _, _, agents in entries:
            agents.shutdown()


__all__ = ["BatchRunner", "keep_agents", "memory_args", "recursion_for"]
