"""The Ray Serve application: a FastAPI ingress whose replicas each drive one RecursiveMAS system.

    client (openai SDK, curl) --HTTP--> Serve proxy (127.0.0.1 unless --host) --> RecMASServer replica
        replica: System.build(...) once; per request: key + size limit -> checks -> batch queue -> body
        batch queue: compatible requests (same method, R, m, decoding) run as one batch (`batching.py`)
        backend ray:   the replica drives agent actors + an orchestrator (batches overlap across agents)
        backend local: the agents load inside the replica (one batch at a time)
        streaming: the final agent's decode loop reports every token (`streaming.py`), sent as SSE chunks

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models (these need the API key when
one is set), GET /health, GET /metrics (Prometheus). `build_app(cfg)` gives the bound application;
`app_builder(args)` is the same for a Serve config file (`cluster/serve.yaml`).
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations (Request) as objects, and the
# class is shipped by value, without this module's globals.
import asyncio
import copy
import dataclasses
import json
import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from transformers import AutoTokenizer

from recmas_ray.api import System
from recmas_ray.api_inputs import finish
from recmas_ray.config.checks import check_tree
from recmas_ray.config.tree import from_dict
from recmas_ray.models.loader import resolve_model_path
from recmas_ray.serve.batching import Batcher
from recmas_ray.serve.config import ServeConfig
from recmas_ray.serve.metrics import ServerMetrics
from recmas_ray.serve.openai_api import GenRequest, RequestError, parse_request
from recmas_ray.serve.responses import ChunkWriter, TextStream, body as response_body, usage
from recmas_ray.serve.security import (BodyTooLarge, authorized, bind_replica_grpc_to_node_address, read_body,
                                       too_large_body, unauthorized_body)
from recmas_ray.serve.streaming import RelaySink, TokenRelay
from recmas_ray.system.config import system_fields
from recmas_ray.system.plan import served_links
from recmas_ray.system.trained import trained_task

log = logging.getLogger(__name__)

RELAY_QUIET_S = 0.2
"""After a streamed batch's result: the relay is drained once it has had nothing for this long."""
RELAY_DRAIN_TIMEOUT_S = 30.0
"""Longest wait for that drain (the relay actor's first start included) before the rest goes as one chunk."""

# FastAPI's own /docs and /openapi.json would be served to anyone: the replica serves them itself, behind --api_key.
api = FastAPI(title="recmas_ray", description="OpenAI-compatible completions of a RecursiveMAS system",
              docs_url=None, redoc_url=None, openapi_url=None)


def _tokenizer(model_name: str):
    return AutoTokenizer.from_pretrained(resolve_model_path(model_name))


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "server_error" if status >= 500 else
                                   "invalid_request_error", "param": None, "code": None}}, status_code=status)


@dataclass
class _Work:
    """A request in the batch queue; `on_rows(ids)` gets its rows' token ids per decoding step (streaming)."""

    req: GenRequest
    on_rows: object = None


