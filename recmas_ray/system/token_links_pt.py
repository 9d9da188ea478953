"""The hop-by-hop experiment's earlier token-link file, `links.pt` (edge -> residual weights, token ids, temperature),
read as a product checkpoint for folders made before `jobs.experiments.hop_by_hop` saved links.safetensors +
manifest.json (`checkpoints.load_links` calls it). Untrusted input: weights_only, tensors only, each entry checked
as a token link.
"""

from __future__ import annotations

from pathlib import Path

import torch

from recmas_ray.engine.links import link_from_state
from recmas_ray.system.untrusted import check_finite, opened_inside

TOKEN_LINKS_PT = "links.pt"
"""The file name."""


def read_token_links_pt(root: Path, file: Path, edges: tuple[str, ...] | None) -> dict:
    """edge -> unbound TokenLink of `file` (opened inside `root`); `edges`: the ones the style has (None: any)."""
    try:
        with opened_inside(root, file, what=str(root)) as opened:
            saved = torch.load(opened, map_location="cpu", weights_only=True)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - corrupt zip, pickle refused by weights_only, ...
        raise ValueError(f"{file}: not a plain tensor checkpoint (loaded with weights_only=True): "
                         f"{str(e).strip().splitlines()[0][:160]}") from None
    if not isinstance(saved, dict) or not all(isinstance(v, dict) and all(isinstance(t, torch.Tensor) for t in
                                                                        v.values()) for v in saved.values()):
        raise ValueError(f"{file}: expected edge -> token link tensors")
    out = {}
    for edge, sd in saved.items():
        if not isinstance(edge, str) or edge.count("->") != 1 or (edges is not None and edge not in edges):
            raise ValueError(f"{file}: entry {edge!r} is not an edge of this style ({', '.join(edges or [])})")
        check_finite(sd, f"{file}: {edge}")
        out[edge] = link_from_state(sd, place="outer", what=f"{file}: token link {edge}")
    return out
