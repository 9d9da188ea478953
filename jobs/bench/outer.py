"""Benchmark of pipeline-parallel outer training: activation memory per worker with and without --recompute at
R = 1, 2, 3, and the pipelined step time next to the single-process autograd reference on the same batches.

Memory is what each worker's tape holds for backward: the peak bytes of tensors saved by autograd (frozen
weights excluded), measured by `SavedTensorMeter` inside the Ray Train workers; GPU runs add
`torch.cuda.max_memory_allocated`. Without recompute it grows with R (one graph per round and microbatch);
with recompute only the stage being back-propagated holds a graph, so it should stay flat.

Examples
  python -m jobs.bench.outer --style sequential --preset tiny --rounds 1,2,3 --max_steps 3
  python -m jobs.bench.outer --style mixture --preset tiny --dataset_name synthetic:8 --batch_size 4 \
      --num_microbatches 2 --output_path out/bench_mixture
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Annotated

import torch

from recmas_ray.config.checks import NonEmpty, Range, WritableDir, check_tree
from recmas_ray.config.cli import run_job
from recmas_ray.config.tree import save_config
from recmas_ray.config.recursion import MAX_LATENT_STEPS, MAX_ROUNDS
from recmas_ray.system.config import SystemConfig, with_system
from recmas_ray.system.plan import plan_system
from recmas_ray.train.config import OuterTrainConfig
from recmas_ray.train.core import step_indices
from recmas_ray.train.data import load_rows
from recmas_ray.train.outer import SavedTensorMeter
from recmas_ray.train.pipeline import train_outer
from recmas_ray.train.reference import build_reference, reference_backward, reference_step


def bench_pipeline(base: dict, rounds: list[int], save_root: str) -> list[dict]:
    """One Ray Train run per (R, recompute); per-worker memory and the step time (min and median, first step
    skipped: the min is the robust figure on a shared machine)."""
    rows = []
    for r in rounds:
        for recompute in (False, True):
            cfg = with_system(OuterTrainConfig, **base, num_recursive_rounds=r, recompute=recompute,
                              profile_memory=True, save_every=0,
                              save_dir=os.path.join(save_root, f"R{r}-rc{int(recompute)}"))
            res = train_outer(cfg)
            times = [e["step_s"] for e in res.log][1:] or [e["step_s"] for e in res.log]
            workers = {role: {k: v for k, v in w.items() if k.endswith("bytes")}
                       for role, w in res.metrics["workers"].items()}
            rows.append({"rounds": r, "recompute": recompute, "step_s": min(times), "step_s_median": statistics.median(times),
                         "workers": workers})
            print(f"[bench] R={r} recompute={recompute} step {rows[-1]['step_s']:.3f}s saved MiB "
                  + " ".join(f"{k}={v['peak_saved_bytes'] / 2**20:.2f}" for k, v in workers.items()), flush=True)
    return rows


def bench_reference(base: dict, rounds: list[int]) -> list[dict]:
    """The single-process reference on the same batches (`base`: the runs' shared settings, as for the
    pipelined runs); all agents in this process."""
    cfg = with_system(OuterTrainConfig, **base)
    data = load_rows(cfg.dataset_name, cfg.dataset_json_field)  # bad data fails before any model
    plan = plan_system(cfg.system, task=cfg.task)
    device = "cuda" if cfg.use_gpu else "cpu"
    agents, _ = build_reference(plan, device=device)
    rows = []
    for r in rounds:
        outer = _fresh_outer(plan, device)
        opt = torch.optim.AdamW([p for m in outer.values() for p in m.parameters()], lr=cfg.lr, betas=(0.9, 0.95))
        params = {p.untyped_storage().data_ptr() for a in agents.values()
                  for mod in (a.model, a.inner_link) for p in mod.parameters()}
        params |= {p.untyped_storage().data_ptr() for m in outer.values() for p in m.parameters()}
        meter, times = SavedTensorMeter(exclude=params), []
        for step in range(cfg.max_steps):
            batch = [data[j] for j in step_indices(len(data), step, cfg.batch_size, cfg.system.seed)]
            t0 = time.perf_counter()
            with meter.track():
                reference_backward(agents, outer, plan.style, batch, task=cfg.task, num_rounds=r,
                                   max_latent_tokens=cfg.max_latent_tokens,
                                   non_last_loss_weight=cfg.non_last_loss_weight)
            reference_step(outer, opt, cfg.max_grad_norm)
            times.append(time.perf_counter() - t0)
        rows.append({"rounds": r, "step_s": min(times[1:] or times), "step_s_median": statistics.median(times[1:] or times),
                     "peak_saved_bytes": meter.peak})
        print(f"[bench] reference R={r} step {rows[-1]['step_s']:.3f}s saved MiB {meter.peak / 2**20:.2f}", flush=True)
    return rows


def _fresh_outer(plan, device):
    return {e: copy.deepcopy(plan.links.outer[e]).to(device) for e in plan.style.edges}


@dataclass(kw_only=True)
class OuterBenchConfig:
    """What the outer-loop benchmark runs."""

    SYSTEM_FIELDS = ("style", "preset", "role_models")
    """System fields the benchmark reads (the others get no flag and are refused when set): every run seeds 0."""
    FLAG_ALIASES = {"role_model": "system.role_models", "steps": "max_steps"}
    """The benchmark's other flag spellings (config/cli.py)."""

    system: SystemConfig = field(default_factory=lambda: SystemConfig(style="sequential"))
    """The system trained: style and base models (preset, role_models)."""
    dataset_name: str = "synthetic:8"
    """Training rows (as train_outer's --dataset_name)."""
    rounds: Annotated[list[int], Range(1, MAX_ROUNDS), NonEmpty()] = field(default_factory=lambda: [1, 2, 3])
    """R values measured."""
    max_steps: Annotated[int, Range(1, 100_000)] = 3
    """Optimizer steps per run."""
    batch_size: Annotated[int, Range(1, 4096)] = 2
    """Samples per step."""
    num_microbatches: Annotated[int, Range(1, 4096)] = 2
    """Microbatches per step."""
    max_latent_tokens: Annotated[int, Range(1, MAX_LATENT_STEPS)] = 80
    """K: latents passed between agents."""
    use_gpu: bool = False
    """One GPU per role worker."""
    reference: bool = True
    """Also time the single-process autograd reference (--no_reference skips it)."""
    threads: Annotated[int, Range(1, 1024)] = 1
    """Torch threads of the reference (Ray gives each CPU worker OMP_NUM_THREADS=1); oversubscribed OpenMP
    makes CPU timings meaningless."""
    output_path: Annotated[str, WritableDir()] = "out/bench_outer"
    """Where bench_outer.json and config.json go."""

    def train_base(self) -> dict:
        """The OuterTrainConfig settings every measured run shares."""
        return dict(style=self.system.style, preset=self.system.preset, role_models=dict(self.system.role_models),
                    dataset_name=self.dataset_name, max_steps=self.max_steps, batch_size=self.batch_size,
                    num_microbatches=self.num_microbatches, lr=1e-4, warmup_steps=0,
                    max_latent_tokens=self.max_latent_tokens, use_gpu=self.use_gpu, seed=0, max_failures=0)

    def validate(self) -> None:
        """The training runs' own checks (dataset, models, GPU), before the reference loads any model."""
        self.system.check_tables("--role_model")
        if self.num_microbatches > self.batch_size:
            raise ValueError(f"--num_microbatches {self.num_microbatches} exceeds --batch_size {self.batch_size}")
        check_tree(with_system(OuterTrainConfig, **self.train_base(), save_dir=self.output_path))


def bench(args: OuterBenchConfig) -> int:
    """Reference first (the machine to itself), then the pipelined runs; write and print the JSON."""
    rounds = list(args.rounds)
    base = args.train_base()
    # the reference runs first, before any Ray process exists, so it has the machine to itself

    torch.set_num_threads(args.threads)
    base_info = {**base, "reference_threads": args.threads}
    reference = [] if not args.reference else bench_reference(base, rounds)
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = bench_pipeline(base, rounds, tmp)
    ratio = {str(r["rounds"]): {f"recompute={p_['recompute']}": p_["step_s"] / r["step_s"]
                                for p_ in pipeline if p_["rounds"] == r["rounds"]} for r in reference}
    result = {"config": base_info, "pipeline": pipeline, "reference": reference, "step_time_ratio_pipeline_over_ref": ratio}
    save_config(args, args.output_path)
    with open(os.path.join(args.output_path, "bench_outer.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    return 0


def main(argv=None) -> int:
    return run_job(bench, OuterBenchConfig, argv, prog="python -m jobs.bench.outer", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
