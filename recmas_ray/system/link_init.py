"""Fresh links of a system, seeded per role and edge: the same seed gives the same links on every machine.

`stable_seed(seed, name)` derives one seed per link from the run's seed and the link's name (a CRC, not
Python's salted `hash`), so adding a role or an edge never changes the others' initial weights.
"""

from __future__ import annotations

import zlib

import torch

from recmas_ray.engine.links import InnerLink, OuterLink
from recmas_ray.styles import StyleSpec
from recmas_ray.system.checkpoints import LinkSet


def stable_seed(seed: int, name: str) -> int:
    """Per-link seed independent of process and hash randomisation (local and Ray runs agree)."""
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def seeded_inner_link(hidden_size: int, *, seed: int, role: str) -> InnerLink:
    """A role's fresh inner link (PyTorch default init under its own seed): the one seeding of inner links."""
    with torch.random.fork_rng():
        torch.manual_seed(stable_seed(seed, f"inner:{role}"))
        return InnerLink(hidden_size)


def seeded_outer_link(in_dim: int, out_dim: int, *, seed: int, edge: str) -> OuterLink:
    """An edge's fresh outer link under its own seed."""
    with torch.random.fork_rng():
        torch.manual_seed(stable_seed(seed, f"outer:{edge}"))
        return OuterLink(in_dim, out_dim)


def init_links(style: StyleSpec, hidden_sizes: dict[str, int], *, seed: int) -> LinkSet:
    """Fresh links for every role and edge with PyTorch default init, seeded per link."""
    links = LinkSet()
    for role in style.roles:
        links.inner[role] = seeded_inner_link(hidden_sizes[role], seed=seed, role=role)
    for edge in style.edges:
        src, dst = edge.split("->")
        links.outer[edge] = seeded_outer_link(hidden_sizes[src], hidden_sizes[dst], seed=seed, edge=edge)
    return links
