"""Benchmark of pipeline-parallel outer training: activation memory per worker with and without --recompute at
R = 1, 2, 3, and the pipelined step time next to the single-process autograd reference on the same batches.

Memory is what each worker's tape holds for backward: the peak bytes of tensors saved by autograd (frozen
weights excluded), measured by `SavedTensorMeter` inside the Ray Train workers; GPU runs add
`torch.cuda.max_memory_allocated`. Without recompute it grows with R (one graph per round and microbatch);
with recompute only the stage being back-propagated holds a graph, so it should stay flat.

Examples
  python jobs/bench_outer.py --style sequential --preset tiny --rounds 1,2,3 --steps 3 --out bench_outer.json
  python jobs/bench_outer.py --style mixture --preset tiny --dataset_name synthetic:8 --batch_size 4 \
      --num_microbatches 2 --out bench_mixture.json
"""

import argparse
import json
import os
import statistics
import tempfile
import time


from recmas_ray.config.training import OuterTrainConfig


def bench_pipeline(base: dict, rounds: list[int], save_root: str) -> list[dict]:
    """One Ray Train run per (R, recompute); per-worker memory and the step time (min and median, first step
    skipped: the min is the robust figure on a shared machine)."""
    from recmas_ray.train.pipeline import train_outer

    rows = []
    for r in rounds:
        for recompute in (False, True):
            cfg = OuterTrainConfig(**base, num_recursive_rounds=r, recompute=recompute, profile_memory=True,
                                   save_every=0, save_dir=os.path.join(save_root, f"R{r}-rc{int(recompute)}"))
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
    """The single-process reference on the same batches; all agents in this process."""
    import torch

    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.data import load_rows
    from recmas_ray.train.core import step_indices
    from recmas_ray.train.outer import SavedTensorMeter
    from recmas_ray.train.reference import build_reference, reference_backward, reference_step

    plan = plan_system(base["style"], preset=base["preset"], ckpt_overrides=base.get("ckpt_override"),
                       seed=base["seed"])
    device = "cuda" if base["use_gpu"] else "cpu"
    agents, _ = build_reference(plan, device=device)
    data = load_rows(base["dataset_name"], base.get("dataset_json_field"))
    rows = []
    for r in rounds:
        outer = _fresh_outer(plan, device)
        opt = torch.optim.AdamW([p for m in outer.values() for p in m.parameters()], lr=base["lr"], betas=(0.9, 0.95))
        params = {p.untyped_storage().data_ptr() for a in agents.values()
                  for mod in (a.model, a.inner_link) for p in mod.parameters()}
        params |= {p.untyped_storage().data_ptr() for m in outer.values() for p in m.parameters()}
        meter, times = SavedTensorMeter(exclude=params), []
        for step in range(base["max_steps"]):
            batch = [data[j] for j in step_indices(len(data), step, base["batch_size"], base["seed"])]
            t0 = time.perf_counter()
            with meter.track():
                reference_backward(agents, outer, plan.style, batch, task=base["task"], num_rounds=r,
                                   max_latent_tokens=base["max_latent_tokens"],
                                   non_last_loss_weight=base["non_last_loss_weight"])
            reference_step(outer, opt, base["max_grad_norm"])
            times.append(time.perf_counter() - t0)
        rows.append({"rounds": r, "step_s": min(times[1:] or times), "step_s_median": statistics.median(times[1:] or times),
                     "peak_saved_bytes": meter.peak})
        print(f"[bench] reference R={r} step {rows[-1]['step_s']:.3f}s saved MiB {meter.peak / 2**20:.2f}", flush=True)
    return rows


def _fresh_outer(plan, device):
    import copy

    return {e: copy.deepcopy(plan.links.outer[e]).to(device) for e in plan.style.edges}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--style", default="sequential")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--dataset_name", default="synthetic:8")
    p.add_argument("--rounds", default="1,2,3")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--num_microbatches", type=int, default=2)
    p.add_argument("--max_latent_tokens", type=int, default=80)
    p.add_argument("--use_gpu", action="store_true")
    p.add_argument("--skip_reference", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the reference (Ray gives each "
                   "CPU worker OMP_NUM_THREADS=1); oversubscribed OpenMP makes CPU timings meaningless")
    p.add_argument("--out", default="bench_outer.json")
    args = p.parse_args(argv)
    rounds = [int(x) for x in args.rounds.split(",")]
    base = dict(style=args.style, preset=args.preset, dataset_name=args.dataset_name, max_steps=args.steps,
                batch_size=args.batch_size, num_microbatches=args.num_microbatches, lr=1e-4, warmup_steps=0,
                max_latent_tokens=args.max_latent_tokens, use_gpu=args.use_gpu, seed=0, max_failures=0)
    # the reference runs first, before any Ray process exists, so it has the machine to itself
    import torch

    torch.set_num_threads(args.threads)
    base_info = {**base, "reference_threads": args.threads}
    reference = [] if args.skip_reference else bench_reference(asdict_defaults(base), rounds)
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = bench_pipeline(base, rounds, tmp)
    ratio = {str(r["rounds"]): {f"recompute={p_['recompute']}": p_["step_s"] / r["step_s"]
                                for p_ in pipeline if p_["rounds"] == r["rounds"]} for r in reference}
    result = {"config": base_info, "pipeline": pipeline, "reference": reference, "step_time_ratio_pipeline_over_ref": ratio}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


def asdict_defaults(base: dict) -> dict:
    """The base flags completed with the config defaults the reference needs."""
    from dataclasses import asdict

    return {**asdict(OuterTrainConfig(**base)), **base}


if __name__ == "__main__":
    main()
