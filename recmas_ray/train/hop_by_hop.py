"""Hop-by-hop outer training (`--schedule hop_by_hop`, non-reference): the numerics, the `links.pt` file and the
single-process reference loop. The Ray Train job that runs it lives in `hop_by_hop_job.py`.

Any style at R = 1 whose decoder runs last and reads latents (sequential_light: planner -> critic -> solver;
distillation: expert -> learner; mixture: three experts -> summarizer). Every edge gets a `links.TokenLink`
(the sender's latent read off as its nearest shared token, re-said in the receiver's embeddings, plus a
residual that starts at zero). Edges between earlier stages stay untrained (the pure translation); the edges
into the decoder train on the decoder's loss (value tokens weighted) given what inference sends them: every
earlier stage's m-step latent rollout from the messages it received (`sender_latents`). Those stages, their
links and their inputs are all frozen, so each question's rollouts never change: they are computed once, the
first time a question is drawn (each step's new questions together), and memoised.

    step s   batch = rows of step s          z_e = memo[question]  (edge e into the decoder, [m, D_src])
             loss  = decoder CE(gold answer | prompt with link_e(z_e) spliced into e's slot), value tokens x w
             AdamW on the residuals of the links into the decoder, global clip, LR schedule

Why (docs/learning_runs.md, "Hop 2 carries the fact"): training both outer links end to end through the solver's
loss left the fact in the middle agent; a regression link across families picks the right digit for 16-63% of
rollout steps, and a critic fed such a message writes the same value for every question. Token links pass
near-exact token embeddings at each hop: run F, 57/64 held-out own vs 4/64 shuffled vs 0/64 fresh.

`links.pt` (what `save_links_file` writes, `load` reads with `weights_only=True`): edge -> residual weight and
bias, source and target token ids, temperature; the tables are the agents' own embeddings, bound again by
`attach`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from recmas_ray.engine.links import TokenLink
from recmas_ray.styles import build_schedule, render_prompt, split_edge
from recmas_ray.system.checkpoints import LinkSet, save_links
from recmas_ray.train.bridge import shared_token_pairs
from recmas_ray.train.core import make_scheduler
from recmas_ray.train.outer import Latent, encode_stage

LINKS_FILE = "links.pt"
LOG_FILE = "log.json"
ENTRY_KEYS = ("residual.weight", "residual.bias", "source_ids", "target_ids", "tau")


def decoder_edges(style, sched) -> list[str]:
    """The edges into the decoder (the ones trained) of a one-round schedule (each role once) whose decoder is
    its last step and reads latents; ValueError for anything else (e.g. R = 2)."""
    roles = [s.role for s in sched]
    if roles[-1] != style.decoder or len(set(roles)) != len(roles) or not sched[-1].inputs:
        raise ValueError(f"hop-by-hop training needs one round with the decoder last and reading latents, got "
                         f"steps {roles}")
    return [edge for _, edge in sched[-1].inputs]


def sent_edges(sched) -> list[str]:
    """Every edge an earlier stage sends on (each gets a token link), in schedule order."""
    return [e for step in sched[:-1] for e in step.outputs]


def token_link(src, dst, tau: float, ids: tuple[list[int], list[int]] | None = None):
    """A `TokenLink` from agent `src` to agent `dst` over the tokens both vocabularies write the same (blanks
    included), with its (source ids, target ids)."""
    src_ids, dst_ids = ids or shared_token_pairs(src.tokenizer, dst.tokenizer, max_pairs=None, blanks=True)
    link = token_link_of(embedding_rows(src, src_ids), embedding_rows(dst, dst_ids), tau, (src_ids, dst_ids))
    return link.to(src.device), (list(src_ids), list(dst_ids))


def embedding_rows(agent, ids: list[int]) -> torch.Tensor:
    """The agent's input embeddings (its module's own scaling included) of `ids`, fp32 on the CPU."""
    with torch.no_grad():
        return agent.model.get_input_embeddings()(torch.tensor(ids, device=agent.device)).float().cpu()


def token_link_of(source_rows_KD: torch.Tensor, target_rows_KE: torch.Tensor, tau: float,
                  ids: tuple[list[int], list[int]]):
    """A fresh `TokenLink` (residual zero) over paired embedding rows of the token `ids` (source, target)."""
    return TokenLink(source_rows_KD, target_rows_KE, tau, ids=ids)


def links_entry(link, ids: tuple[list[int], list[int]], tau: float) -> dict:
    """One edge's `links.pt` entry."""
    return {"residual.weight": link.residual.weight.detach().cpu().clone(),
            "residual.bias": link.residual.bias.detach().cpu().clone(),
            "source_ids": torch.tensor(ids[0]), "target_ids": torch.tensor(ids[1]), "tau": torch.tensor(float(tau))}


