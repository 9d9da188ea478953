"""Ray backend vs in-process backend: seconds per sample on the same agents, questions and batch.

Both backends run the same system (same models, links and seed) on one machine. Repetitions are
interleaved (local, Ray with one batch, Ray with K batches in flight, then again) so load drift on
a shared machine hits all three alike, and the median of each is reported. Figures:

  ratio_1_in_flight   Ray s/sample with one batch at a time / in-process s/sample
  ratio_k_in_flight   Ray s/sample with K batches submitted together / in-process s/sample
                      (different agents work on different batches at once)

Target: ratio_1 <= 1.10 at batch 8, m = 32, R = 3 with hidden sizes >= 256, and ratio_k < 1.
The tiny preset's only family with hidden 256 is mistral, hence the example override.

  python -m jobs.bench.backend --preset tiny --role_models all=tiny:mistral
  python -m jobs.bench.backend --preset demo --style sequential_light --repeats 5
  python -m jobs.bench.backend --address auto ...      # measure on a running cluster instead

Writes <output_path>/bench_backend.json with the figures, every raw time and the machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Annotated

import ray
import torch
import transformers

from recmas_ray.config.checks import OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.inputs import check_cuda, check_ray_address
from recmas_ray.config.tree import save_config
from recmas_ray.config.recursion import MAX_LATENT_STEPS, MAX_NEW_TOKENS, MAX_ROUNDS, DecodeConfig, RecursionConfig
from recmas_ray.config.placement import PRESETS, PlacementConfig
from recmas_ray.distributed.cluster import init_local_ray  # token auth, 127.0.0.1 only
from recmas_ray.distributed.launch import start_agents
from recmas_ray.models.registry import check_model_names
from recmas_ray.engine.runner import run_batch
from recmas_ray.styles import check_role_models, get_style
from recmas_ray.system.config import SystemConfig
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system
from recmas_ray.train.synthetic import make_arithmetic_dataset


def expand_role_models(table: dict[str, str], roles) -> dict[str, str]:
    """{"all": M} gives every role M; other keys are roles (checked by the config's validate)."""
    out = {r: table["all"] for r in roles} if "all" in table else {}
    out.update({role: model for role, model in table.items() if role != "all"})
    return out


def machine(torch_threads: int) -> dict:
    """What the figures were measured on (load average included: the host may be shared)."""
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch_threads, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "ray": ray.__version__,
            "loadavg_1_5_15": list(os.getloadavg())}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _nice(info: dict):
    """Niceness of an agent process on this host (None when it runs elsewhere)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, int(info["pid"])) if info.get("hostname") == platform.node() else None
    except (OSError, KeyError, TypeError, ValueError):
        return None


@dataclass(kw_only=True)
class BackendBenchConfig:
    """What the backend benchmark runs."""

    SYSTEM_FIELDS = ("style", "preset", "role_models", "device", "dtype", "seed")
    """System fields the benchmark reads (the others get no flag and are refused when set): it measures fresh links."""
    FLAG_ALIASES = {"role_model": "system.role_models", "role_models": "system.role_models",
                    "rounds": "num_recursive_rounds"}
    """The benchmark's other flag spellings (config/cli.py)."""

    system: SystemConfig = field(default_factory=lambda: SystemConfig(style="sequential_light", seed=0))
    """The system measured: style, base models (role_models also takes all=MODEL, e.g. all=tiny:mistral, for
    every role), device, dtype and seed (of the links and questions)."""
    batch_size: Annotated[int, Range(1, 4096)] = 8
    """Questions per batch."""
    latent_steps: Annotated[int, Range(0, MAX_LATENT_STEPS)] = 32
    """m."""
    num_recursive_rounds: Annotated[int, Range(1, MAX_ROUNDS)] = 3
    """R."""
    max_new_tokens: Annotated[int, Range(1, MAX_NEW_TOKENS)] = 32
    """Decoding budget."""
    inflight: Annotated[int, Range(1, 1024)] = 3
    """K batches submitted together for the second figure."""
    repeats: Annotated[int, Range(1, 1000)] = 5
    """Interleaved repetitions; medians are reported."""
    placement: Annotated[str, OneOf(PRESETS)] = "cpu"
    """Placement preset of the agent actors."""
    cpus_per_agent: Annotated[float, Range(0, 1024)] = 0.5
    """Logical CPUs per agent actor."""
    torch_threads: Annotated[int, Range(0, 1024)] = 1
    """Torch threads per agent, the same in both backends (0: all cores); 1 keeps CPU timings steady, since
    OpenMP spin-waits collapse when cores are oversubscribed."""
    address: str | None = None
    """Join this Ray cluster; default: start a private local one."""
    output_path: Annotated[str, WritableDir()] = "out/bench_backend"
    """Where bench_backend.json and config.json go."""

    def validate(self) -> None:
        check_role_models("--role_model", self.system.role_models, self.system.style, extra=("all",))
        check_model_names("--role_model", self.system.role_models)
        if self.system.device == "cuda":
            check_cuda("--device cuda")
        if self.address:
            check_ray_address("--address", self.address)


