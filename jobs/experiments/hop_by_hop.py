"""Hop-by-hop training of a chain's links as token links: the recipe that carries a fact across two hops.

A chain style (sequential_light: planner -> critic -> solver; distillation: expert -> learner) at R = 1. Every
edge gets a `links.TokenLink` (the sender's latent read off as its nearest shared token, re-said in the
receiver's embeddings, plus a residual that starts at zero). The edges before the last stay untrained (the pure
translation); the last edge, into the decoder, is trained on the decoder's loss with value tokens weighted,
given what inference sends it: every earlier stage's m-step latent rollout from the message it received,
frozen and memoised per question (`chain_latents`). Non-reference throughout.

Why (docs/learning_runs.md, "Hop 2 carries the fact"): training both outer links end to end through the solver's
loss left the fact in the middle agent; a regression link across families picks the right digit for 16-63% of
rollout steps, and a critic fed such a message writes the same value for every question. Token links pass
near-exact token embeddings at each hop: run F, 57/64 held-out own vs 4/64 shuffled vs 0/64 fresh.

Used by `jobs.experiments.sweep_recipe` (recipe `token_hop_by_hop_r1`) and so by the main job's sequential
fact tasks. The trained links are saved as `links.pt` (residuals, token ids, temperature; the tables are the
agents' own embeddings, bound again by `attach`), loadable with `weights_only=True`.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

LINKS_FILE = "links.pt"


def chain_edges(style, sched) -> list[str]:
    """"sender->receiver" of each hop of a chain schedule (each stage after the first reads the one before it
    through one slot; the last stage decodes); ValueError otherwise."""
    edges = []
    for prev, step in zip(sched, sched[1:]):
        if len(step.inputs) != 1:
            raise ValueError(f"hop-by-hop training needs a chain: stage {step.role} reads {len(step.inputs)} slots")
        edges.append(f"{prev.role}->{step.role}")
    if sched[-1].role != style.decoder:
        raise ValueError(f"hop-by-hop training needs the decoder last, got {[s.role for s in sched]}")
    return edges


def token_link(src, dst, tau: float, ids: tuple[list[int], list[int]] | None = None):
    """A `TokenLink` from agent `src` to agent `dst` over the tokens both vocabularies write the same (blanks
    included), with its (source ids, target ids)."""
    from recmas_ray.links import TokenLink
    from recmas_ray.train.bridge import shared_token_pairs

    src_ids, dst_ids = ids or shared_token_pairs(src.tokenizer, dst.tokenizer, max_pairs=None, blanks=True)
    with torch.no_grad():
        link = TokenLink(src.model.get_input_embeddings()(torch.tensor(src_ids, device=src.device)),
                         dst.model.get_input_embeddings()(torch.tensor(dst_ids, device=dst.device)), tau)
    return link.to(src.device), (list(src_ids), list(dst_ids))


def attach(pool, saved: dict) -> None:
    """Attach the token links of a `links.pt` (as `load`ed) to the pool's in-process agents."""
    agents = {r: svc.agent for r, svc in pool.services.items()}
    for edge, entry in saved.items():
        src, dst = edge.split("->")
        link, _ = token_link(agents[src], agents[dst], float(entry["tau"]),
                             (entry["source_ids"].tolist(), entry["target_ids"].tolist()))
        link.residual.load_state_dict({"weight": entry["residual.weight"], "bias": entry["residual.bias"]})
        agents[src].outer_links[edge] = link


def load(path: Path) -> dict:
    """A `links.pt`: edge -> residual weights, token ids and temperature (untrusted input: tensors only)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    need = {"residual.weight", "residual.bias", "source_ids", "target_ids", "tau"}
    for edge, entry in saved.items():
        if not isinstance(entry, dict) or set(entry) != need:
            raise ValueError(f"{path}: entry {edge!r} should hold exactly {sorted(need)}")
    return saved


def chain_latents(agents: dict, style, sched, task: str, m: int, samples) -> torch.Tensor:
    """[B * m, D] latents (after its inner link) of the stage before the decoder, for `samples`, as inference
    computes them: each earlier stage's m-step latent rollout from its prompt with the message it received
    spliced into its slot, sent on through the pool's outer link of that edge."""
    from recmas_ray.styles import render_prompt

    msg, edges = None, chain_edges(style, sched)
    with torch.no_grad():
        for k, step in enumerate(sched[:-1]):
            agent = agents[step.role]
            users = [render_prompt(style, step.role, step.variant, task, s.question) for s in samples]
            e_BLD, mask_BL = agent.embed_batch(users, {step.inputs[0][0]: msg} if msg is not None else {})
            z_ND = agent.inner_link(agent.latent_rollout(e_BLD, mask_BL, m).reshape(-1, agent.hidden_size))
            if k < len(sched) - 2:
                msg = agent.outer_links[edges[k]](z_ND).reshape(len(samples), m, -1)
    return z_ND


