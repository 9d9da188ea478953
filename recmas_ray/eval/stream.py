"""Per-batch evaluation work shared by both backends, and the Ray Data stream of the Ray backend.

    driver: pending question batches -> ray.data.from_items (one row, one block per batch)
      -> map_batches(EvalClient, compute=ActorPoolStrategy(size=ceil(depth * replicas / b),
                                   max_concurrent_calls_per_actor=b), num_cpus=0.25, num_gpus=0,
                     batch_size=1)           (depth batches in flight per replica, b per client process)
           client: replica, lease = router.acquire(work)   (the replica with the least queued work)
                   ray.get(orchestrators[replica].solve.remote(...)) -> answer-format retry (routed by
                   the orchestrator like every step) -> grade; a timed-out batch is cancelled there
                   router.release(lease); a failed batch is retried (`max_batch_retries`), then
                   written as error records (field `error`) so the run goes on
      -> iter_batches(): the driver appends each graded sample to the samples file as it arrives

Rows are whole question batches, not single questions: Ray Data bundles small blocks into bigger
batches, which would change which questions share a batch (so the padding and, rarely, a greedy
token). Keeping the driver's batches gives the same predictions as the local backend.

Clients ask for no GPUs (the agents hold them) and a fraction of a CPU (Ray Data needs free CPUs
for its own tasks). A killed client is restarted by Ray Data and its batch rerun (no limit by
default, see `client_max_restarts`); when restarts are off or used up the run fails and
`--resume` completes it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
import warnings
from typing import Callable, Iterator

from recmas_ray.config.extensions import extension_modules, import_extensions
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.distributed.routing import LeaseKeeper, batch_work
from recmas_ray.eval.config import StreamConfig
from recmas_ray.engine.runner import SampleResult
from recmas_ray.tasks import get_task, grade



@dataclasses.dataclass(frozen=True)
class Faults:
    """Failures a test injects into a run (the fixture `inject_faults` sets `FAULTS`); none in a real run."""

    fail_docs: dict[str, int] = dataclasses.field(default_factory=dict)
    """doc_id -> how many attempts of the batch holding it fail (a huge number: every one)."""
    client_exit_after: int | None = None
    """A Ray Data client process exits hard before its (N+1)-th batch, once (not after a restart)."""


FAULTS = Faults()
"""The faults of the runs this process starts (read when a run starts; the clients get them as arguments)."""

RetryFn = Callable[..., list]
"""(texts, suffixes, max_new_tokens, decode cfg, context) -> list[Decoded] of the continuations; `context` is
(the batch's `pool.DecoderInput`, the rows retried) or None (pass it on to the pool's `retry_format`)."""


def for_rollout(rc: RecursionConfig, rollout: int) -> RecursionConfig:
    """Rollout r decodes with seed + r (pass@k samples differ, and each one repeats)."""
    return dataclasses.replace(rc, decode=dataclasses.replace(rc.decode, seed=rc.decode.seed + rollout))


def needs_format_retry(item: dict, text: str) -> bool:
    """True when `text` lacks the answer format of the item's task family (`Task.answer_found`)."""
    return not get_task(item["task_type"]).answer_found(item, text)


def format_retry(items: list[dict], results: list[SampleResult], decode, retry: RetryFn) -> list[dict | None]:
    """Retry once every sample whose output lacks the answer format; updates `results` in place.

    The decoding agent continues its own reply plus the family's suffix after the very prompt it decoded
    from, latents spliced in (`SampleResult.decoder_input`; `AgentService.retry_format`), for up to
    `Task.retry_tokens` more tokens; the prediction becomes output + suffix + continuation. A result without a
    recorded input is continued from its reply alone. Returns per sample the retry record, or None where no
    retry was needed.
    """
    infos: list[dict | None] = [None] * len(items)
    groups: dict[tuple, list[int]] = {}
    for i, (item, res) in enumerate(zip(items, results)):
        if needs_format_retry(item, res.prediction):
            key = (get_task(item["task_type"]).retry_tokens, id(res.decoder_input))
            groups.setdefault(key, []).append(i)
    if not groups:
        return infos
    for (max_new, _), idx in groups.items():
        suffixes = [get_task(items[i]["task_type"]).retry_suffix for i in idx]
        received = results[idx[0]].decoder_input
        context = None if received is None else (received, [results[i].decoder_row for i in idx])
        outs = retry([results[i].prediction for i in idx], suffixes, max_new, decode, context)
        for i, suffix, out in zip(idx, suffixes, outs):
            res, text = results[i], out.text
            closer = get_task(items[i]["task_type"]).retry_closer
            if closer and closer.strip() not in text:
                text += closer  # close what the suffix opened (code: the fence), so the answer can be extracted
            infos[i] = {"raw_prediction": res.prediction, "suffix": suffix, "continuation": out.text,
                        "tokens": out.num_tokens, "in_context": context is not None}
            res.prediction = res.prediction + suffix + text
            res.num_text_tokens += out.num_tokens
            res.trace.append({"role": "retry", "round": None, "action": "format_retry", "latent_steps": 0,
                              "text_tokens": out.num_tokens, "seconds": 0.0})
    return infos