# Serve serializes the class when it is decorated: everything it uses must be defined above it.
@serve.deployment
@serve.ingress(api)
class RecMASServer:
    """One replica: builds its system at start, batches compatible requests, answers the OpenAI routes."""

    def __init__(self, cfg: "ServeConfig"):
        bind_replica_grpc_to_node_address()  # before Serve starts the replica's gRPC server (after __init__)
        self.cfg = cfg
        system = {k: v for k, v in dataclasses.asdict(cfg.system).items() if k in system_fields(ServeConfig)}
        # verbose: a replica's output already goes where Ray puts its workers' (the serve job's log)
        self.system = System.build(**system, backend=cfg.backend, task=cfg.task, placement=cfg.placement,
                                   timeout_s=cfg.timeout_s, torch_threads=cfg.torch_threads, verbose=True,
                                   progress=False)
        self.tokenizer = _tokenizer(self.system.role_models[self.system.plan.style.decoder])

        self.trained_task = trained_task(self.system.cfg.system.ckpt_override)
        self.links_served = served_links(self.system.plan)  # /v1/models: each role's base model and links
        # In-process agents are not safe to drive from several threads at once; Ray agents are.
        self.lock = threading.Lock() if cfg.backend == "local" else None
        self.metrics = ServerMetrics()
        self.batcher = Batcher(self._run_batch, max_batch_size=cfg.max_batch_size,
                               batch_wait_timeout_s=cfg.batch_wait_timeout_s,
                               max_concurrent_batches=1 if cfg.backend == "local" else cfg.max_concurrent_batches)
        self.relay = None  # TokenRelay actor, made for the first streamed request on the Ray backend

    # ------------------------------------------------------------------ routes
    @api.get("/health")
    def health(self):
        return {"status": "ok", "model": self.cfg.served_name}

    @api.get("/metrics")
    def metrics(self):
        from prometheus_client import CONTENT_TYPE_LATEST  # lazy: loads only for /metrics

        return Response(self.metrics.exposition(self.batcher.queued_rows, self.batcher.running),
                        media_type=CONTENT_TYPE_LATEST)

    @api.get("/openapi.json", include_in_schema=False)
    def openapi(self, request: Request):
        if not authorized(request.headers.get("authorization"), self.cfg.api_key):
            return JSONResponse(unauthorized_body(), status_code=401)
        return JSONResponse(api.openapi())

    @api.get("/docs", include_in_schema=False)
    def docs(self, request: Request):
        from fastapi.openapi.docs import get_swagger_ui_html  # lazy: loads only for /docs

        if not authorized(request.headers.get("authorization"), self.cfg.api_key):
            return JSONResponse(unauthorized_body(), status_code=401)
        return get_swagger_ui_html(openapi_url="openapi.json", title="recmas_ray")

    @api.get("/v1/models")
    def models(self, request: Request):
        if not authorized(request.headers.get("authorization"), self.cfg.api_key):
            return JSONResponse(unauthorized_body(), status_code=401)
        return {"object": "list", "data": [{"id": self.cfg.served_name, "object": "model",
                                            "created": int(time.time()), "owned_by": "recmas_ray",
                                            "style": self.cfg.system.style, "role_models": self.system.role_models,
                                            "task": self.system.task, "links": self.links_served}]}

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._answer(request, "chat")

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._answer(request, "completion")

    # ------------------------------------------------------------------ one request
    async def _answer(self, request: Request, kind: str):
        t0, route = time.perf_counter(), f"/v1/{'chat/completions' if kind == 'chat' else 'completions'}"
        response = await self._respond(request, kind, t0, route)
        if not isinstance(response, StreamingResponse):
            self.metrics.observe_request(route, response.status_code, time.perf_counter() - t0)
        return response

    async def _respond(self, request: Request, kind: str, t0: float, route: str):
        if not authorized(request.headers.get("authorization"), self.cfg.api_key):
            return JSONResponse(unauthorized_body(), status_code=401)
        try:
            try:
                raw = await read_body(request, self.cfg.max_request_bytes)
            except BodyTooLarge:
                return JSONResponse(too_large_body(self.cfg.max_request_bytes), status_code=413)
            try:
                data = json.loads(raw)
            except ValueError:
                raise RequestError("the request body is not valid JSON") from None
            req = parse_request(data, kind=kind, served_name=self.cfg.served_name, defaults=self.cfg.recursion,
                                default_task=self.system.task, max_input_chars=self.cfg.max_input_chars,
                                roles=tuple(self.system.plan.style.roles))
            if req.task != self.system.task and self.trained_task and not self.cfg.system.allow_task_mismatch:
                raise RequestError(f"task {req.task!r}: the links served were trained on {self.trained_task!r}; "
                                   f"leave task out (or start the server with --allow_task_mismatch)", param="task")
            request_id = uuid.uuid4().hex
            if req.stream:
                return StreamingResponse(self._stream(req, request_id, t0, route), media_type="text/event-stream")
            choices = await self.batcher.submit(req.batch_key(request_id), req.num_rows, _Work(req))
        except RequestError as e:
            return JSONResponse(e.body(), status_code=e.status)
        except ValueError as e:  # a setting the system rejects (e.g. a budget above its limits)
            return JSONResponse(RequestError(" ".join(str(e).split())).body(), status_code=400)
        except Exception as e:  # noqa: BLE001 - a failed run: one line, no traceback in the response
            log.exception("request failed")
            return _error(f"{type(e).__name__}: {' '.join(str(e).split())[:500]}", 500)
        out = response_body(req, choices, model=self.cfg.served_name, tokenizer=self.tokenizer)
        self.metrics.observe_usage(*usage(req, choices, self.tokenizer))
        return JSONResponse(out)

    async def _stream(self, req: GenRequest, request_id: str, t0: float, route: str):
        writer, queue = ChunkWriter(req, self.cfg.served_name), asyncio.Queue()
        # sampled: row r is choice r; greedy: row r (question r) feeds its n identical choices
        choices_of = [[r] if req.sampled else list(range(r * req.n, (r + 1) * req.n)) for r in range(req.num_rows)]
        texts = [TextStream(self.tokenizer, req.stop) for _ in range(req.num_rows)]
        done = asyncio.ensure_future(self.batcher.submit(req.batch_key(request_id), req.num_rows,
                                                         _Work(req, on_rows=queue.put_nowait)))
        done.add_done_callback(lambda _: queue.put_nowait(None))
        status = 200
        try:
            yield writer.start(len(req.questions) * req.n)
            while (ids := await queue.get()) is not None:
                for r, token in enumerate(ids):
                    if token is not None and (delta := texts[r].add(token)):
                        for c in choices_of[r]:
                            yield writer.text(c, delta)
            try:
                choices = done.result()
            except Exception as e:  # noqa: BLE001 - the stream has started: the error goes in an event
                log.exception("streamed request failed")
                status = 500
                yield writer.error(f"{type(e).__name__}: {' '.join(str(e).split())[:500]}")
                return
            for r, text in enumerate(texts):
                if delta := text.close(choices[choices_of[r][0]].prediction):
                    for c in choices_of[r]:
                        yield writer.text(c, delta)
            self.metrics.observe_usage(*usage(req, choices, self.tokenizer))
            yield writer.finish(choices, self.tokenizer)
        finally:
            self.metrics.observe_request(route, status, time.perf_counter() - t0)

    # ------------------------------------------------------------------ one batch
    async def _run_batch(self, key: str, jobs: list) -> list:
        """Run the rows of every job as one batch; returns each job's choices (finish_reason set, stops cut)."""
        reqs = [job.payload.req for job in jobs]
        rc = reqs[0].recursion
        if rc.decode.do_sample and not reqs[0].seeded:  # unseeded sampling: a fresh seed per batch
            rc = dataclasses.replace(rc, decode=dataclasses.replace(rc.decode, seed=random.getrandbits(63)))
        questions = [q for req in reqs for q in req.questions for _ in range(req.n if req.sampled else 1)]
        tasks = [req.task for req in reqs for _ in range(req.num_rows)]
        on_token, stop_pump = self._token_route(jobs)
        self.metrics.batch_rows.observe(len(questions))
        finished = False
        try:
            results = await asyncio.to_thread(self._run_rows, questions, tasks, rc, on_token)
            finished = True
        finally:
            if stop_pump is not None:
                await stop_pump(drain=finished)
        out, k = [], 0
        for req in reqs:
            rows, k = results[k:k + req.num_rows], k + req.num_rows
            if not req.sampled and req.n > 1:  # greedy n: n copies of the one answer (as vLLM gives)
                rows = [copy.deepcopy(r) for r in rows for _ in range(req.n)]
            out.append([finish(r, rc.decode.max_new_tokens, req.stop) for r in rows])
        return out

    def _token_route(self, jobs: list):
        """(on_token for the engine, `stop_pump(drain=...)` or None) sending each step's ids to the streaming
        jobs' rows."""
        if not any(job.payload.on_rows for job in jobs):
            return None, None
        spans, k = [], 0
        for job in jobs:
            spans.append((job.payload.on_rows, k, k + job.rows))
            k += job.rows

        def dispatch(ids: list) -> None:
            for on_rows, lo, hi in spans:
                if on_rows is not None:
                    on_rows(ids[lo:hi])

        loop = asyncio.get_running_loop()
        if self.cfg.backend == "local":  # called in the batch's thread
            return (lambda ids: loop.call_soon_threadsafe(dispatch, ids)), None

        if self.relay is None:
            self.relay = TokenRelay.remote()
        key = uuid.uuid4().hex

        finished = asyncio.Event()

        async def pump():
            # The agent's puts are fire and forget: some may still be on their way (or queued behind the relay
            # actor's own start) when the batch's result arrives, so after it the pump keeps taking until the
            # relay stays quiet for RELAY_QUIET_S, instead of dropping the steps not yet taken; then it flushes
            # what the relay still holds past a gap (in step order), which should be nothing.
            try:
                while True:
                    steps = await self.relay.take.remote(key, RELAY_QUIET_S if finished.is_set() else 1.0)
                    if not steps and finished.is_set():
                        steps = await self.relay.take.remote(key, 0.0, flush=True)
                        if not steps:
                            return
                    for _, ids in steps:
                        dispatch(ids)
            finally:
                self.relay.close.remote(key)

        task = loop.create_task(pump())

        async def stop_pump(*, drain: bool) -> None:
            finished.set()
            if not drain:  # the batch failed: nothing more to stream
                task.cancel()
                return
            try:
                await asyncio.wait_for(task, RELAY_DRAIN_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("token relay still busy %.0f s after its batch finished; the rest comes as one chunk",
                            RELAY_DRAIN_TIMEOUT_S)

        return RelaySink(self.relay, key), stop_pump

    def _run_rows(self, questions, tasks, rc, on_token):
        if self.lock is None:
            return self.system.run(questions, tasks, rc, on_token=on_token)
        with self.lock:
            return self.system.run(questions, tasks, rc, on_token=on_token)

    def __del__(self):
        system = getattr(self, "system", None)
        if system is not None:
            system.close()


def build_app(cfg: ServeConfig):
    """The bound Serve application of a checked config (what `serve.run` takes)."""
    return RecMASServer.options(num_replicas=cfg.num_replicas, max_ongoing_requests=cfg.max_ongoing_requests,
                                ray_actor_options={"num_cpus": cfg.replica_cpus}).bind(cfg)


def app_builder(args: dict):
    """Serve config files' entry (`import_path: recmas_ray.serve.app:app_builder`): `args` are ServeConfig fields."""
    # nested by section, as a --config file (`system: {style: ...}`)
    cfg = from_dict(ServeConfig, dict(args or {}), where="serve application args")
    check_tree(cfg, lambda path: path)
    return build_app(cfg)
