"""Hop-by-hop training with token links: the recipe that carries a fact across two hops.

Any style at R = 1 whose decoder decodes last and reads latents (sequential_light: planner -> critic -> solver;
distillation: expert -> learner; mixture: three experts -> summarizer). Every edge gets a `links.TokenLink` (the
sender's latent read off as its nearest shared token, re-said in the receiver's embeddings, plus a residual that
starts at zero). Edges between earlier stages stay untrained (the pure translation); the edges into the decoder
are trained on the decoder's loss with value tokens weighted, given what inference sends them: every earlier
stage's m-step latent rollout from the messages it received, frozen and memoised per question
(`sender_latents`). Non-reference throughout.

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

from recmas_ray.styles.base import split_edge

LINKS_FILE = "links.pt"


def decoder_edges(style, sched) -> list[str]:
    """The edges into the decoder (the ones trained) of a one-round schedule (each role once) whose decoder is
    its last step and reads latents; ValueError for anything else (e.g. R = 2)."""
    roles = [s.role for s in sched]
    if roles[-1] != style.decoder or len(set(roles)) != len(roles) or not sched[-1].inputs:
        raise ValueError(f"hop-by-hop training needs one round with the decoder last and reading latents, got "
                         f"steps {roles}")
    return [edge for _, edge in sched[-1].inputs]


def token_link(src, dst, tau: float, ids: tuple[list[int], list[int]] | None = None):
    """A `TokenLink` from agent `src` to agent `dst` over the tokens both vocabularies write the same (blanks
    included), with its (source ids, target ids)."""
    from recmas_ray.links import TokenLink
    from recmas_ray.train.bridge import shared_token_pairs

    src_ids, dst_ids = ids or shared_token_pairs(src.tokenizer, dst.tokenizer, max_pairs=None, blanks=True)
    with torch.no_grad():
        link = TokenLink(src.model.get_input_embeddings()(torch.tensor(src_ids, device=src.device)),
                         dst.model.get_input_embeddings()(torch.tensor(dst_ids, device=dst.device)), tau,
                         ids=(src_ids, dst_ids))
    return link.to(src.device), (list(src_ids), list(dst_ids))


def attach(pool, saved: dict) -> None:
    """Attach the token links of a `links.pt` (as `load`ed) to the pool's in-process agents."""
    agents = {r: svc.agent for r, svc in pool.services.items()}
    for edge, entry in saved.items():
        src, dst = split_edge(edge)
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


def sender_latents(agents: dict, style, sched, task: str, m: int, samples) -> dict[str, torch.Tensor]:
    """edge into the decoder -> [B * m, D] latents (after its sender's inner link) for `samples`, as inference
    computes them: each earlier stage's m-step latent rollout from its prompt with the messages it received
    spliced into its slots, sent on through the agents' outer links."""
    from recmas_ray.styles import render_prompt

    into_decoder, msgs, out = set(decoder_edges(style, sched)), {}, {}
    with torch.no_grad():
        for step in sched[:-1]:
            agent = agents[step.role]
            users = [render_prompt(style, step.role, step.variant, task, s.question) for s in samples]
            e_BLD, mask_BL = agent.embed_batch(users, {slot: msgs[edge] for slot, edge in step.inputs})
            z_ND = agent.inner_link(agent.latent_rollout(e_BLD, mask_BL, m).reshape(-1, agent.hidden_size))
            for edge in step.outputs:
                if edge in into_decoder:
                    out[edge] = z_ND
                else:
                    msgs[edge] = agent.outer_links[edge](z_ND).reshape(len(samples), m, -1)
    return out