def train(pool, style, train_rows: list[dict], *, task: str, m: int, steps: int, batch_size: int, lr: float,
          value_weight: float, tau: float, seed: int, save_dir: Path, log=print) -> dict:
    """Token links on every hop, the last one trained; writes <save_dir>/links.pt and log.json, returns
    {"links": (as `load`), "log": per-step losses}. With a links.pt already there (an earlier run that stopped
    before its measurement), that is loaded instead of training again."""
    from recmas_ray.styles import build_schedule
    from recmas_ray.train.outer import Latent, emit_messages, encode_stage, prepare_samples

    save_dir = Path(save_dir)
    if (save_dir / LINKS_FILE).exists():
        saved = load(save_dir / LINKS_FILE)
        attach(pool, saved)
        return {"links": saved, "log": json.loads((save_dir / "log.json").read_text())}
    agents = {r: svc.agent for r, svc in pool.services.items()}
    sched = build_schedule(style, 1)
    edges = chain_edges(style, sched)
    ids = {}
    for edge in edges:
        src, dst = edge.split("->")
        agents[src].outer_links[edge], ids[edge] = token_link(agents[src], agents[dst], tau)
        log(f"[hop-by-hop] {edge}: token link over {len(ids[edge][0])} shared tokens")
    last, sender, decoder = edges[-1], agents[sched[-2].role], agents[sched[-1].role]
    link = sender.outer_links[last]
    samples = prepare_samples(train_rows, style, task)
    memo: dict[str, torch.Tensor] = {}  # the frozen earlier stages' latents, per question

    def latents_of(batch):
        todo = [s for s in batch if s.sample_id not in memo]
        if todo:
            z = chain_latents(agents, style, sched, task, m, todo).reshape(len(todo), m, -1)
            memo.update({s.sample_id: z[i] for i, s in enumerate(todo)})
        return torch.cat([memo[s.sample_id] for s in batch])

    torch.manual_seed(seed)
    rng = random.Random(seed)
    link.float().requires_grad_(True)
    opt = torch.optim.AdamW(link.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    order, per_epoch, t0, history = list(range(len(samples))), max(1, len(samples) // batch_size), time.perf_counter(), []
    slot = sched[-1].inputs[0][0]
    for step in range(steps):
        if step % per_epoch == 0:
            rng.shuffle(order)
        batch = [samples[i] for i in order[(step % per_epoch) * batch_size:][:batch_size]]
        msg = emit_messages(sender, latents_of(batch), (last,))[last]
        enc = encode_stage(decoder, style, sched[-1], batch, {slot: Latent(msg, [m] * len(batch))},
                           batch_size=len(batch), value_token_weight=value_weight, task=task, num_rounds=1,
                           max_latent_tokens=max(80, m), non_last_loss_weight=0.1)
        opt.zero_grad()
        enc.objective.backward()
        torch.nn.utils.clip_grad_norm_(link.parameters(), 1.0)
        opt.step()
        history.append({"step": step, "loss": float(sum(enc.sample_losses) / len(enc.sample_losses)),
                        "objective": float(enc.objective.detach())})
        if step % max(1, steps // 8) == 0 or step == steps - 1:
            log(f"[hop-by-hop] {last} step {step} loss {history[-1]['loss']:.3f} ({time.perf_counter() - t0:.0f} s)")
    link.requires_grad_(False)
    saved = {e: {"residual.weight": agents[e.split("->")[0]].outer_links[e].residual.weight.detach().cpu().clone(),
                 "residual.bias": agents[e.split("->")[0]].outer_links[e].residual.bias.detach().cpu().clone(),
                 "source_ids": torch.tensor(ids[e][0]), "target_ids": torch.tensor(ids[e][1]),
                 "tau": torch.tensor(float(tau))} for e in edges}
    save_dir.mkdir(parents=True, exist_ok=True)
    (save_dir / "log.json").write_text(json.dumps(history))
    torch.save(saved, save_dir / LINKS_FILE)  # last: its presence means the training finished
    return {"links": saved, "log": history}
