"""In-process diagnosis of one-hop fact training (distillation recall): probe, train, evaluate on train and held-out.

One process, no Ray: the expert's inner link trained with `train.inner.inner_loss`, the expert->learner outer link
trained with the pipeline's own stage functions (`train.outer.encode_stage` / `emit_messages`, the same calls a
pipeline worker makes), then greedy decoding through `runner.run_batch` on training questions and both held-out
splits. Prints the linear probe of x from the expert's rollout, the loss curve and the accuracies.
`--state_bridge rollout` fits the outer link's ridge init on the expert's rollout latents -> the learner's
embedding of the expert's own next-token argmax at each step (instead of token embedding pairs): the pipeline's
`--outer_init state_bridge` (`train.bridge.rollout_state_pairs`).
Figures of its runs: docs/learning_runs.md.

    PYTHONPATH=$PWD python -m jobs.experiments.fact_diag --m 4 --outer_steps 60 --num_eval 16
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--inner_steps", type=int, default=24)
    ap.add_argument("--outer_steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--value_weight", type=float, default=5.0)
    ap.add_argument("--num_train", type=int, default=512)
    ap.add_argument("--num_eval", type=int, default=16)
    ap.add_argument("--no_bridge", action="store_true")
    ap.add_argument("--task", default="recall")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--state_bridge", default="none", choices=("none", "rollout", "rollout+tokens"))
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    from jobs.experiments.sweep_recipe_measure import probe_x
    from recmas_ray.pool import LocalPool
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.bridge import bridge_outer_links
    from recmas_ray.train.data import question_text, role_examples
    from recmas_ray.train.inner import inner_loss
    from recmas_ray.train.outer import Latent, emit_messages, encode_stage, prepare_samples
    from recmas_ray.train.synthetic_facts import split_by_value
    from recmas_ray.styles import build_schedule, render_prompt

    t0 = time.perf_counter()
    style_name, task = "distillation", "qa"
    train, seen, unseen = split_by_value(args.task, style_name, num_train=args.num_train, num_seen=args.num_eval,
                                         num_unseen=args.num_eval, seed=args.seed)
    plan = plan_system(style_name, preset="demo", ckpt_override={}, seed=args.seed, task=task)
    if not args.no_bridge:
        bridge_outer_links(plan, ridge=1e-2)
    pool = local_pool(plan, pool_cls=LocalPool)
    style = plan.style
    expert, learner = pool.services["expert"].agent, pool.services["learner"].agent
    print(f"[diag] loaded {time.perf_counter() - t0:.0f} s; dtype {expert.dtype} {learner.dtype}", flush=True)

    # inner link of the expert (the learner's is unused at R = 1)
    pairs = role_examples(train, style, "expert", task)
    link = expert.inner_link
    link.requires_grad_(True)
    opt = torch.optim.AdamW(link.parameters(), lr=3e-3)
    rng = random.Random(args.seed)
    for s in range(args.inner_steps):
        loss = inner_loss(expert, rng.sample(pairs, 4))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(link.parameters(), 1.0)
        opt.step()
        if s % 8 == 0 or s == args.inner_steps - 1:
            print(f"[diag] inner {s} loss {loss.item():.3f}", flush=True)
    link.requires_grad_(False)

    samples = prepare_samples(train, style, task)
    sched = build_schedule(style, 1)
    cache: dict = {}
    kw = dict(task=task, num_rounds=1, max_latent_tokens=80, non_last_loss_weight=0.1,
              rollout_latent_steps=args.m, rollout_stages="first", rollout_cache=cache)

    def rollout_z(rows):
        ss = prepare_samples(rows, style, task)
        out = []
        for k in range(0, len(ss), 16):
            out.append(encode_stage(expert, style, sched[0], ss[k:k + 16], {}, batch_size=1, **kw).z
                       .reshape(len(ss[k:k + 16]), args.m, -1))
        return torch.cat(out)

    probe_rows = train[:128]
    z = rollout_z(probe_rows)
    x = [r["facts"]["fact"] for r in probe_rows]
    for name, f in (("mean", z.mean(1)), ("last", z[:, -1]), ("first", z[:, 0])):
        print(f"[diag] probe x from expert z {name}: {probe_x(f.float().numpy(), x)}", flush=True)

    edge = "expert->learner"
    olink = expert.outer_links[edge]
    fresh_state = {k: v.detach().clone() for k, v in olink.state_dict().items()}  # the untrained links' row
    if args.state_bridge != "none":  # the pipeline's --outer_init state_bridge fit (train.bridge), on this link
        from recmas_ray.links import init_bridge
        from recmas_ray.train.bridge import rollout_state_pairs, shared_token_pairs

        users = [render_prompt(style, "expert", sched[0].variant, task, question_text(r)) for r in train]
        x_ND, y_NE, num_states = rollout_state_pairs(expert, users, learner.tokenizer,
                                                     learner.model.get_input_embeddings(), num_steps=args.m)
        with torch.no_grad():
            if args.state_bridge == "rollout+tokens":
                src_ids, dst_ids = shared_token_pairs(expert.tokenizer, learner.tokenizer, max_pairs=4000)
                x_ND = torch.cat([x_ND, expert.model.get_input_embeddings()(torch.tensor(src_ids)).float()])
                y_NE = torch.cat([y_NE, learner.model.get_input_embeddings()(torch.tensor(dst_ids)).float()])
            print(f"[diag] state bridge on {len(x_ND)} rollout states of {num_states}", flush=True)
            init_bridge(olink, x_ND, y_NE, ridge=1e-2)
    olink.float().requires_grad_(True)
    oopt = torch.optim.AdamW(olink.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    order = list(range(len(samples)))
    t1 = time.perf_counter()
    for s in range(args.outer_steps):
        if s % (len(order) // args.batch) == 0:
            rng.shuffle(order)
        k = (s % (len(order) // args.batch)) * args.batch
        batch = [samples[i] for i in order[k:k + args.batch]]
        enc = encode_stage(expert, style, sched[0], batch, {}, batch_size=len(batch), **kw)
        msg = emit_messages(expert, enc.z, (edge,))[edge]
        marker = sched[1].inputs[0][0]
        dec = encode_stage(learner, style, sched[1], batch, {marker: Latent(msg, enc.lengths)}, batch_size=len(batch),
                           value_token_weight=args.value_weight, **{**kw, "rollout_latent_steps": 0})
        oopt.zero_grad()
        dec.objective.backward()
        gn = torch.nn.utils.clip_grad_norm_(olink.parameters(), 1.0)
        oopt.step()
        if s % 10 == 0 or s == args.outer_steps - 1:
            print(f"[diag] outer {s} loss {np.mean(dec.sample_losses):.3f} weighted {dec.objective.item():.3f} grad {gn:.2f} "
                  f"({time.perf_counter() - t1:.0f} s)", flush=True)
    olink.requires_grad_(False)

    splits = (("train", train[:16]), ("seen", seen), ("unseen", unseen))  # train: a check of fit, 16 are enough
    own_shuffled_fresh(pool, style, task, args.m, splits, lambda: olink.load_state_dict(fresh_state), tag="diag")
    print(f"[diag] total {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def own_shuffled_fresh(pool, style, task: str, m: int, splits, restore_fresh, *, tag: str) -> dict:
    """Greedy decoding of the whole system (`runner.run_batch`, the inference path) on each (name, rows) split
    with the trained links' own latents and latents shuffled between questions, then `restore_fresh()` and the
    held-out splits ("seen", "unseen") again with the fresh links; prints strict accuracy per row and McNemar's
    exact test of own vs shuffled and vs fresh per held-out split and together. Returns (split, ablation) ->
    per-question correctness. Shared by the one-hop and two-hop diagnoses."""
    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
    from recmas_ray.eval.graders import grade_math_strict
    from recmas_ray.eval.stats import mcnemar_exact
    from recmas_ray.runner import run_batch
    from recmas_ray.train.data import question_text

    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=m,
                         decode=DecodeConfig(max_new_tokens=16, seed=0))
    correct: dict[tuple[str, str], list[bool]] = {}

    def evaluate(split, rows, abl):  # abl: a latent ablation, or "fresh" (the links as loaded now, unablated)
        res = run_batch(pool, style, [question_text(r) for r in rows], [task] * len(rows),
                        RecursionConfig(**{**rc.__dict__, "latent_ablation": "none" if abl == "fresh" else abl}))
        correct[split, abl] = [bool(grade_math_strict(r_.prediction, r["gold"])) for r_, r in zip(res, rows)]
        print(f"[{tag}] {split} {abl}: strict {sum(correct[split, abl])}/{len(rows)}; e.g. "
              f"{[(r['gold'], r_.prediction) for r_, r in zip(res[:3], rows[:3])]}", flush=True)

    for split, rows in splits:
        for abl in ("none", "shuffle"):
            evaluate(split, rows, abl)
    restore_fresh()
    for split, rows in splits:
        if split in ("seen", "unseen"):
            evaluate(split, rows, "fresh")
    for split in ("seen", "unseen", "held-out"):
        def of(abl):
            return (correct["seen", abl] + correct["unseen", abl]) if split == "held-out" else correct[split, abl]
        vs = {other: mcnemar_exact(of("none"), of(other))["p"] for other in ("shuffle", "fresh")}
        print(f"[{tag}] {split}: own {sum(of('none'))}/{len(of('none'))} vs shuffled {sum(of('shuffle'))} vs fresh "
              f"{sum(of('fresh'))} (McNemar p {vs['shuffle']:.2g} vs shuffled, {vs['fresh']:.2g} vs fresh)",
              flush=True)
    return correct


if __name__ == "__main__":
    raise SystemExit(main())
