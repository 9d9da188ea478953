"""One agent's throughput with continuous batching: questions/s through a latent rollout and a decode
at 1, 8 and 32 batches in flight, on a real model, with every batch's outputs compared to the
one-at-a-time run. Writes engine.json (figures, outputs identical or not, the machine's load).

Each batch is one solver-like job: `rows` questions, a rollout of `latent_steps` latent steps, then a
decode of up to `tokens` tokens from a prompt holding those latents. N in flight: N threads submit
their batches to one `StepScheduler`, which merges every step of every batch in flight into shared
forwards; 1 in flight is the same scheduler with one batch at a time (equal to the batch path).

    python -m jobs.bench.engine                               # SmolLM2-135M, CPU, a few minutes
    python -m jobs.bench.engine --model tiny:llama --num_batches 8 --in_flight 1 4   # seconds
    python -m jobs.bench.engine --device cuda --model tiny:llama --in_flight 1 8 64   # a GPU (jobs/gpu_check.sh)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job

SLOT = "<<LATENT_PLANNER_SLOT>>"


@dataclass(kw_only=True)
class EngineBenchConfig:
    """Continuous batching benchmark of one agent (see the module docstring)."""

    model: str = "pkg:smollm2-135m-instruct"
    """The agent's base model (packaged real model by default; tiny:FAMILY for a quick check)."""
    in_flight: Annotated[list[int], Range(1, 1024), NonEmpty()] = field(default_factory=lambda: [1, 8, 32])
    """Batches in flight per measurement."""
    num_batches: Annotated[int, Range(1, 100_000)] = 32
    """Batches per measurement (the same batches at every depth)."""
    rows: Annotated[int, Range(1, 256)] = 1
    """Questions per batch."""
    latent_steps: Annotated[int, Range(1, 4096)] = 16
    """m of each batch's rollout."""
    tokens: Annotated[int, Range(1, 4096)] = 32
    """Decode budget of each batch."""
    torch_threads: Annotated[int, Range(0, 1024)] = 2
    """torch threads (0: torch's default)."""
    device: Annotated[str, OneOf(("cpu", "cuda"))] = "cpu"
    """Where the agent runs."""
    dtype: Annotated[str, OneOf(("float32", "bfloat16"))] = "float32"
    """The model's dtype. In bfloat16 (as on a GPU in production) a merged batch's shape changes the rounding, so
    greedy tokens may differ from one batch at a time: `identical_outputs` false, exit status 1."""
    output_path: Annotated[str, WritableDir()] = "out/bench_engine"


def _questions(n: int, rows: int) -> list[list[str]]:
    from recmas_ray.train.synthetic import make_arithmetic_dataset

    data = make_arithmetic_dataset(n * rows, seed=7)
    return [[r["question"] for r in data[k * rows:(k + 1) * rows]] for k in range(n)]


def _job(agent, sched, users: list[str], cfg):
    """One batch: rollout on its prompt, then a decode whose prompt carries those latents."""
    from recmas_ray.config.recursion import DecodeConfig

    plan_users = [f"Question: {u}\nMake a short plan." for u in users]
    e, mask, prefix = agent.embed_batch_with_prefix(plan_users)
    h = sched.rollout(e, mask, cfg.latent_steps, prefix_ids=prefix)
    solve_users = [f"Question: {u}\nPlan: {SLOT}\nSolve it." for u in users]
    e2, mask2, prefix2 = agent.embed_batch_with_prefix(solve_users, {SLOT: agent.inner_link(h)})
    ids = sched.decode(e2, mask2, DecodeConfig(max_new_tokens=cfg.tokens), prefix_ids=prefix2)
    return [agent.detokenize(t) for t in ids], sum(len(t) for t in ids)


def measure(agent, batches, depth: int, cfg) -> dict:
    """All batches with `depth` of them in flight at once (threads over one scheduler)."""
    from recmas_ray.kv_cache import PrefixStore
    from recmas_ray.scheduler import StepScheduler

    agent.prefix_store = PrefixStore(int(agent.engine.prefix_cache_mib * 2**20))  # every depth starts cold
    sched = StepScheduler(agent)
    outputs: list = [None] * len(batches)
    tokens = [0]
    next_k = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                k = next_k[0]
                next_k[0] += 1
            if k >= len(batches):
                return
            outputs[k], n = _job(agent, sched, batches[k], cfg)
            with lock:
                tokens[0] += n

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(depth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    sched.close()
    rows = sum(len(b) for b in batches)
    return {"in_flight": depth, "seconds": seconds, "questions_per_s": rows / seconds,
            "decoded_tokens": tokens[0], "shared_steps": sched.num_steps,
            "rows_per_step": sched.rows_stepped / max(sched.num_steps, 1),
            "loadavg_1m_before": load_before[0], "loadavg_1m_after": os.getloadavg()[0], "outputs": outputs}


def bench(cfg: EngineBenchConfig) -> int:
    import torch

    from recmas_ray.agent import Agent
    from recmas_ray.config.inputs import check_cuda
    from recmas_ray.links import InnerLink
    from recmas_ray.models.loader import load_frozen_model

    if cfg.device == "cuda":
        check_cuda("--device cuda")  # one line, exit 2, before the model loads
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    model, tok = load_frozen_model(cfg.model, dtype=getattr(torch, cfg.dtype), device=cfg.device)
    torch.manual_seed(0)
    agent = Agent(model, tok, InnerLink(model.config.hidden_size), role="solver", model_name=cfg.model)
    batches = _questions(cfg.num_batches, cfg.rows)
    runs = []
    with torch.no_grad():
        for depth in cfg.in_flight:
            run = measure(agent, batches, depth, cfg)
            runs.append(run)
            print(f"in flight {depth:4d}: {run['questions_per_s']:.2f} questions/s, {run['rows_per_step']:.1f} "
                  f"rows per shared step, load {run['loadavg_1m_before']:.1f}", flush=True)
    base = runs[0]
    report = {"config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}, "cpu_count": os.cpu_count(),
              "device_name": torch.cuda.get_device_name(0) if cfg.device == "cuda" else "cpu",
              "runs": [{k: v for k, v in r.items() if k != "outputs"} for r in runs],
              "identical_outputs": all(r["outputs"] == base["outputs"] for r in runs),
              "speedup_vs_first": {str(r["in_flight"]): r["questions_per_s"] / base["questions_per_s"] for r in runs},
              "example_output": base["outputs"][0][0][:200]}
    os.makedirs(cfg.output_path, exist_ok=True)
    path = os.path.join(cfg.output_path, "engine.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({"identical_outputs": report["identical_outputs"], "speedup": report["speedup_vs_first"]}))
    print(f"wrote {path}")
    return 0 if report["identical_outputs"] else 1


def main(argv=None) -> int:
    return run_job(bench, EngineBenchConfig, argv, prog="python -m jobs.bench.engine", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