def train(pool, style, train_rows: list[dict], *, task: str, m: int, steps: int, batch_size: int, lr: float,
          value_weight: float, tau: float, seed: int, save_dir: Path, log=print) -> dict:
    """Token links on every edge, those into the decoder trained; writes <save_dir>/links.pt and log.json, returns
    {"links": (as `load`), "log": per-step losses}. With a links.pt already there (an earlier run that stopped
    before its measurement), that is loaded instead of training again."""
    from recmas_ray.styles import build_schedule
    from recmas_ray.train.outer import Latent, encode_stage, prepare_samples

    save_dir = Path(save_dir)
    if (save_dir / LINKS_FILE).exists():
        saved = load(save_dir / LINKS_FILE)
        attach(pool, saved)
        return {"links": saved, "log": json.loads((save_dir / "log.json").read_text())}
    agents = {r: svc.agent for r, svc in pool.services.items()}
    sched = build_schedule(style, 1)
    trained = decoder_edges(style, sched)
    edges = [e for step in sched[:-1] for e in step.outputs]
    ids = {}
    for edge in edges:
        src, dst = split_edge(edge)
        agents[src].outer_links[edge], ids[edge] = token_link(agents[src], agents[dst], tau)
        agents[src].outer_links[edge].requires_grad_(False)  # frozen unless it feeds the decoder (below)
        log(f"[hop-by-hop] {edge}: token link over {len(ids[edge][0])} shared tokens"
            f"{', trained' if edge in trained else ', untrained (the pure translation)'}")
    decoder = agents[style.decoder]
    sent = {e: agents[split_edge(e)[0]].outer_links[e] for e in edges}  # edge -> its token link
    links = {e: sent[e] for e in trained}
    samples = prepare_samples(train_rows, style, task)
    memo: dict[str, dict[str, torch.Tensor]] = {}  # the frozen earlier stages' latents, per question

    def latents_of(batch) -> dict[str, torch.Tensor]:
        todo = [s for s in batch if s.sample_id not in memo]
        if todo:
            got = sender_latents(agents, style, sched, task, m, todo)
            for i, s in enumerate(todo):
                memo[s.sample_id] = {e: z.reshape(len(todo), m, -1)[i] for e, z in got.items()}
        return {e: torch.cat([memo[s.sample_id][e] for s in batch]) for e in trained}

    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = []
    for link in links.values():
        params += list(link.float().requires_grad_(True).parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    order, per_epoch, t0, history = list(range(len(samples))), max(1, len(samples) // batch_size), time.perf_counter(), []
    for step in range(steps):
        if step % per_epoch == 0:
            rng.shuffle(order)
        batch = [samples[i] for i in order[(step % per_epoch) * batch_size:][:batch_size]]
        z = latents_of(batch)
        received = {slot: Latent(links[edge](z[edge]), [m] * len(batch)) for slot, edge in sched[-1].inputs}
        enc = encode_stage(decoder, style, sched[-1], batch, received, batch_size=len(batch),
                           value_token_weight=value_weight, task=task, num_rounds=1,
                           max_latent_tokens=max(80, m), non_last_loss_weight=0.1)
        opt.zero_grad()
        enc.objective.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append({"step": step, "loss": float(sum(enc.sample_losses) / len(enc.sample_losses)),
                        "objective": float(enc.objective.detach())})
        if step % max(1, steps // 8) == 0 or step == steps - 1:
            log(f"[hop-by-hop] {', '.join(trained)} step {step} loss {history[-1]['loss']:.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
    for link in links.values():
        link.requires_grad_(False)
    saved = {e: {"residual.weight": sent[e].residual.weight.detach().cpu().clone(),
                 "residual.bias": sent[e].residual.bias.detach().cpu().clone(),
                 "source_ids": torch.tensor(ids[e][0]), "target_ids": torch.tensor(ids[e][1]),
                 "tau": torch.tensor(float(tau))} for e in edges}
    save_dir.mkdir(parents=True, exist_ok=True)
    (save_dir / "log.json").write_text(json.dumps(history))
    save_product_checkpoint(save_dir, {e: sent[e] for e in edges}, agents, style, task=task,
                            settings={"trainer": "hop_by_hop", "steps": steps, "batch_size": batch_size, "lr": lr,
                                      "value_weight": value_weight, "tau": tau, "seed": seed, "latent_steps": m})
    torch.save(saved, save_dir / LINKS_FILE)  # last: its presence means the training finished
    return {"links": saved, "log": history}


def save_product_checkpoint(save_dir: Path, links: dict, agents: dict, style, *, task: str, settings: dict) -> Path:
    """The token links as the product's outer checkpoint (links.safetensors + manifest.json, each link's kind and
    arguments named), so `--ckpt_override outer=SAVE_DIR` / `--links` load them in jobs.run, jobs.serve and the
    API; the manifest records the task and prompts they were trained with."""
    from recmas_ray.styles.prompts import prompt_set_hash
    from recmas_ray.system.checkpoints import LinkSet, save_links

    from recmas_ray.system.provenance import write_provenance

    roles = {r: {"base_model": a.model_name, "hidden_size": a.hidden_size} for r, a in agents.items()}
    save_links(save_dir, LinkSet(outer=dict(links)),
                      {"kind": "outer", "style": style.name, "roles": roles, "edges": list(style.edges),
                       "task": task, "prompt_set_hash": prompt_set_hash(style),
                       "train_config": {"task": task, **settings}})
    return write_provenance(save_dir, config={"task": task, **settings}, kind="outer").parent
