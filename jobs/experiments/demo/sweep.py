"""The sweep that chose the demo's training defaults: inner learning rate x steps, then m.

In-process and small, so it fits a busy 2-core machine (the figures are in `jobs.experiments.demo`'s docstring):
for each learning rate, the planner's and critic's inner links train on the demo's training rows
(batch 2); their held-out cosine loss is measured after every `--eval_every` steps; then RecursiveMAS
at R = 1 with those inner links and fresh outer links gives the held-out answer NLL for each m.

  python -m jobs.experiments.demo.sweep --lrs 3e-4,1e-3,3e-3 --steps 24 --ms 4,8,16 --num_eval 16
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.experiments.demo.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo", choices=["demo", "tiny"])
    p.add_argument("--lrs", default="3e-4,1e-3,3e-3")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--eval_every", type=int, default=8)
    p.add_argument("--ms", default="4,8,16")
    p.add_argument("--num_train", type=int, default=128)
    p.add_argument("--num_eval", type=int, default=16)
    p.add_argument("--roles", default="planner,critic")
    p.add_argument("--out", default="out/demo_sweep.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
    from recmas_ray.runner import run_batch
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.data import role_examples
    from recmas_ray.train.config import InnerTrainConfig
    from recmas_ray.system.link_init import seeded_inner_link
    from recmas_ray.train.inner import inner_loss, make_optimizer, train_step
    from recmas_ray.train.synthetic import check_disjoint, make_arithmetic_dataset, split_train_eval

    rows = make_arithmetic_dataset(args.num_train + args.num_eval, seed=0, difficulty="arith")
    train, heldout = split_train_eval(rows, args.num_eval, seed=0)
    check_disjoint(train, heldout)
    plan = plan_system("sequential_light", preset=args.preset, seed=0, task="qa")
    style = plan.style
    pool = local_pool(plan)
    roles = args.roles.split(",")
    results = []
    for lr in [float(x) for x in args.lrs.split(",")]:
        rec = {"lr": lr, "heldout_cosine_loss": {}, "nll_by_m": {}}
        t0 = time.perf_counter()
        for role in roles:
            agent = pool.services[role].agent
            agent.inner_link = seeded_inner_link(agent.hidden_size, seed=0, role=role).to(agent.device, agent.dtype)
            cfg = InnerTrainConfig(mas_role=role, max_steps=args.steps, lr=lr, warmup_steps=2, batch_size=2)
            opt, sched = make_optimizer(agent.inner_link, cfg)
            ex_train, ex_eval = role_examples(train, style, role, "qa"), role_examples(heldout, style, role, "qa")
            curve = {}
            with torch.no_grad():
                curve[0] = float(inner_loss(agent, ex_eval[:8]))
            g = torch.Generator().manual_seed(0)
            for step in range(1, args.steps + 1):
                idx = torch.randint(len(ex_train), (2,), generator=g).tolist()
                train_step(agent, opt, sched, [ex_train[i] for i in idx], cfg)
                if step % args.eval_every == 0 or step == args.steps:
                    with torch.no_grad():
                        curve[step] = float(inner_loss(agent, ex_eval[:8]))
            rec["heldout_cosine_loss"][role] = curve
            print(json.dumps({"lr": lr, "role": role, "curve": curve}), flush=True)
        questions = [r["question"] for r in heldout]
        targets = [r["answer"] for r in heldout]
        for m in [int(x) for x in args.ms.split(",")]:
            rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=m,
                                 decode=DecodeConfig(max_new_tokens=1))
            nll = []
            for k in range(0, len(questions), 8):
                nll += [r.nll for r in run_batch(pool, style, questions[k:k + 8], ["qa"] * len(questions[k:k + 8]),
                                                 rc, targets=targets[k:k + 8])]
            rec["nll_by_m"][m] = sum(nll) / len(nll)
            print(json.dumps({"lr": lr, "m": m, "nll": rec["nll_by_m"][m]}), flush=True)
        rec["seconds"] = time.perf_counter() - t0
        results.append(rec)
    # reference: fresh links (no training) at each m
    base = {}
    for role in roles:
        agent = pool.services[role].agent
        agent.inner_link = seeded_inner_link(agent.hidden_size, seed=0, role=role).to(agent.device, agent.dtype)
    for m in [int(x) for x in args.ms.split(",")]:
        rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=m,
                             decode=DecodeConfig(max_new_tokens=1))
        nll = []
        for k in range(0, len(heldout), 8):
            chunk = heldout[k:k + 8]
            nll += [r.nll for r in run_batch(pool, style, [r["question"] for r in chunk], ["qa"] * len(chunk), rc,
                                             targets=[r["answer"] for r in chunk])]
        base[m] = sum(nll) / len(nll)
    print(json.dumps({"fresh_nll_by_m": base}), flush=True)
    from pathlib import Path

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results, "fresh_nll_by_m": base}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
