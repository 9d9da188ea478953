"""Role copies: several actor copies of a role inside one system replica, sized by cost.

A system's stages cost what their models and their work cost: in the paper's mixture system a 7B
expert sits beside 1.5B ones, and the light system's solver decodes hundreds of tokens while the
planner and critic run a few dozen latent steps. Replicating whole systems keeps that imbalance; role
copies give each role as many copies as its share of the work (`--role_replicas solver=3`, or
`--auto_role_replicas`: from `role_costs`, parameters x tokens per batch, the cheapest role one copy).

Routing lives in `routing.RoleGroup`: every agent call goes to the copy of its role with the least
queued work. Pure Python, no Ray (tested without it).
"""

from __future__ import annotations

from transformers import AutoConfig

from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.models.loader import resolve_model_path
from recmas_ray.models.registry import model_kind
from recmas_ray.models.sim import PREFILL_SPEEDUP
from recmas_ray.styles import StyleSpec, build_schedule

PROMPT_TOKENS = 200
"""Prompt tokens prefilled per agent call in the cost estimate (the styles' prompts are ~100-300)."""


def _params(model_name: str) -> tuple[float, float]:
    """(parameters of the blocks, of the LM head) of a model from its config alone: 12 L d^2 and V d."""
    text = AutoConfig.from_pretrained(resolve_model_path(model_name)).get_text_config()
    d, layers = int(text.hidden_size), int(text.num_hidden_layers)
    return 12.0 * layers * d * d, float(getattr(text, "vocab_size", 0)) * d


def call_cost(model_name: str, kind: str, num_tokens: int) -> float:
    """Relative cost of one call: `kind` rollout (num_tokens latent steps) or decode (tokens).

    Simulated agents: their configured milliseconds. Real models, in the simulator's own terms
    (`models.sim.paper_sim_models`): each sequential step reads the weights once, so a latent step costs
    the blocks and a decoded token the blocks and the LM head (a rollout never runs the head); the
    prompt is one parallel forward, its tokens `PREFILL_SPEEDUP` times cheaper than a step each.
    """
    own = model_kind(model_name).call_cost(model_name, kind, num_tokens)  # simulated agents: their own table
    if own is not None:
        return own
    blocks, head = _params(model_name)
    prefill = blocks * PROMPT_TOKENS / PREFILL_SPEEDUP
    if kind == "rollout":
        return prefill + blocks * num_tokens
    return prefill + (blocks + head) * num_tokens


def role_costs(style: StyleSpec, role_models: dict[str, str], num_rounds: int, latent_steps: int,
               max_new_tokens: int, *, decode_every_round: bool = False) -> dict[str, float]:
    """Each role's cost per batch over the whole schedule (the same schedule the runner walks)."""
    costs = {r: 0.0 for r in style.roles}
    for step in build_schedule(style, num_rounds, decode_every_round=decode_every_round):
        model = role_models[step.role]
        if step.decode or step.discard_decode:
            costs[step.role] += call_cost(model, "decode", max_new_tokens)
        if step.outputs:
            costs[step.role] += call_cost(model, "rollout", latent_steps)
    return costs


def copies_from_costs(costs: dict[str, float], *, max_copies: int = 64, budget: int | None = None) -> dict[str, int]:
    """Copies per role proportional to cost: the cheapest (non-zero) role one copy, or with `budget`
    exactly that many actors in all (each role at least one; largest remainders get the rest)."""
    positive = [c for c in costs.values() if c > 0]
    if not positive:
        return {r: 1 for r in costs}
    if budget is None:
        base = min(positive)
        return {r: max(1, min(max_copies, round(c / base))) for r, c in costs.items()}
    if budget < len(costs):
        raise ValueError(f"{budget} agent actors cannot hold {len(costs)} roles (one copy each at least)")
    total = sum(costs.values())
    share = {r: (budget - len(costs)) * c / total for r, c in costs.items()}
    # each role one copy first, then the copies that lower the worst cost per copy most
    out = {r: 1 for r in costs}
    for _ in range(budget - len(costs)):
        worst = max(costs, key=lambda r: (costs[r] / out[r], share[r]))
        out[worst] += 1
    return out


def resolve_copies(role_replicas: dict[str, int], auto: bool, roles, costs: dict[str, float] | None) -> dict[str, int]:
    """Copies per role: explicit `role_replicas` win, the rest from `costs` with `auto`, else 1."""
    roles = list(roles)
    bad = [r for r in role_replicas if r not in roles]
    if bad:
        raise ValueError(f"--role_replicas names {bad}, not roles of this style {roles}")
    base = copies_from_costs(costs) if auto and costs else {r: 1 for r in roles}
    return {r: int(role_replicas.get(r, base.get(r, 1))) for r in roles}


def role_copies(plan, placement, recursion=None) -> dict:
    """Actor copies per role: `--role_replicas`, the rest sized from costs with `--auto_role_replicas`
    (`recursion`: the run's R, m and decode budget; defaults otherwise)."""
    costs = None
    if placement.auto_role_replicas:
        rc = recursion or RecursionConfig()
        costs = role_costs(plan.style, plan.role_models, rc.num_recursive_rounds, rc.latent_steps,
                           rc.decode.max_new_tokens, decode_every_round=rc.decode_every_round)
    return resolve_copies(placement.role_replicas, placement.auto_role_replicas, plan.style.roles, costs)