def run(args) -> dict:
    threads = args.torch_threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    system = args.system
    plan = plan_system(system, role_models=expand_role_models(system.role_models, get_style(system.style).roles))
    questions = [r["question"] for r in make_arithmetic_dataset(args.batch_size, seed=system.seed + 1000)]
    tasks = ["math"] * len(questions)
    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=args.num_recursive_rounds, latent_steps=args.latent_steps,
                         decode=DecodeConfig(max_new_tokens=args.max_new_tokens))
    pool = local_pool(plan)

    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:  # "local": never join another user's cluster on a shared host
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        # Ray renices workers to 15 by default; at 0 the actors compete for a shared host's cores
        # on the same terms as the in-process backend (this driver).
        init_local_ray(num_cpus=max(4, len(plan.style.roles) + 2), include_dashboard=False,
                       log_to_driver=False, object_store_memory=512 * 2**20, _system_config={"worker_niceness": 0})
    system = start_agents(plan, backend="ray", timeout_s=3600, torch_threads=threads,
                          placement=PlacementConfig(preset=args.placement, cpus_per_agent=args.cpus_per_agent))
    k, b = args.inflight, args.batch_size
    times = {"local": [], "ray_1": [], "ray_k": []}
    agent_times = {"local": [], "ray_1": [], "ray_k": []}  # seconds spent inside agent calls
    load_start = list(os.getloadavg())
    try:
        local_preds = [r.prediction for r in run_batch(pool, plan.style, questions, tasks, rc)]  # warm-up
        ray_preds = [r.prediction for r in ray.get(system.solve(questions, tasks, rc), timeout=3600)]
        ray.get([system.solve(questions, tasks, rc) for _ in range(k)], timeout=3600)
        runs = {
            "local": (1, lambda rep: run_batch(pool, plan.style, questions, tasks, rc)),
            "ray_1": (1, lambda rep: ray.get(system.solve(questions, tasks, rc, batch_id=f"r{rep}"), timeout=3600)),
            "ray_k": (k, lambda rep: sum(ray.get([system.solve(questions, tasks, rc, batch_id=f"r{rep}k{i}")
                                                  for i in range(k)], timeout=3600), [])),
        }
        order = list(runs)
        for rep in range(args.repeats):
            for name in order[rep % 3:] + order[:rep % 3]:  # rotate, so no backend always runs first
                n_batches, fn = runs[name]
                t0 = time.perf_counter()
                results = fn(rep)
                times[name].append((time.perf_counter() - t0) / (n_batches * b))
                agent_times[name].append(sum(t["seconds"] for r in results for t in r.trace) / len(results))
            print(f"rep {rep}: s/sample local {times['local'][-1]:.4f}  ray {times['ray_1'][-1]:.4f}  "
                  f"ray x{k} {times['ray_k'][-1]:.4f}", flush=True)
        infos = system.systems[0].infos
    finally:
        system.shutdown()
    med = {name: statistics.median(v) for name, v in times.items()}
    # Wall minus time inside agent calls: what each backend adds around the same model work
    # (driver bookkeeping; on Ray also scheduling and object transfers). Less sensitive to load.
    overhead = {name: statistics.median(w - a for w, a in zip(times[name], agent_times[name]))
                for name in ("local", "ray_1")}
    return {
        "figures": {"local_s_per_sample": med["local"], "ray_s_per_sample_1_in_flight": med["ray_1"],
                    f"ray_s_per_sample_{k}_in_flight": med["ray_k"], "ratio_1_in_flight": med["ray_1"] / med["local"],
                    "ratio_k_in_flight": med["ray_k"] / med["local"], "k": k,
                    "agent_s_per_sample": {n: statistics.median(v) for n, v in agent_times.items()},
                    "overhead_s_per_sample": overhead},
        "predictions_match": local_preds == ray_preds,
        "times_s_per_sample": times, "agent_s_per_sample": agent_times,
        "config": {**dataclasses.asdict(args), "torch_threads": threads},
        "role_models": plan.role_models, "hidden_sizes": plan.hidden_sizes,
        "agents": {r: {**{key: i.get(key) for key in ("device", "gpu_ids", "node", "pid")}, "nice": _nice(i)}
                   for r, i in infos.items()},
        "machine": {**machine(threads), "loadavg_at_start": load_start},
    }


def bench(args: BackendBenchConfig) -> int:
    """Measure, write the JSON and the config, print the figures."""
    result = run(args)
    save_config(args, args.output_path)
    path = os.path.join(args.output_path, "bench_backend.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    fig = result["figures"]
    k = fig["k"]
    print(f"hidden sizes {result['hidden_sizes']}, batch {args.batch_size}, m {args.latent_steps}, R {args.num_recursive_rounds}")
    print(f"in-process {fig['local_s_per_sample']:.4f} s/sample; Ray {fig['ray_s_per_sample_1_in_flight']:.4f} "
          f"(1 batch in flight), {fig['ray_s_per_sample_%d_in_flight' % k]:.4f} ({k} in flight)")
    print(f"ratio ray/local: {fig['ratio_1_in_flight']:.3f} (1 in flight), {fig['ratio_k_in_flight']:.3f} "
          f"({k} in flight); predictions match: {result['predictions_match']}")
    ov = fig["overhead_s_per_sample"]
    print(f"outside agent calls (s/sample): in-process {ov['local']:.4f}, Ray {ov['ray_1']:.4f}; "
          f"inside agent calls: {', '.join(f'{n} {v:.4f}' for n, v in fig['agent_s_per_sample'].items())}")
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    return run_job(bench, BackendBenchConfig, argv, prog="python -m jobs.bench.backend", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