def sample_record(item: dict, method: str, rollout: int, res: SampleResult, grader: str, rc: RecursionConfig,
                  retry: dict | None = None, replica: int = 0) -> dict:
    """One line of samples_<benchmark>_<time>.jsonl (`replica`: the system replica that ran it)."""
    g = grade(item["task_type"], item, res.prediction, mode=grader)
    rec = {"doc_id": item["doc_id"], "method": method, "rollout": rollout, "benchmark": item.get("benchmark"),
           "task": item["task_type"], "rounds": rc.num_recursive_rounds if res.num_rounds is None else res.num_rounds, "question": item["question"], "gold": item["gold"],
           "prediction": res.prediction, "extracted": g.extracted, "correct": g.correct,
           "parse_failed": g.parse_failed, "grade_detail": g.detail, "tokens": res.num_text_tokens,
           "latent_steps": res.num_latent_steps, "latency_s": res.seconds, "retry_used": retry is not None,
           "trace": res.trace, "replica": replica}
    if retry is not None:
        rec["retry"] = retry
    if item.get("split"):  # a local row's held-out split (seen / unseen values): `jobs.compare` counts per split
        rec["split"] = item["split"]
    if res.round_changes:  # adaptive rounds: the latent change at each check (rounds 2, 3, ...)
        rec["round_changes"] = res.round_changes
    return rec


def solve_and_grade(batch: list[dict], rollout: int, method: str, recursion: RecursionConfig, grader: str,
                    solve: Callable[[list[str], list[str], RecursionConfig], list[SampleResult]],
                    retry: RetryFn | None, replica: int = 0) -> list[dict]:
    """Run one batch (one rollout), apply the format retry when enabled, grade; returns sample records."""
    rc = for_rollout(recursion, rollout)
    t0 = time.perf_counter()
    results = solve([i["question"] for i in batch], [i["task_type"] for i in batch], rc)
    infos = format_retry(batch, results, rc.decode, retry) if retry else [None] * len(batch)
    latency = time.perf_counter() - t0  # each question's: from its batch's submission to its (retried) answer
    for res in results:
        res.seconds = latency
    return [sample_record(i, method, rollout, r, grader, rc, info, replica)
            for i, r, info in zip(batch, results, infos)]


def error_records(batch: list[dict], method: str, rollout: int, rc: RecursionConfig, error: str, attempts: int,
                  replica: int | None) -> list[dict]:
    """Lines for the samples of a batch that failed every attempt: `error` set, not graded.

    Results count them apart (`n_errored`); `--resume` runs them again.
    """
    return [{"doc_id": i["doc_id"], "method": method, "rollout": rollout, "benchmark": i.get("benchmark"),
             "rounds": rc.num_recursive_rounds, "question": i["question"], "gold": i["gold"], "prediction": None,
             "correct": False, "error": error[:2000], "attempts": attempts, "replica": replica} for i in batch]


def with_batch_retries(batch: list[dict], rollout: int, method: str, recursion: RecursionConfig, max_retries: int,
                       attempt: Callable[[], tuple[list[dict], int | None]], *, fail_docs: dict | None = None,
                       on_error: Callable[[int, BaseException], None] | None = None) -> list[dict]:
    """Run `attempt()` (-> records, replica) up to 1 + `max_retries` times; after the last failure
    return error records, so one bad batch never ends the run. Both backends use this."""
    last, replica = None, None
    for n in range(max_retries + 1):
        try:
            for item in batch:
                if n < (fail_docs or {}).get(str(item["doc_id"]), 0):
                    raise RuntimeError(f"injected failure of doc {item['doc_id']} (attempt {n + 1})")
            return attempt()[0]
        except Exception as e:  # noqa: BLE001 - a batch boundary: any failure is retried, then recorded
            last = e
            replica = getattr(e, "replica", replica)
            if on_error is not None:
                on_error(n, e)
    msg = f"{type(last).__name__}: {last}"
    return error_records(batch, method, rollout, for_rollout(recursion, rollout), msg, max_retries + 1, replica)