def save_links_file(save_dir: Path, saved: dict, log: list) -> Path:
    """<save_dir>/log.json, then <save_dir>/links.pt last: its presence means the training finished."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    (save_dir / LOG_FILE).write_text(json.dumps(log))
    torch.save(saved, save_dir / LINKS_FILE)
    return save_dir / LINKS_FILE


def save_product_checkpoint(save_dir: Path, saved: dict, manifest: dict, hidden_sizes: dict[str, int]) -> Path:
    """The `links.pt` entries as the product's outer checkpoint too (links.safetensors + manifest.json, each link's
    kind and arguments named; the tables are never saved), so `--ckpt_override outer=SAVE_DIR` / `--links` load
    them in jobs.run, jobs.serve and the API. `manifest`: the system's, with the task and training config. Each
    link is the one `attach` builds (tau as links.pt holds it, in float32), so the checkpoint runs what the sweep
    measured."""
    links = {}
    for edge, entry in saved.items():
        src, dst = split_edge(edge)
        link = TokenLink(None, None, float(entry["tau"]), ids=(entry["source_ids"], entry["target_ids"]),
                         dims=(hidden_sizes[src], hidden_sizes[dst]))
        link.residual.load_state_dict({"weight": entry["residual.weight"], "bias": entry["residual.bias"]})
        links[edge] = link
    return save_links(save_dir, LinkSet(outer=links), {**manifest, "kind": "outer"})


def attach(pool, saved: dict) -> None:
    """Attach the token links of a `links.pt` (as `load`ed) to the pool's in-process agents."""
    agents = {r: svc.agent for r, svc in pool.services.items()}
    for edge, entry in saved.items():
        src, dst = split_edge(edge)
        link, _ = token_link(agents[src], agents[dst], float(entry["tau"]),
                             (entry["source_ids"].tolist(), entry["target_ids"].tolist()))
        link.residual.load_state_dict({"weight": entry["residual.weight"], "bias": entry["residual.bias"]})
        agents[src].outer_links[edge] = link.requires_grad_(False)


def load(path: Path) -> dict:
    """A `links.pt`: edge -> residual weights, token ids and temperature (untrusted input: tensors only)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    for edge, entry in saved.items():
        if not isinstance(entry, dict) or set(entry) != set(ENTRY_KEYS):
            raise ValueError(f"{path}: entry {edge!r} should hold exactly {sorted(ENTRY_KEYS)}")
    return saved


@torch.no_grad()
def stage_states(agent, style, step, task: str, m: int, questions: list[str],
                 received: dict[str, torch.Tensor]) -> torch.Tensor:
    """h [B * m, D]: one earlier stage's m-step latent rollout from its prompts with `received` (slot ->
    [B, m, E]) spliced into its slots, before its inner link (a state-bridge fit reads tokens off these)."""
    users = [render_prompt(style, step.role, step.variant, task, q) for q in questions]
    e_BLD, mask_BL = agent.embed_batch(users, received)
    return agent.latent_rollout(e_BLD, mask_BL, m).reshape(-1, agent.hidden_size)


def stage_rollout(agent, style, step, task: str, m: int, questions: list[str],
                  received: dict[str, torch.Tensor]) -> torch.Tensor:
    """z [B * m, D]: `stage_states` after the stage's inner link: what inference sends on."""
    return agent.inner_link(stage_states(agent, style, step, task, m, questions, received))


@torch.no_grad()
def send_on(link, z_ND: torch.Tensor, num_questions: int, m: int) -> torch.Tensor:
    """An untrained edge's message [B, m, E]: its token link applied to the sender's z."""
    return link(z_ND).reshape(num_questions, m, -1)


def sender_latents(agents: dict, style, sched, task: str, m: int, samples) -> dict[str, torch.Tensor]:
    """edge into the decoder -> [B * m, D] latents (after its sender's inner link) for `samples`, as inference
    computes them: each earlier stage's rollout (`stage_rollout`), sent on through the agents' outer links."""
    into_decoder, msgs, out = set(decoder_edges(style, sched)), {}, {}
    for step in sched[:-1]:
        z_ND = stage_rollout(agents[step.role], style, step, task, m, [s.question for s in samples],
                             {slot: msgs[edge] for slot, edge in step.inputs})
        for edge in step.outputs:
            if edge in into_decoder:
                out[edge] = z_ND
            else:
                msgs[edge] = send_on(agents[step.role].outer_links[edge], z_ND, len(samples), m)
    return out


def new_rows_per_step(batches: list[list[int]]) -> list[list[int]]:
    """Per step, the rows drawn for the first time (in batch order): whose rollouts that step computes."""
    seen: set[int] = set()
    out = []
    for batch in batches:
        new = [i for i in dict.fromkeys(batch) if i not in seen]
        seen.update(new)
        out.append(new)
    return out


