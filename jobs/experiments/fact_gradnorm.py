"""Gradient norms of two-hop outer training (sequential_light recall) with the critic's rollout feedback kept in
the graph or detached (`--rollout_feedback`), in one process with the pipeline's own stage functions.

Inner links of the planner and critic trained in-process (`train.inner.inner_loss`), outer links bridge-initialised,
then for each batch: planner rollout (memoised) -> planner->critic -> critic m-step rollout with grad -> critic->solver
-> solver CE (value tokens x5); the pre-clip gradient norm of both outer links is printed per mode, same batches.

    PYTHONPATH=$PWD python -m jobs.experiments.fact_gradnorm --m 16 --num_batches 4
"""

from __future__ import annotations

import argparse
import random
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--inner_steps", type=int, default=24)
    ap.add_argument("--num_batches", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(2)

    from recmas_ray.pool import LocalPool
    from recmas_ray.styles import build_schedule
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.bridge import bridge_outer_links
    from recmas_ray.train.data import role_examples
    from recmas_ray.train.inner import inner_loss
    from recmas_ray.train.outer import Latent, emit_messages, encode_stage, prepare_samples
    from recmas_ray.train.synthetic_facts import split_by_value

    t0 = time.perf_counter()
    style_name, task = "sequential_light", "qa"
    train, _, _ = split_by_value("recall", style_name, num_train=256, num_seen=4, num_unseen=0)
    plan = plan_system(style_name, preset="demo", ckpt_override={}, seed=0, task=task)
    bridge_outer_links(plan, ridge=1e-2)
    pool = local_pool(plan, pool_cls=LocalPool)
    style, agents = plan.style, {r: pool.services[r].agent for r in plan.style.roles}
    rng = random.Random(0)
    for role in ("planner", "critic"):
        pairs, link = role_examples(train, style, role, task), agents[role].inner_link
        link.requires_grad_(True)
        opt = torch.optim.AdamW(link.parameters(), lr=3e-3)
        for _ in range(args.inner_steps):
            loss = inner_loss(agents[role], rng.sample(pairs, 4))
            opt.zero_grad()
            loss.backward()
            opt.step()
        link.requires_grad_(False)
        print(f"[gradnorm] inner {role} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    samples = prepare_samples(train, style, task)
    sched = build_schedule(style, 1)
    links = [agents["planner"].outer_links["planner->critic"], agents["critic"].outer_links["critic->solver"]]
    for link in links:
        link.float().requires_grad_(True)
    cache: dict = {}
    batches = [samples[k * args.batch:(k + 1) * args.batch] for k in range(args.num_batches)]
    for mode in ("graph", "detached"):
        norms = []
        for batch in batches:
            kw = dict(task=task, num_rounds=1, max_latent_tokens=80, non_last_loss_weight=0.0, batch_size=len(batch),
                      rollout_latent_steps=args.m, rollout_stages="all", rollout_feedback=mode, rollout_cache=cache,
                      value_token_weight=5.0)
            plan_z = encode_stage(agents["planner"], style, sched[0], batch, {}, **kw)
            msg = emit_messages(agents["planner"], plan_z.z, sched[0].outputs)["planner->critic"]
            crit = encode_stage(agents["critic"], style, sched[1], batch, {sched[1].inputs[0][0]: Latent(msg, plan_z.lengths)}, **kw)
            msg2 = emit_messages(agents["critic"], crit.z, sched[1].outputs)["critic->solver"]
            dec = encode_stage(agents["solver"], style, sched[2], batch,
                               {sched[2].inputs[0][0]: Latent(msg2, crit.lengths)}, **kw)
            for link in links:
                link.zero_grad(set_to_none=True)
            dec.objective.backward()
            per = [float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in link.parameters()])))
                   for link in links]
            norms.append(per)
            print(f"[gradnorm] {mode} m {args.m}: loss {dec.objective.item():.3f} grad norm planner->critic "
                  f"{per[0]:.3g}, critic->solver {per[1]:.3g} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
