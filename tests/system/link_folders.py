"""A system folder holding every link kind (shared by the link-kind tests): inner links (InnerLink), the
release's outer link started as a ridge bridge (`links.init_bridge`), and a token link (`links.TokenLink`), saved
by the product's checkpoint layout with the manifests training writes (task, prompts, provenance)."""

from __future__ import annotations

from pathlib import Path

import torch

STYLE, TASK = "sequential_light", "qa"


def make_links(seed: int = 0):
    """(plan, LinkSet) of sequential_light on the tiny preset: every role's inner link perturbed from its seed,
    planner->critic a bridged OuterLink, critic->solver a TokenLink with a non-zero residual."""
    from recmas_ray.engine.links import TokenLink, init_bridge
    from recmas_ray.system.checkpoints import LinkSet
    from recmas_ray.system.plan import plan_system

    plan = plan_system(STYLE, preset="tiny", seed=seed, task=TASK)
    gen = torch.Generator().manual_seed(seed)
    links = LinkSet()
    for role, link in plan.links.inner.items():
        with torch.no_grad():
            for p in link.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        links.inner[role] = link
    d_p, d_c, d_s = (plan.hidden_sizes[r] for r in ("planner", "critic", "solver"))
    bridged = plan.links.outer["planner->critic"]
    init_bridge(bridged, torch.randn(40, d_p, generator=gen), torch.randn(40, d_c, generator=gen))
    links.outer["planner->critic"] = bridged
    ids = torch.randperm(272, generator=gen)[:50]
    token = TokenLink(None, None, 0.05, ids=(ids, ids.flip(0)), dims=(d_c, d_s))
    with torch.no_grad():
        token.residual.weight.copy_(0.01 * torch.randn(d_s, d_c, generator=gen))
        token.residual.bias.copy_(0.01 * torch.randn(d_s, generator=gen))
    links.outer["critic->solver"] = token
    links.outer["solver->planner"] = plan.links.outer["solver->planner"]  # round 2's feedback: the seeded default
    return plan, links


def write_system_folder(root: Path, seed: int = 0, *, task: str = TASK) -> Path:
    """`make_links` saved as one system folder (root/<role>/, root/outer/), as train_inner + train_outer write it."""
    from recmas_ray.styles.prompts import prompt_set_hash
    from recmas_ray.system.checkpoints import LinkSet, save_links
    from recmas_ray.system.provenance import write_provenance

    plan, links = make_links(seed)
    for role, link in links.inner.items():
        m = plan.role_models[role]
        save_links(root / role, LinkSet(inner={role: link}),
                   {"kind": "inner", "style": STYLE, "role": role, "base_model": m, "task": task,
                    "roles": {role: {"base_model": m, "hidden_size": link.hidden_size}}})
        write_provenance(root / role, config={"task": task}, kind="inner")
    save_links(root / "outer", LinkSet(outer=links.outer),
               {**plan.manifest(), "kind": "outer", "task": task, "train_config": {"task": task}})
    write_provenance(root / "outer", config={"task": task}, kind="outer")
    return root