class DecoderTrainer:
    """The trained half: the links into the decoder (fp32), AdamW, the schedule, one step on memoised latents.
    The reference loop and the Ray Train decoder worker both step through this one class."""

    def __init__(self, cfg, style, decoder, links: dict, *, m: int):
        self.cfg, self.style, self.decoder, self.links, self.m = cfg, style, decoder, links, m
        self.step_def = build_schedule(style, 1)[-1]
        self.params = []
        for link in links.values():
            self.params += list(link.float().requires_grad_(True).parameters())
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.sched = make_scheduler(self.opt, cfg)
        self.memo: dict[int, dict[str, torch.Tensor]] = {}
        """row index -> edge into the decoder -> [m, D_src]: the frozen earlier stages' latents."""

    def remember(self, rows: list[int], z: dict[str, torch.Tensor]) -> None:
        """Keep the latents (edge -> [len(rows) * m, D]) of `rows`, computed together."""
        for i, r in enumerate(rows):
            self.memo[r] = {e: zz.reshape(len(rows), self.m, -1)[i] for e, zz in z.items()}

    def step(self, samples: list, batch: list[int], *, keep_grads: bool = False) -> dict:
        """One optimizer step on `batch` (row indices); returns its log entry (and the pre-clip grads)."""
        t0, c = time.perf_counter(), self.cfg
        rows = [samples[i] for i in batch]
        z = {e: torch.cat([self.memo[i][e] for i in batch]) for e in self.links}
        received = {slot: Latent(self.links[edge](z[edge]), [self.m] * len(batch)) for slot, edge in self.step_def.inputs}
        enc = encode_stage(self.decoder, self.style, self.step_def, rows, received, batch_size=len(batch),
                           value_token_weight=c.value_token_weight, task=c.task, num_rounds=1,
                           max_latent_tokens=c.max_latent_tokens, non_last_loss_weight=c.non_last_loss_weight,
                           max_length=c.max_length)
        self.opt.zero_grad()
        enc.objective.backward()
        grads = {e: {n: p.grad.detach().clone() for n, p in link.named_parameters()}
                 for e, link in self.links.items()} if keep_grads else None
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, c.max_grad_norm)) if c.max_grad_norm > 0 else \
            float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.params])))
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.sched.step()
        entry = {"loss": float(sum(enc.sample_losses) / len(enc.sample_losses)),
                 "objective": float(enc.objective.detach()), "grad_norm": norm, "lr": lr,
                 "step_s": time.perf_counter() - t0}
        return {"entry": entry, "grads": grads}

    def finish(self) -> None:
        for link in self.links.values():
            link.requires_grad_(False)


def train_in_process(agents: dict, style, samples: list, cfg, batches: list[list[int]], *,
                     capture_grads: tuple[int, ...] = (), log=print) -> dict:
    """The single-process reference of `--schedule hop_by_hop` on loaded `agents` (role -> Agent): token links on
    every sent edge (attached to the agents), those into the decoder trained for len(batches) steps. Returns
    {"links": `links.pt` entries, "log": per-step entries, "grads": {1-based step: edge -> name -> grad}}."""
    sched = build_schedule(style, 1)
    trained, m, tau = decoder_edges(style, sched), cfg.rollout_latent_steps, cfg.token_tau
    ids = {}
    for edge in sent_edges(sched):
        src, dst = split_edge(edge)
        agents[src].outer_links[edge], ids[edge] = token_link(agents[src], agents[dst], tau)
        agents[src].outer_links[edge].requires_grad_(False)  # frozen unless it feeds the decoder (below)
    trainer = DecoderTrainer(cfg, style, agents[style.decoder],
                             {e: agents[split_edge(e)[0]].outer_links[e] for e in trained}, m=m)
    history, grads = [], {}
    for step, (batch, new) in enumerate(zip(batches, new_rows_per_step(batches))):
        if new:
            trainer.remember(new, sender_latents(agents, style, sched, cfg.task, m, [samples[i] for i in new]))
        got = trainer.step(samples, batch, keep_grads=step + 1 in capture_grads)
        history.append({"step": step + 1, **got["entry"]})
        if got["grads"] is not None:
            grads[step + 1] = got["grads"]
        line = step_line(trained, step, len(batches), history[-1])
        if line:
            log(line)
    trainer.finish()
    saved = {e: links_entry(agents[split_edge(e)[0]].outer_links[e], ids[e], tau) for e in sent_edges(sched)}
    return {"links": saved, "log": history, "grads": grads}


def step_line(trained: list[str], step: int, steps: int, entry: dict) -> str | None:
    """The log line of 0-based `step` (every eighth of the run and the last), else None."""
    if step % max(1, steps // 8) == 0 or step == steps - 1:
        return (f"[hop-by-hop] {', '.join(trained)} step {step + 1}/{steps} loss {entry['loss']:.3f} "
                f"grad_norm {entry['grad_norm']:.3f}")
    return None
