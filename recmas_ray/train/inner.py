"""Inner-loop numerics: the warm-start loss of one role's inner link and one optimizer step.

Goal: inner(h_t) should look like the input embedding of token t+1, so latent thoughts land in the
distribution of the model's own inputs.

    rows        (user prompt with upstream gold text, gold target) per row
    one step    embed prompt + the chat template's rendered assistant turn -> left pad -> frozen forward
                (no_grad) -> H, E; pred_t = inner(H[:, t]), target_t = E[:, t+1] at assistant positions
                -> w_cos * (1 - cos) + w_mse * MSE; grad_accum_steps batches summed -> all-reduce link
                grads over workers -> clip -> AdamW -> LR schedule (train/core.py)

The Ray Train worker is `inner_worker.py`, the driver `inner_job.py`.
Legend: B batch, L sequence, D hidden size, N kept (assistant) positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recmas_ray.engine.agent import Agent
from recmas_ray.engine.kv_cache import left_pad
from recmas_ray.train.config import InnerTrainConfig
from recmas_ray.engine.links import InnerLink
from recmas_ray.train.core import make_scheduler


# ----------------------------------------------------------------------------- numerics
def inner_loss(agent: Agent, batch: list[tuple[str, str]], *, w_cos: float = 1.0, w_mse: float = 0.0,
               max_length: int = 2048, literal_slots: bool = False) -> torch.Tensor:
    """Teacher-forced inner-link loss over a batch of (user prompt, gold target) pairs.

    One frozen no_grad forward; pred_t = inner(H[:, t]), target_t = E[:, t+1], kept where position
    t+1 is a token of the rendered assistant turn and position t is not padding.
    """
    with torch.no_grad():
        rows, assistant = [], []
        for user, target in batch:
            e_LD, _, asst_L = agent.embed_teacher_forced(user, None, target, literal_slots=literal_slots)
            rows.append(e_LD[:max_length])
            assistant.append(asst_L[:max_length])
        e_BLD, mask_BL = left_pad(rows)
        asst_BL = torch.zeros(mask_BL.shape, dtype=torch.bool, device=mask_BL.device)
        for b, a in enumerate(assistant):
            asst_BL[b, asst_BL.shape[1] - a.shape[0]:] = a.to(asst_BL.device)
        h_BLD = agent.forward_hidden(e_BLD, mask_BL)
        keep_BL = asst_BL[:, 1:] & mask_BL[:, :-1].bool()
        h_ND, target_ND = h_BLD[:, :-1][keep_BL], e_BLD[:, 1:][keep_BL]
    link_dtype = next(agent.inner_link.parameters()).dtype
    pred_ND = agent.inner_link(h_ND.to(link_dtype)).float()
    target_ND = target_ND.float()
    if pred_ND.shape[0] == 0:  # every target truncated away: a zero loss that still has a graph
        return pred_ND.sum() * 0.0
    loss = w_cos * (1.0 - F.cosine_similarity(pred_ND, target_ND, dim=-1)).mean()
    if w_mse:
        loss = loss + w_mse * F.mse_loss(pred_ND, target_ND)
    return loss


def make_optimizer(link: InnerLink, cfg: InnerTrainConfig):
    """AdamW over the link only, betas (0.9, 0.95), wd 0 (biases and LayerNorms in a no-decay group)."""
    decay = [p for n, p in link.named_parameters() if n.endswith("weight") and "ln" not in n]
    no_decay = [p for n, p in link.named_parameters() if not (n.endswith("weight") and "ln" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))
    return opt, make_scheduler(opt, cfg)


def train_step(agent: Agent, opt, sched, batch, cfg: InnerTrainConfig, *, literal_slots: bool = False) -> float:
    """One optimizer step over this worker's rows: `batch` holds grad_accum_steps consecutive chunks of
    batch_size rows, each loss divided by their number; link grads are averaged over workers when
    torch.distributed is up. Returns the mean loss."""
    num_chunks = cfg.grad_accum_steps
    size = len(batch) // num_chunks
    opt.zero_grad(set_to_none=True)
    loss_t = torch.zeros(())
    for i in range(num_chunks):
        loss = inner_loss(agent, batch[i * size:(i + 1) * size], w_cos=cfg.w_cos, w_mse=cfg.w_mse,
                          max_length=cfg.max_length, literal_slots=literal_slots) / num_chunks
        loss.backward()
        loss_t += loss.detach().cpu()
    params = list(agent.inner_link.parameters())
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        loss_t = loss_t.to(params[0].device)
        for t in [p.grad for p in params] + [loss_t]:
            torch.distributed.all_reduce(t)
            t.div_(world)
    if cfg.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    opt.step()
    sched.step()
    return float(loss_t)
