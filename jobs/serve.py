"""Serve a RecursiveMAS system as an OpenAI-compatible endpoint on Ray Serve.

  python -m jobs.serve --style sequential_light --preset tiny --port 8000
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
      -d '{"model": "sequential_light", "messages": [{"role": "user", "content": "What is 7 * 8?"}],
           "num_recursive_rounds": 2, "latent_steps": 8, "max_tokens": 64}'
The links a training run wrote (`train_inner --save_dir DIR`, `train_outer --links DIR`), prompted with the task
they were trained on (their manifests'; a request naming another is refused unless --allow_task_mismatch):
  python -m jobs.serve --style sequential_light --preset tiny --links DIR --port 8000
Any model per role, trained links (a folder or a Hub id), GPU agents:
  python -m jobs.serve --style sequential_light --preset paper --links org/recmas-links@v1 \
      --role_model critic=meta-llama/Llama-3.2-1B-Instruct --placement one_gpu_per_agent --device cuda \
      --host 0.0.0.0 --num_replicas 2          # RECMAS_API_KEY=... in the environment: clients need the key
Or with Serve's own tooling: `serve run cluster/serve.yaml`. Every setting can come from --config FILE.
Ray and Ray Serve output goes to --log_dir/serve.log (default out/serve/logs; --verbose shows it).
Ctrl-C stops serving: one line, exit status 130.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from recmas_ray.config.cli import parse_config, run_job
from recmas_ray.console import job_console
from recmas_ray.serve.config import ServeConfig
from recmas_ray.serve.security import API_KEY_ENV
from recmas_ray.styles.prompts import prompt_set_hash

def parse(argv) -> ServeConfig:
    """The checked config of a command line (what `main` would serve)."""
    return parse_config(ServeConfig, argv)[0]


def _ray_serve():
    """Ray Serve's API (`ray.serve`), loaded once the command line is checked."""
    from ray import serve  # lazy: --help and bad input must not import Ray (tests/jobs/test_job_start_and_interrupt.py)

    return serve


def _cluster():
    """`recmas_ray.distributed.cluster` (starting or joining Ray), loaded once the command line is checked."""
    from recmas_ray.distributed import cluster  # lazy: imports Ray (see _ray_serve)

    return cluster


def start(cfg: ServeConfig, plan=None) -> str:
    """Start Serve (HTTP on cfg.host:cfg.port) and the application; returns its base URL once it answers.
    `plan`: `serve_plan(cfg)` when the caller has checked it already."""
    from recmas_ray.serve.app import build_app  # lazy: Ray Serve and torch, once the input is checked

    serve = _ray_serve()
    # The config holds only the key's digest (ServeConfig.validate); the key itself must not reach the
    # Ray processes started next, which inherit this environment.
    os.environ.pop(API_KEY_ENV, None)
    plan = plan or serve_plan(cfg)  # links, base models, task and prompts checked before Ray starts
    _cluster().start_ray(cfg.address)
    if cfg.backend == "ray" and cfg.placement.wants_gpus():  # a plan that cannot fit stops before any replica loads
        from recmas_ray.distributed.memory import check_memory  # lazy: reads the cluster (Ray, torch)

        check_memory(plan, cfg.placement, **memory_args(cfg))
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(build_app(cfg), name=cfg.app_name, route_prefix=cfg.route_prefix)
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
    return f"http://{host}:{cfg.port}{cfg.route_prefix.rstrip('/')}"


def serve_plan(cfg: ServeConfig):
    """The system plan every replica builds (model configs and links; no model loaded), checked against the task
    and prompts its links were trained with (a mismatch is refused here, before Ray or a model starts)."""
    from recmas_ray.system.plan import plan_system  # lazy: imports torch; --help and bad input must not
    from recmas_ray.system.trained import check_trained_task, trained_task  # lazy: as plan_system

    folders = cfg.system.link_folders()
    task = cfg.task or trained_task(folders) or "math"
    plan = plan_system(cfg.system, task=task, ckpt_override=folders)
    check_trained_task(folders, [task], prompt_set_hash(plan.style), allow=cfg.system.allow_task_mismatch)
    return plan


def memory_args(cfg: ServeConfig) -> dict:
    """The memory plan's load: every Serve replica's system, batches of max_batch_size rows."""
    return {"recursion": cfg.recursion, "batch_size": cfg.max_batch_size, "calls_at_once": cfg.max_concurrent_batches,
            "num_systems": cfg.num_replicas}


def dry_run(cfg: ServeConfig) -> int:
    """`--dry_run`: print the memory plan of the served systems and stop (no Serve, no model)."""
    from recmas_ray.distributed.memory import dry_run as print_plan  # lazy: reads the cluster (Ray, torch)

    if cfg.backend == "ray" and cfg.placement.wants_gpus() and not cfg.placement.plan_node_gpus:
        _cluster().init_ray(cfg.address)  # the cluster's GPUs (a private local cluster: this machine's)
    return print_plan(serve_plan(cfg), cfg.placement, **memory_args(cfg))


def serve_forever(cfg: ServeConfig) -> int:
    """Start, print the URL, and keep serving until interrupted (Ctrl-C, SIGINT: the application is deleted,
    Ray shut down, one line, exit status 130).

    Ray, Ray Serve and HF output goes to --log_dir/serve.log (--verbose shows it)."""
    if cfg.dry_run:
        return dry_run(cfg)
    with job_console(cfg.log_dir, verbose=cfg.verbose, name="serve") as console:
        os.environ.pop(API_KEY_ENV, None)  # the key (its digest is in cfg) must not reach Ray's processes
        plan = serve_plan(cfg)  # links, task and prompts refused here, before Ray or a model starts
        _cluster().start_ray(cfg.address)  # its own phase line
        console.start("starting Ray Serve and the agents")
        try:
            url = start(cfg, plan)
            console.done()
            auth = "API key required" if cfg.api_key else "no API key (--api_key or $RECMAS_API_KEY to require one)"
            console.line(f"serving {cfg.served_name!r} at {url}/v1 (POST /chat/completions, /completions, GET "
                         f"/models; {auth}); GET {url}/health, /metrics; Ctrl-C stops")
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            console.finish_open(KeyboardInterrupt())
            _delete_app(cfg.app_name)
            raise
    return 0


def _delete_app(name: str, timeout_s: float = 15.0) -> None:
    """Delete the application (its replicas drain) within `timeout_s`; Ray's shutdown ends the rest."""
    serve = _ray_serve()

    def delete():
        try:
            serve.delete(name)
        except Exception:  # noqa: BLE001 - Serve already gone (its processes got the same Ctrl-C)
            pass

    t = threading.Thread(target=delete, name="serve-delete", daemon=True)
    t.start()
    t.join(timeout_s)


def main(argv=None) -> int:
    return run_job(serve_forever, ServeConfig, argv, prog="python -m jobs.serve", description=__doc__,
                   on_interrupt="stopped serving (the application deleted, Ray shut down)")


if __name__ == "__main__":
    sys.exit(main())
