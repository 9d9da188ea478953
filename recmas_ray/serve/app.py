"""The Ray Serve application: a FastAPI ingress whose replicas each drive one RecursiveMAS system.

    client (openai SDK, curl) --HTTP--> Serve proxy --> RecMASServer replica (FastAPI routes)
        replica: System.build(...) once; per request: check -> system.generate (in a thread) -> body
        backend ray:   the replica drives agent actors + an orchestrator (several requests in flight)
        backend local: the agents load inside the replica (requests run one at a time)

`build_app(cfg)` gives the bound application; `app_builder(args)` is the same for a Serve config file
(`cluster/serve.yaml`: `import_path: recmas_ray.serve.app:app_builder`, `args:` = ServeConfig fields).
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations (Request) as objects, and the
# class is shipped by value, without this module's globals.
import asyncio
import logging
import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from recmas_ray.serve.config import ServeConfig
from recmas_ray.serve.openai_api import (RequestError, completion_body, models_body, parse_chat_request,
                                         stream_chunks)

log = logging.getLogger(__name__)
api = FastAPI(title="recmas_ray", description="OpenAI-compatible chat completions of a RecursiveMAS system")


def _tokenizer(model_name: str):
    from transformers import AutoTokenizer

    from recmas_ray.models.loader import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model_name))


# Serve serializes the class when it is decorated: everything it uses must be defined above it.
@serve.deployment
@serve.ingress(api)
class RecMASServer:
    """One replica: builds its system at start and answers the OpenAI routes with it."""

    def __init__(self, cfg: "ServeConfig"):
        from recmas_ray.api import System

        self.cfg = cfg
        self.system = System.build(cfg.style, role_models=cfg.models, links=cfg.links,
                                   allow_base_model_mismatch=cfg.allow_base_model_mismatch,
                                   ckpt_override=cfg.ckpt_override, preset=cfg.preset, backend=cfg.backend,
                                   task=cfg.task, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed,
                                   placement=cfg.placement, timeout_s=cfg.timeout_s, torch_threads=cfg.torch_threads)
        self.tokenizer = _tokenizer(self.system.role_models[self.system.plan.style.decoder])
        # In-process agents are not safe to drive from several threads at once; Ray agents are.
        self.lock = threading.Lock() if cfg.backend == "local" else None

    @api.get("/v1/models")
    def models(self):
        return models_body(self.cfg.served_name, style=self.cfg.style, role_models=self.system.role_models)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        try:
            try:
                body = await request.json()
            except Exception:  # noqa: BLE001 - any unparsable body is the client's error
                raise RequestError("the request body is not valid JSON") from None
            req = parse_chat_request(body, served_name=self.cfg.served_name, defaults=self.cfg.recursion,
                                     default_task=self.cfg.task, max_input_chars=self.cfg.max_input_chars)
            result = await asyncio.to_thread(self._generate, req)
        except RequestError as e:
            return JSONResponse(e.body(), status_code=e.status)
        except ValueError as e:  # a setting the system rejects (e.g. a budget above its limits)
            return JSONResponse(RequestError(" ".join(str(e).split())).body(), status_code=400)
        except Exception as e:  # noqa: BLE001 - a failed run: one line, no traceback in the response
            log.exception("request failed")
            return JSONResponse({"error": {"message": f"{type(e).__name__}: {' '.join(str(e).split())[:500]}",
                                           "type": "server_error", "param": None, "code": None}}, status_code=500)
        prompt_tokens = len(self.tokenizer(req.question, add_special_tokens=False).input_ids)
        if req.stream:
            return StreamingResponse(stream_chunks(req, result, model=self.cfg.served_name,
                                                   prompt_tokens=prompt_tokens), media_type="text/event-stream")
        return completion_body(req, result, model=self.cfg.served_name, prompt_tokens=prompt_tokens)

    def _generate(self, req):
        rc, dc = req.recursion, req.recursion.decode
        kwargs = dict(task=req.task, method=rc.method, num_recursive_rounds=rc.num_recursive_rounds,
                      latent_steps=rc.latent_steps, max_new_tokens=dc.max_new_tokens, do_sample=dc.do_sample,
                      temperature=dc.temperature, top_p=dc.top_p, top_k=dc.top_k, seed=dc.seed)
        if self.lock is None:
            return self.system.generate([req.question], **kwargs)[0]
        with self.lock:
            return self.system.generate([req.question], **kwargs)[0]

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
    from recmas_ray.config.checks import check_tree
    from recmas_ray.config.cli import from_dict

    cfg = from_dict(ServeConfig, dict(args or {}), where="serve application args")
    check_tree(cfg, lambda path: path)
    return build_app(cfg)