class EvalClient:
    """Ray Data UDF (one actor of the pool): question batches in, graded sample records out.

    Each batch goes to the replica the router names (the least loaded), is retried on failure
    (possibly on another replica) and, if every attempt fails, comes back as error records.
    """

    def __init__(self, replicas: list, router, method: str, recursion: RecursionConfig, grader: str,
                 format_retry: bool, timeout_s: float, max_batch_retries: int = 2, exit_after: int | None = None,
                 fail_docs: dict | None = None, style=None, progress: tuple | None = None, extensions=()):
        import ray  # lazy: ray must not load with --help or before a job's first line

        import_extensions(extensions)  # task families registered from outside the package: graded by name here

        self.replicas, self.router = replicas, router  # the orchestrator of each replica; the replica router
        self.style = style  # the plan's style: a batch's work (rows x steps) for the router
        self.method, self.recursion, self.grader = method, recursion, grader
        self.format_retry, self.timeout_s, self.max_batch_retries = format_retry, timeout_s, max_batch_retries
        self.fail_docs = fail_docs or {}
        self.progress = progress  # (relay, scope): where final decodes report stopped rows (None: nowhere)
        with warnings.catch_warnings():  # the property warns about an internal deprecated call
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.exit_after = None if restarted else exit_after
        self.calls = itertools.count(1)  # several batches run at once, on threads
        self.attempts = itertools.count(1)

        # renews the router leases of this client's running batches (a dead client's expire within LEASE_S)
        self.lease_keeper = LeaseKeeper(lambda leases: router.renew_many.remote(leases))

    def _get(self, ref, what: str):
        import ray  # lazy: ray must not load with --help or before a job's first line

        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise RuntimeError(f"{what}: no answer within {self.timeout_s:g}s") from e
        except ray.exceptions.RayTaskError as e:
            raise (e.cause if isinstance(e.cause, Exception) else e) from None

    def _attempt(self, items: list[dict], rollout: int, bid: str) -> tuple[list[dict], int]:
        import ray  # lazy: ray must not load with --help or before a job's first line

        rc = for_rollout(self.recursion, rollout)
        work = batch_work(self.style, rc, len(items)) if self.style is not None else float(len(items))
        replica, lease = self._get(self.router.acquire.remote(work), "router")
        self.lease_keeper.hold(lease)  # renewed while the batch runs: the lease outlives a slow batch, not this client
        orchestrator = self.replicas[replica]
        attempt_id = f"{bid}#{next(self.attempts)}"  # a retry never shares an id with the attempt it replaces
        try:
            def solve(qs, ts, rc):
                stream = {}
                if self.progress is not None and rc.adaptive_threshold is None:  # adaptive rounds do not stream
                    # lazy: torch must not load with --help or before a job's first line
                    from recmas_ray.engine.decoding import RowsStopped
                    # lazy: ray must not load with --help or before a job's first line
                    from recmas_ray.distributed.progress import RelayReport

                    relay, scope = self.progress
                    stream["on_token"] = RowsStopped(RelayReport(relay, f"{scope}:{bid}"))
                ref = orchestrator.solve.remote(qs, ts, rc, attempt_id, **stream)
                try:
                    return self._get(ref, f"batch {bid} (replica {replica})")
                except RuntimeError:  # timed out: stop its agent calls before the retry starts
                    orchestrator.cancel.remote(attempt_id)
                    ray.cancel(ref)
                    raise

            def retry(texts, suffixes, n, decode, context=None):
                # routed by the orchestrator like every step
                ref = orchestrator.retry_format.remote(texts, suffixes, n, cfg=decode, context=context)
                return self._get(ref, f"batch {bid} (replica {replica}, format retry)")

            return solve_and_grade(items, rollout, self.method, self.recursion, self.grader, solve,
                                   retry if self.format_retry else None, replica), replica
        except Exception as e:
            e.replica = replica
            raise
        finally:
            self.lease_keeper.drop(lease)
            self.router.release.remote(lease)

    def __call__(self, batch: dict) -> dict:
        out = []
        for batch_id, rollout, items_json in zip(batch["batch_id"], batch["rollout"], batch["items"]):
            if self.exit_after is not None and next(self.calls) > self.exit_after:
                os._exit(1)  # test hook: die like a killed process, mid-run
            bid, items, r = str(batch_id), json.loads(items_json), int(rollout)
            recs = with_batch_retries(items, r, self.method, self.recursion, self.max_batch_retries,
                                      lambda: self._attempt(items, r, bid), fail_docs=self.fail_docs)
            out += [json.dumps(rec, ensure_ascii=False, default=str) for rec in recs]
        return {"record": out}


