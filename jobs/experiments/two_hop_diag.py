"""In-process two-hop fact training (sequential_light recall), one hop at a time: planner -> critic -> solver.

The planner alone is told the fact ("x = 65."), the solver is asked "What is x?". Training the two outer
links end to end through the solver's loss left the fact in the middle (docs/learning_runs.md: the critic's
outgoing message did not hold x). Here each hop is trained as the one-hop recipe that carries the fact
(`fact_diag`): rollout-state bridge init, value tokens weighted, constant lr.

    hop 1  planner rollout (frozen, memoised) -> planner->critic [state-bridge init, trained] -> critic, whose
           gold turn states the fact first ("x = 65. Write the value of x ..."). `--hop1_loss rollout`: the
           critic's m-step latent rollout from the message (graph kept) is trained so that its state t predicts
           gold token t, i.e. its latent thoughts walk "x = 65." as inference runs them; `teacher`: the
           critic's teacher-forced loss over its whole gold turn (its rollout then need not say the value)
    hop 2  critic rollout from the planner's message spliced into its prompt (what inference sends; frozen now,
           memoised) -> critic->solver [state-bridge init on those rollout states, trained] -> solver's loss

Then greedy decoding of the whole system through `runner.run_batch` (the inference path) on training questions
and both held-out splits (values seen in training / never seen): own latents, latents shuffled between
questions, and fresh links (as the plan built them). Also reports how often the critic's rollout "says" the
value (its argmax tokens over the m steps contain it) and linear probes of x from each message.
One process, no Ray; the pipeline's stage functions (`train.outer`) and bridge fit (`train.bridge`).

    PYTHONPATH=$PWD python -m jobs.experiments.two_hop_diag --m 6 --outer_steps 200 --num_eval 32

Diagnoses of hop 1 (each stops early): `--ceilings_only` (can the critic's rollout state the value at all: told
it in text, or sent the planner's argmax tokens as exact embeddings), `--stop_after_hop1_fit` (with the fitted,
untrained hop-1 link, and how close the link's output is to those exact embeddings on held-out questions).
`--role_model planner=pkg:gemma3-270m` swaps the planner's family (SmolLM2's rollout never states the value).
`--hop1_snap TAU` snaps hop 1's message into the critic's token embeddings (`links.SnapLink`), `--hop1_init
token_bridge` keeps the token bridge the plan built, `--hop1_steps 0` leaves hop 1 untrained, `--inner_cache`
keeps the inner links between runs. `--hop2_check` prints hop 2's ceilings (the solver's reply when its slot holds
the critic's rollout tokens exactly) and how often the hop-2 link picks those tokens, then stops; `--hop2_link
token` makes hop 2 a `links.TokenLink` (the critic's nearest token re-said in SmolLM2's embeddings, plus a trained
residual). The settings of the runs are in docs/learning_runs.md ("Two hops" sections), e.g. run F:

    PYTHONPATH=$PWD python -m jobs.experiments.two_hop_diag --m 6 --role_model planner=pkg:gemma3-270m \
        --inner_steps 300 --hop1_snap 0.02 --hop1_init token_bridge --hop1_steps 0 --hop2_link token \
        --outer_steps 200 --num_eval 32
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np
import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=6)
    ap.add_argument("--inner_steps", type=int, default=48)
    ap.add_argument("--outer_steps", type=int, default=200, help="per hop")
    ap.add_argument("--hop1_steps", type=int, default=None, help="hop 1's training steps (default --outer_steps)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--value_weight", type=float, default=5.0)
    ap.add_argument("--num_train", type=int, default=512)
    ap.add_argument("--num_eval", type=int, default=32)
    ap.add_argument("--num_bridge", type=int, default=512, help="training questions the bridge fits read")
    ap.add_argument("--hop1_loss", default="rollout", choices=("rollout", "teacher"),
                    help="rollout: the critic's m-step rollout from the message is trained to walk the first m "
                         "tokens of its gold turn; teacher: its teacher-forced loss over the whole gold turn")
    ap.add_argument("--role_model", action="append", default=[], metavar="ROLE=MODEL",
                    help="base model of a role instead of the demo preset's (planner SmolLM2, critic Gemma, "
                         "solver SmolLM2), e.g. --role_model planner=pkg:gemma3-270m")
    ap.add_argument("--ceilings_only", action="store_true",
                    help="after the inner links, print how often the critic's rollout states the value when the "
                         "fact is in its prompt as text, and when its slot holds the critic's embeddings of the "
                         "planner's rollout argmax tokens (a perfect hop-1 link), then stop")
    ap.add_argument("--bridge_ce_steps", type=int, default=0,
                    help="after each ridge state-bridge fit, this many full-batch steps on the fitted pairs with a "
                         "token-classification loss (cosine to every target token the pairs name, temperature "
                         "0.05) beside the regression, so digits stay apart (0: the ridge fit alone)")
    ap.add_argument("--bridge_blanks", action="store_true",
                    help="the state-bridge fits also pair states whose argmax text is blank (' ', '\\n'), which "
                         "the package's vocabulary_strings leaves out")
    ap.add_argument("--stop_after_hop1_fit", action="store_true",
                    help="print how often the critic's rollout states the value with the fitted hop-1 link, then stop")
    ap.add_argument("--hop2_check", action="store_true",
                    help="after hop 1 and hop 2's init, print hop 2's ceilings (the solver's reply with its slot "
                         "holding the critic's rollout argmax tokens as its embeddings, and told them in text) and "
                         "how often the hop-2 link's nearest solver token is that token, then stop")
    ap.add_argument("--hop1_snap", type=float, default=0.0, metavar="TAU",
                    help="hop 1's message is snapped to the critic's token embeddings: softmax over the cosines of "
                         "link(z) to every token's input embedding at temperature TAU, times that table (0: off)")
    ap.add_argument("--hop2_snap", type=float, default=0.0, metavar="TAU", help="the same for hop 2 (the solver's)")
    ap.add_argument("--hop1_link", default="outer", choices=("outer", "token"),
                    help="hop 1's link: the release's outer link (--hop1_init, --hop1_snap), or links.TokenLink "
                         "(temperature --hop1_snap, 0.02 when unset)")
    ap.add_argument("--hop2_link", default="outer", choices=("outer", "token"),
                    help="hop 2's link: the release's outer link (init by --hop2_init, snapped by --hop2_snap), or "
                         "links.TokenLink (the critic's nearest token re-said in the solver's embeddings, plus a "
                         "zero-initialised trained residual; --hop2_snap is its temperature, 0.02 when unset)")
    ap.add_argument("--hop2_init", default="state_bridge", choices=("state_bridge", "token_bridge"),
                    help="hop 2's link before training (as --hop1_init)")
    ap.add_argument("--hop1_init", default="state_bridge", choices=("state_bridge", "token_bridge"),
                    help="hop 1's link before training: the rollout-state ridge fit, or the token bridge as built")
    ap.add_argument("--inner_cache", default="", metavar="PATH",
                    help="load the planner's and critic's inner links from PATH if it exists (trained with the same "
                         "--seed, --inner_steps, --num_train and models, else refused), else save them there")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    import dataclasses

    from jobs.experiments import hop_by_hop
    from jobs.experiments.fact_diag import own_shuffled_fresh
    from jobs.experiments.sweep_recipe_measure import probe_x
    from jobs.experiments.two_hop_checks import (exact_embeddings, nearest_token_share, print_ceilings,
                                                 print_hop2_ceilings, states_value, token_classification_fit)
    from recmas_ray.links import SnapLink, init_bridge
    from recmas_ray.pool import LocalPool
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.bridge import bridge_outer_links, state_token_pairs, vocabulary_strings
    from recmas_ray.train.data import role_examples
    from recmas_ray.train.inner import inner_loss
    from recmas_ray.train.outer import Latent, emit_messages, encode_stage, prepare_samples
    from recmas_ray.train.synthetic_facts import split_by_value
    from recmas_ray.styles import build_schedule, render_prompt

    t0 = time.perf_counter()
    style_name, task, m = "sequential_light", "qa", args.m
    train, seen, unseen = split_by_value("recall", style_name, num_train=args.num_train, num_seen=args.num_eval,
                                         num_unseen=args.num_eval, seed=args.seed)
    role_models = dict(kv.split("=", 1) for kv in args.role_model)
    plan = plan_system(style_name, preset="demo", ckpt_override={}, seed=args.seed, task=task,
                       role_models=role_models)
    print(f"[2hop] models: {plan.role_models}", flush=True)
    inner_key = {"seed": args.seed, "inner_steps": args.inner_steps, "num_train": args.num_train,
                 "models": {r: plan.role_models[r] for r in ("planner", "critic")}}
    cached = {}
    if args.inner_cache and os.path.exists(args.inner_cache):
        saved = torch.load(args.inner_cache, weights_only=True)
        if saved.get("key") != inner_key:
            print(f"--inner_cache {args.inner_cache}: its inner links were trained with {saved.get('key')}, "
                  f"this run asks for {inner_key}; use another path", file=sys.stderr)
            return 2
        cached = saved["links"]
    bridge_outer_links(plan, ridge=1e-2)  # the token bridge, as the pipeline's default init: the "fresh" links
    pool = local_pool(plan, pool_cls=LocalPool)
    style = plan.style
    planner, critic, solver = (pool.services[r].agent for r in ("planner", "critic", "solver"))
    sched = build_schedule(style, 1)
    assert [s.role for s in sched] == ["planner", "critic", "solver"], sched
    slot_critic, slot_solver = sched[1].inputs[0][0], sched[2].inputs[0][0]
    e1, e2 = "planner->critic", "critic->solver"
    link1, link2 = planner.outer_links[e1], critic.outer_links[e2]
    fresh = {e: {k: v.detach().clone() for k, v in link.state_dict().items()} for e, link in ((e1, link1), (e2, link2))}
    rng = random.Random(args.seed)
    if args.hop1_snap and args.hop1_link == "outer":
        planner.outer_links[e1] = SnapLink(link1, critic.model.get_input_embeddings(), args.hop1_snap)
    def token_link(src, dst, tau):
        link, (src_ids, _) = hop_by_hop.token_link(src, dst, tau or 0.02)
        print(f"[2hop] {src.role}->{dst.role}: TokenLink over {len(src_ids)} shared tokens", flush=True)
        return link

    if args.hop1_link == "token":
        planner.outer_links[e1] = token_link(planner, critic, args.hop1_snap)
    if args.hop2_link == "token":
        critic.outer_links[e2] = token_link(critic, solver, args.hop2_snap)
    elif args.hop2_snap:
        critic.outer_links[e2] = SnapLink(link2, solver.model.get_input_embeddings(), args.hop2_snap)
    print(f"[2hop] loaded {time.perf_counter() - t0:.0f} s", flush=True)

    for agent in (planner, critic):  # the solver's inner link is unused at R = 1
        if agent.role in cached:
            agent.inner_link.load_state_dict(cached[agent.role])
            print(f"[2hop] inner {agent.role}: loaded from {args.inner_cache}", flush=True)
            continue
        pairs = role_examples(train, style, agent.role, task)
        link = agent.inner_link
        link.requires_grad_(True)
        opt = torch.optim.AdamW(link.parameters(), lr=3e-3)
        for s in range(args.inner_steps):
            loss = inner_loss(agent, rng.sample(pairs, 4))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(link.parameters(), 1.0)
            opt.step()
        print(f"[2hop] inner {agent.role}: last loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        link.requires_grad_(False)
    if args.inner_cache and not cached:
        torch.save({"key": inner_key, "links": {a.role: a.inner_link.state_dict() for a in (planner, critic)}},
                   args.inner_cache)

    samples = prepare_samples(train, style, task)
    kw = dict(task=task, num_rounds=1, max_latent_tokens=80, non_last_loss_weight=0.1)
    planner_cache: dict = {}

    def planner_z(batch):  # the planner's rollout (frozen, memoised per question)
        return encode_stage(planner, style, sched[0], batch, {}, batch_size=len(batch), rollout_latent_steps=m,
                            rollout_cache=planner_cache, **kw).z

    @torch.no_grad()
    def critic_rollout(batch):
        """(z_ND, h_ND) of the critic's m-step rollout with the planner's message in its slot (inference's)."""
        msg = emit_messages(planner, planner_z(batch), (e1,))[e1].reshape(len(batch), m, -1)
        users = [render_prompt(style, "critic", sched[1].variant, task, s.question) for s in batch]
        e_BLD, mask_BL = critic.embed_batch(users, {slot_critic: msg})
        h_ND = critic.latent_rollout(e_BLD, mask_BL, m).reshape(-1, critic.hidden_size)
        return critic.inner_link(h_ND), h_ND

    def says_value(rows, chunk=16):
        """How many rows' critic rollout argmax text (m tokens) contains the value, and one example."""
        hits, example = 0, ""
        for k in range(0, len(rows), chunk):
            ss = prepare_samples(rows[k:k + chunk], style, task)
            _, h_ND = critic_rollout(ss)
            ids = critic.logits(h_ND).argmax(-1).reshape(len(ss), m).tolist()
            for r, row_ids in zip(rows[k:k + chunk], ids):
                text = critic.tokenizer.decode(row_ids)
                hits += str(r["facts"]["fact"]) in text.replace(" ", "")
                example = example or f"{r['facts']['fact']}: {text!r}"
        return hits, example

    def probe(rows):
        ss = prepare_samples(rows, style, task)
        x = [r["facts"]["fact"] for r in rows]
        with torch.no_grad():
            z1 = emit_messages(planner, planner_z(ss), (e1,))[e1].reshape(len(ss), m, -1)
            z2 = emit_messages(critic, torch.cat([critic_rollout(ss[k:k + 16])[0] for k in range(0, len(ss), 16)]),
                               (e2,))[e2].reshape(len(ss), m, -1)
        return {e: probe_x(z.mean(1).float().numpy(), x) for e, z in ((e1, z1), (e2, z2))}

    def train_link(link, name, step_loss, num_steps):
        link.float().requires_grad_(True)
        opt = torch.optim.AdamW(link.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        order, t1 = list(range(len(samples))), time.perf_counter()
        per_epoch = len(order) // args.batch
        for s in range(num_steps):
            if s % per_epoch == 0:
                rng.shuffle(order)
            batch = [samples[i] for i in order[(s % per_epoch) * args.batch:][:args.batch]]
            enc = step_loss(batch)
            opt.zero_grad()
            enc.objective.backward()
            gn = torch.nn.utils.clip_grad_norm_(link.parameters(), 1.0)
            opt.step()
            if s % 20 == 0 or s == num_steps - 1:
                print(f"[2hop] {name} {s} loss {np.mean(enc.sample_losses):.3f} weighted {enc.objective.item():.3f} "
                      f"grad {gn:.2f} ({time.perf_counter() - t1:.0f} s)", flush=True)
        link.requires_grad_(False)

    def fit_state_bridge(link, name, states):
        """Ridge fit of `link` on (rollout latent z_t, target embedding of the source's argmax text at h_t)."""
        src, dst = name.split("->")
        src_agent, dst_agent = pool.services[src].agent, pool.services[dst].agent
        vocab = vocabulary_strings(dst_agent.tokenizer)
        if args.bridge_blanks:
            tok = dst_agent.tokenizer
            for i in range(len(tok)):
                text = tok.decode([i])
                if text and not text.strip() and i not in tok.all_special_ids and text not in vocab:
                    vocab[text] = i
        xs, ids, num = [], [], 0
        for z_ND, h_ND in states:
            x_KD, keep_ids = state_token_pairs(src_agent, z_ND, h_ND, vocab)
            xs.append(x_KD)
            ids += keep_ids
            num += len(h_ND)
        emb = dst_agent.model.get_input_embeddings()
        with torch.no_grad():
            y_NE = emb(torch.tensor(ids)).float()
            x_ND = torch.cat(xs)
            init_bridge(link, x_ND, y_NE, ridge=1e-2)
        print(f"[2hop] state bridge {name}: {len(ids)} of {num} rollout states", flush=True)
        if args.bridge_ce_steps:
            token_classification_fit(link, x_ND, torch.tensor(ids), emb, args.bridge_ce_steps, name)

    bridge_ss = samples[:args.num_bridge]

    @torch.no_grad()
    def planner_states():
        for k in range(0, len(bridge_ss), 16):
            ss = bridge_ss[k:k + 16]
            users = [render_prompt(style, "planner", sched[0].variant, task, s.question) for s in ss]
            e_BLD, mask_BL = planner.embed_batch(users)
            h_ND = planner.latent_rollout(e_BLD, mask_BL, m).reshape(-1, planner.hidden_size)
            yield planner.inner_link(h_ND), h_ND

    with torch.no_grad():  # does the planner's own rollout state the value (what hop 1 can pass on)?
        rows = seen[:32]
        ss = prepare_samples(rows, style, task)
        users = [render_prompt(style, "planner", sched[0].variant, task, s.question) for s in ss]
        h_ND = planner.latent_rollout(*planner.embed_batch(users), m).reshape(-1, planner.hidden_size)
        print(f"[2hop] planner rollout says the value: {states_value(planner, h_ND, rows, m)}", flush=True)
    print(f"[2hop] critic rollout says the value (fresh links): {says_value(seen[:32])}", flush=True)
    if args.ceilings_only:
        print_ceilings(planner, critic, style, sched, task, m, seen[:32])
        return 0
    # ---- hop 1: planner -> critic, on the critic's own teacher-forced loss over its gold turn
    if args.hop1_init == "state_bridge":
        fit_state_bridge(link1, e1, planner_states())
    if args.stop_after_hop1_fit:
        print(f"[2hop] critic rollout says the value (hop-1 link fitted, untrained): {says_value(seen[:32])}",
              flush=True)
        with torch.no_grad():  # held-out: the fitted link's output vs the critic's embedding of the planner's argmax
            ss = prepare_samples(seen[:32], style, task)
            users = [render_prompt(style, "planner", sched[0].variant, task, s.question) for s in ss]
            h_ND = planner.latent_rollout(*planner.embed_batch(users), m).reshape(-1, planner.hidden_size)
            z_ND = planner.inner_link(h_ND)
            exact, texts = exact_embeddings(planner, critic, h_ND)
            exact = exact.float()
            cos = {name: torch.nn.functional.cosine_similarity(v.float(), exact, dim=-1).reshape(len(ss), m).mean(0)
                   for name, v in (("link(z)", link1(z_ND)), ("message", planner.outer_links[e1](z_ND)),
                                   ("z itself", z_ND))}
            for name, v in (("message", planner.outer_links[e1](z_ND)), ("z itself", z_ND)):
                print(f"[2hop] held-out: {name}'s nearest critic token is the planner's argmax, per step: "
                      f"{nearest_token_share(v, exact, critic.model.get_input_embeddings(), m)}", flush=True)
            print(f"[2hop] held-out cosine to the critic's embedding of the planner's argmax, per rollout step "
                  f"({texts[:m]}): " + "; ".join(f"{k} {[round(float(c), 3) for c in v]}" for k, v in cos.items()),
                  flush=True)
        return 0
    as_decoder = dataclasses.replace(style, decoder="critic")

    def hop1_rollout_loss(batch):
        """CE of the critic's rollout logits at each of its m steps against its gold turn's first m tokens
        (state t predicts gold token t: the inner link maps h_t to the embedding of token t + 1), value x w."""
        from recmas_ray.train.outer import Encoded, value_token_weights

        msg = emit_messages(planner, planner_z(batch), (e1,))[e1].reshape(len(batch), m, -1)
        users = [render_prompt(style, "critic", sched[1].variant, task, s.question) for s in batch]
        e_BLD, mask_BL = critic.embed_batch(users, {slot_critic: msg})
        h_BMD = critic.latent_rollout_with_grad(e_BLD, mask_BL, m)
        gold = [critic.tokenizer(s.targets["critic"], add_special_tokens=False).input_ids[:m] for s in batch]
        n = min(len(g) for g in gold)
        gold_BM = torch.tensor([g[:n] for g in gold])
        nll_BM = torch.nn.functional.cross_entropy(critic.logits(h_BMD[:, :n]).float().flatten(0, 1),
                                                   gold_BM.flatten(), reduction="none").reshape(len(batch), n)
        w_BM = value_token_weights(critic.tokenizer, gold_BM.flatten().tolist(), args.value_weight).reshape(len(batch), n)
        objective = (nll_BM * w_BM).sum() / w_BM.sum()
        return Encoded(None, [], objective, [float(x) for x in nll_BM.mean(1).detach()], [False] * len(batch))

    def hop1_loss(batch):
        if args.hop1_loss == "rollout":
            return hop1_rollout_loss(batch)
        msg = emit_messages(planner, planner_z(batch), (e1,))[e1]
        return encode_stage(critic, as_decoder, sched[1], batch, {slot_critic: Latent(msg, [m] * len(batch))},
                            batch_size=len(batch), value_token_weight=args.value_weight, **kw)

    print(f"[2hop] hop 1 trains on {args.hop1_loss}; critic gold tokens of one row: "
          f"{[critic.tokenizer.decode([t]) for t in critic.tokenizer(samples[0].targets['critic'], add_special_tokens=False).input_ids[:m]]}",
          flush=True)
    train_link(planner.outer_links[e1] if args.hop1_link == "token" else link1, "hop1", hop1_loss,
               args.outer_steps if args.hop1_steps is None else args.hop1_steps)
    print(f"[2hop] critic rollout says the value (after hop 1): seen {says_value(seen)}, unseen "
          f"{says_value(unseen)}", flush=True)

    # ---- hop 2: critic -> solver, on the solver's loss; the critic's rollout is frozen now: memoise it
    critic_cache: dict[str, torch.Tensor] = {}

    def critic_z(batch):
        todo = [s for s in batch if s.sample_id not in critic_cache]
        if todo:
            z = critic_rollout(todo)[0].reshape(len(todo), m, -1)
            critic_cache.update({s.sample_id: z[i] for i, s in enumerate(todo)})
        return torch.cat([critic_cache[s.sample_id] for s in batch])

    if args.hop2_init == "state_bridge" and args.hop2_link == "outer":
        fit_state_bridge(link2, e2, (critic_rollout(bridge_ss[k:k + 16]) for k in range(0, len(bridge_ss), 16)))
    if args.hop2_check:
        for split, rows in (("seen", seen), ("unseen", unseen)):
            print(f"[2hop] {split}:", flush=True)
            print_hop2_ceilings(critic, solver, style, sched, task, m, rows, critic_rollout, critic.outer_links[e2])
        return 0

    def hop2_loss(batch):
        msg = emit_messages(critic, critic_z(batch), (e2,))[e2]
        return encode_stage(solver, style, sched[2], batch, {slot_solver: Latent(msg, [m] * len(batch))},
                            batch_size=len(batch), value_token_weight=args.value_weight, **kw)

    hop2_sent = critic.outer_links[e2]
    train_link(hop2_sent if args.hop2_link == "token" else link2, "hop2", hop2_loss, args.outer_steps)
    print(f"[2hop] probe R^2 of x from each message (128 training rows): {probe(train[:128])}", flush=True)

    def restore_fresh():  # the links as the plan built them (the token bridge), unsnapped
        link1.load_state_dict(fresh[e1])
        link2.load_state_dict(fresh[e2])
        planner.outer_links[e1], critic.outer_links[e2] = link1, link2

    own_shuffled_fresh(pool, style, task, m, (("train", train[:16]), ("seen", seen), ("unseen", unseen)),
                       restore_fresh, tag="2hop")
    print(f"[2hop] total {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
