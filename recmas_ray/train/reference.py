"""Single-process autograd reference of the outer loop: every agent in this process, plain `loss.backward()`.

Written straight from the outer loop's definition (below), one sample at a time and without padding, so it
shares nothing with the pipeline path except the Agent, the links, the schedule and the data fields:

    for each sample:
        for step in build_schedule(style, R):            # rounds in order, roles in stage order
            E = embed(prompt with the latest message of each input edge, assistant = gold text of the role)
            H = frozen_model(E)[assistant positions]
            decoder role: loss_r = CE(logits before each answer token, answer tokens)
            for each output edge: message[edge] = outer_edge(inner_role(H[:K]))
        loss = loss_R + w * mean(loss_1..R-1)            (w = non_last_loss_weight)
        (loss / batch_size).backward()
    clip_grad_norm_(all outer links, max_norm); AdamW step

With `rollout_latent_steps` m > 0 (non-reference) a stage's messages come from its latent rollout instead of
its gold turn, written here as the spec's no-cache form (the whole prefix re-run at every step):

    E = embed(prompt with the latest message of each input edge)            no gold text
    repeat m times: h = frozen_model(E)[last]; H += [h]; E = concat(E, inner_role(h))
    message[edge] = outer_edge(inner_role(H))

for the first stage of round 1 (rollout_stages "first", the graph-free case), or for every stage that sends a
message, the decoder's feedback included (rollout_stages "all"; the decoder's loss stays teacher-forced).
rollout_feedback "detached" writes `inner_role(h).detach()` in the loop above (same values, no recursion grad).

Used by the exactness tests and by `jobs/bench/outer.py` as the single-process baseline.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from recmas_ray.engine.agent import Agent
from recmas_ray.engine.links import OuterLink
from recmas_ray.models import loader
from recmas_ray.styles import StyleSpec, build_schedule, render_prompt, split_edge
from recmas_ray.train.data import question_text, role_target


def reference_loss(agents: dict[str, Agent], outer: dict[str, OuterLink], style: StyleSpec, row: dict, *,
                   task: str, num_rounds: int, max_latent_tokens: int,
                   non_last_loss_weight: float, rollout_latent_steps: int = 0,
                   rollout_stages: str = "first",
                   rollout_feedback: str = "graph") -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The unrolled teacher-forced loss of one row; returns (loss, [decoder CE per round])."""
    messages: dict[str, torch.Tensor] = {}
    round_losses = []
    for step in build_schedule(style, num_rounds):
        agent = agents[step.role]
        user = render_prompt(style, step.role, step.variant, task, question_text(row))
        latents = {marker: messages[edge] for marker, edge in step.inputs}
        e_LD, ids_L, asst_L = agent.embed_teacher_forced(user, latents, role_target(style, step.role, row))
        mask = torch.ones(1, e_LD.shape[0], dtype=torch.long, device=e_LD.device)
        h_LD = agent.forward_hidden(e_LD[None], mask)[0]
        if step.role == style.decoder:
            # position t predicts token t + 1; the labels are the assistant tokens (answer + EOS)
            logits = agent.logits(h_LD[:-1]).float()
            labels = torch.where(asst_L[1:], ids_L[1:], torch.full_like(ids_L[1:], -100)).to(logits.device)
            round_losses.append(F.cross_entropy(logits, labels, ignore_index=-100))
        rollout = rollout_latent_steps > 0 and (rollout_stages == "all" or (not latents and step.role != style.decoder))
        if rollout and step.outputs:
            z = agent.inner_link(_rollout_no_cache(agent, user, latents, rollout_latent_steps,
                                                   detach_feedback=rollout_feedback == "detached"))
        else:
            z = agent.inner_link(h_LD[asst_L.to(h_LD.device)][:max_latent_tokens])
        for edge in step.outputs:
            assert split_edge(edge)[0] == step.role
            messages[edge] = outer[edge](z)
    loss = round_losses[-1]
    if non_last_loss_weight > 0 and len(round_losses) > 1:
        loss = loss + non_last_loss_weight * torch.stack(round_losses[:-1]).mean()
    return loss, round_losses


def _rollout_no_cache(agent: Agent, user: str, latents: dict[str, torch.Tensor], num_steps: int, *,
                      detach_feedback: bool = False) -> torch.Tensor:
    """H [m, D]: the rollout of one prompt, every step a full forward over the grown input (no KV cache)."""
    e_LD = agent.embed_prompt(user, latents)[0]
    hs = []
    for _ in range(num_steps):
        mask = torch.ones(1, e_LD.shape[0], dtype=torch.long, device=e_LD.device)
        h_D = agent.forward_hidden(e_LD[None], mask)[0, -1]
        hs.append(h_D)
        fed_D = agent.inner_link(h_D)
        e_LD = torch.cat([e_LD, (fed_D.detach() if detach_feedback else fed_D)[None]])
    return torch.stack(hs)


def reference_backward(agents: dict[str, Agent], outer: dict[str, OuterLink], style: StyleSpec, rows: list[dict],
                       **kw) -> list[list[float]]:
    """Accumulate d(mean loss over rows)/d(outer links) into `.grad`; returns per-row round losses."""
    out = []
    for row in rows:
        loss, rounds = reference_loss(agents, outer, style, row, **kw)
        (loss / len(rows)).backward()
        out.append([float(x.detach()) for x in rounds])
    return out


def reference_step(outer: dict[str, OuterLink], opt: torch.optim.Optimizer, max_grad_norm: float) -> float:
    """Clip over all outer links, step, zero grads; returns the pre-clip global norm."""
    params = [p for link in outer.values() for p in link.parameters()]
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm) if max_grad_norm > 0 else \
        torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(norm)


def build_reference(plan, *, device: str = "cpu"):
    """All agents of a `SystemPlan` in this process, fp32; returns (agents, copies of its outer links)."""
    dev = torch.device(device)
    agents = {}
    for role in plan.style.roles:
        model, tok = loader.load_frozen_model(plan.role_models[role], dtype=torch.float32, device=dev)
        inner = copy.deepcopy(plan.links.inner[role]).requires_grad_(False)
        agents[role] = Agent(model, tok, inner, role=role, model_name=plan.role_models[role],
                             system_prompt=plan.style.system_prompt)
    outer = {e: copy.deepcopy(plan.links.outer[e]).to(dev) for e in plan.style.edges}
    return agents, outer