CLIENTS_PER_ACTOR = 2
"""Auto depth: batches in flight per agent actor. Measured on simulated agents: busy 0.31 /
0.56 / 0.75 / 0.89 at 1 / 2 / 3 / 8 batches for 3 stages; about two per stage keeps each one fed
while a batch waits on its upstream step."""
STORE_SHARE = 0.25
"""Share of the object store the in-flight batches' messages may fill (the rest: Ray Data, results)."""
CLIENT_BYTES = 400 * 2**20
"""Memory of one client actor (a Python process with torch and the project imported: 250-390 MB measured
under bench_scale); auto depth keeps all client processes within `CLIENT_MEMORY_SHARE` of the cluster's
free memory."""
CLIENT_MEMORY_SHARE = 0.25


def planned_depth(cfg: StreamConfig, num_actors: int) -> int:
    """Batches in flight per replica before the system exists: `num_clients`, or auto."""
    return cfg.num_clients or CLIENTS_PER_ACTOR * max(1, num_actors)


def planned_client_cpus(cfg: StreamConfig, num_actors: int) -> float:
    """Logical CPUs one replica's client processes take (kept free when counting replicas that fit)."""
    return -(-planned_depth(cfg, num_actors) // cfg.batches_per_client) * cfg.client_cpus


def batches_in_flight(cfg: StreamConfig, num_actors: int, *, message_bytes_per_batch: int = 0,
                      store_bytes: float = 0.0, free_cpus: float = 0.0, num_replicas: int = 1,
                      free_memory_bytes: float = 0.0) -> int:
    """Batches in flight per replica: `num_clients`, or with 0 (auto) `CLIENTS_PER_ACTOR` per agent actor,
    capped so that the batches' messages fit `STORE_SHARE` of the object store and the client processes
    (`batches_per_client` batches each) fit `free_cpus` and `CLIENT_MEMORY_SHARE` of `free_memory_bytes`
    (0: no cap), at least 1. (With a process per batch and no memory cap, 8 replicas x 6 clients took
    18 GiB of a 24 GiB machine.)"""
    if cfg.num_clients:
        return cfg.num_clients
    n = planned_depth(cfg, num_actors)  # the replica's orchestrator was built with as many threads
    per_process = cfg.batches_per_client
    if message_bytes_per_batch > 0 and store_bytes > 0:
        n = min(n, int(STORE_SHARE * store_bytes / (message_bytes_per_batch * num_replicas)))
    if free_cpus > 0 and cfg.client_cpus > 0:
        n = min(n, per_process * int(free_cpus / cfg.client_cpus) // num_replicas)
    if free_memory_bytes > 0:
        n = min(n, per_process * int(CLIENT_MEMORY_SHARE * free_memory_bytes / CLIENT_BYTES) // num_replicas)
    return max(1, n)


def client_pool(total_batches: int, batches_per_client: int) -> tuple[int, int]:
    """(processes, batches each) for `total_batches` in flight: as few processes as `batches_per_client`
    allows, the batches spread evenly over them (7 at 4 each: 2 processes of 4, not 4 + 3)."""
    processes = -(-max(1, total_batches) // batches_per_client)
    return processes, -(-max(1, total_batches) // processes)


def message_bytes(plan, recursion: RecursionConfig, batch_size: int) -> int:
    """Bytes of the latent messages one batch has alive at once (every edge's latest, fp32 worst case)."""
    width = max(plan.hidden_sizes.values()) if plan.hidden_sizes else 0
    return len(plan.style.edges) * batch_size * recursion.latent_steps * width * 4


def batch_key(method: str, rollout: int, items: list[dict]) -> str:
    """A batch's name within a run (its first question's doc id), the same for every attempt of it."""
    return f"{method}/r{rollout}/{items[0]['doc_id']}"


def stream_samples(system, batches: list[tuple[list[dict], int]], method: str, recursion: RecursionConfig,
                   grader: str, format_retry: bool, cfg: StreamConfig, *, timeout_s: float,
                   max_batch_retries: int = 2, progress: tuple | None = None) -> Iterator[dict]:
    """Yield graded sample records as client actors finish their batches (arrival order).

    `system`: a RaySystem or RayReplicas; `batches_in_flight` batches per replica are kept in flight by
    client processes holding `batches_per_client` each. `progress`: (a `distributed.progress.DoneRelay`, a
    scope): each batch's final decode reports its rows there as they stop, under "scope:`batch_key`".
    """
    import ray  # lazy: ray must not load with --help or before a job's first line

    # lazy: ray / torch / transformers must not load with --help or before a job's first line
    from recmas_ray.distributed.replicas import as_replicas

    if not batches:
        return
    replicas = as_replicas(system)
    rows = [{"batch_id": batch_key(method, r, b), "rollout": r,
             "items": json.dumps(b, ensure_ascii=False, default=str)} for b, r in batches]
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the driver shows its own bar (samples, accuracy, samples/s)
    system0 = replicas.systems[0]
    num_actors = len(system0.actors()) if hasattr(system0, "actors") else len(system0.handles)
    depth = batches_in_flight(cfg, num_actors, num_replicas=replicas.num_replicas,
                              message_bytes_per_batch=message_bytes(replicas.plan, recursion,
                                                                    max(len(b) for b, _ in batches)),
                              store_bytes=ray.cluster_resources().get("object_store_memory", 0.0),
                              free_cpus=ray.available_resources().get("CPU", 0.0),
                              free_memory_bytes=ray.available_resources().get("memory", 0.0))
    depth = min(depth, min(getattr(s, "max_batches", depth) for s in replicas.systems))  # its orchestrator's threads
    processes, per_process = client_pool(min(depth * replicas.num_replicas, len(rows)), cfg.batches_per_client)
    ds = ray.data.from_items(rows, override_num_blocks=len(rows))
    # 2.60 has no named parameter for restarts: only a non-default limit goes through the generic
    # remote args (deprecated for 2.64, so the warning is silenced where we must use them).
    extra = {} if cfg.client_max_restarts == -1 else {"max_restarts": cfg.client_max_restarts}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        out = ds.map_batches(
            EvalClient, batch_size=1,
            # each process runs its batches on threads (they wait on the agents); no batch queues
            # behind a busy one in an actor while another has room
            compute=ray.data.ActorPoolStrategy(size=processes, max_concurrent_calls_per_actor=per_process,
                                               max_tasks_in_flight_per_actor=per_process,
                                               enable_true_multi_threading=per_process > 1),
            # the client's memory is declared, so Ray places clients where it is (and Ray Data does not
            # warn that a ~400 MB worker asked for none)
            num_cpus=cfg.client_cpus, num_gpus=0, memory=CLIENT_BYTES, **extra,
            fn_constructor_kwargs={"replicas": [s.orchestrator for s in replicas.systems],
                                   "style": replicas.plan.style,
                                   "router": replicas.router, "method": method,
                                   "recursion": recursion, "grader": grader, "format_retry": format_retry,
                                   "timeout_s": timeout_s, "max_batch_retries": max_batch_retries,
                                   "exit_after": FAULTS.client_exit_after, "fail_docs": FAULTS.fail_docs,
                                   "progress": progress, "extensions": extension_modules()})
    try:
        # No prefetch: iter_rows' one-block prefetch holds each output back until the next one
        # arrives, so a crash would also lose a finished batch that never reached the file.
        for block in out.iter_batches(batch_size=None, prefetch_batches=0, batch_format="numpy"):
            for record in block["record"]:
                yield json.loads(record)
    except Exception as e:  # Ray Data wraps client failures in its own exception types
        raise RuntimeError(f"evaluation stream of {method} failed ({type(e).__name__}: {str(e)[:600]}); "
                           "finished samples are saved, rerun with --resume to complete the set") from e
    finally:
        if replicas is not system:  # a router made for a single system here
            ray.kill(replicas.router)
