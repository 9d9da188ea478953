"""Links: reference layout and key names, parameter counts, release state dicts load unchanged."""

import itertools

import pytest
import torch

from recmas_ray.links import (INNER_KEYS, OUTER_KEYS, InnerLink, OuterLink, inner_link_from_state_dict,
                              outer_link_from_state_dict)
from recmas_ray.models.tiny import TINY_FAMILIES


def test_inner_link_layout_and_param_count():
    link = InnerLink(64)
    assert set(link.state_dict()) == INNER_KEYS
    assert sum(p.numel() for p in link.parameters()) == 2 * 64**2 + 6 * 64
    # the paper's "13.12M trainable params" for d=2560
    assert sum(p.numel() for p in InnerLink(2560).parameters()) == 13_122_560


def test_outer_link_layout_and_param_count():
    link = OuterLink(96, 64)
    assert set(link.state_dict()) == OUTER_KEYS
    d_s, d_t = 96, 64
    assert sum(p.numel() for p in link.parameters()) == 3 * d_s * d_t + 2 * d_t**2 + 2 * d_s + 6 * d_t
    assert link.proj1.out_features == 2 * d_t  # hidden width = 2 x out_dim


def test_inner_link_formula():
    torch.manual_seed(0)
    link = InnerLink(16)
    x = torch.randn(3, 5, 16)
    u = link.proj2(torch.nn.functional.gelu(link.proj1(torch.nn.functional.layer_norm(x, (16,), link.pre_ln.weight,
                                                                                        link.pre_ln.bias))))
    expected = torch.nn.functional.layer_norm(x + u, (16,), link.post_ln.weight, link.post_ln.bias)
    assert torch.allclose(link(x), expected, atol=1e-6)


@pytest.mark.parametrize("src,dst", list(itertools.product(TINY_FAMILIES, TINY_FAMILIES)))
def test_outer_links_map_between_every_pair_of_families(src, dst):
    d_s, d_t = TINY_FAMILIES[src].hidden_size, TINY_FAMILIES[dst].hidden_size
    out = OuterLink(d_s, d_t)(InnerLink(d_s)(torch.randn(2, 7, d_s)))
    assert out.shape == (2, 7, d_t) and torch.isfinite(out).all()


def test_release_state_dicts_load_unchanged(tmp_path):
    torch.manual_seed(1)
    inner, outer = InnerLink(32), OuterLink(32, 48)
    # released files are torch.save'd state dicts; outer links ship in bf16
    torch.save(inner.state_dict(), tmp_path / "adapter.pt")
    torch.save({k: v.to(torch.bfloat16) for k, v in outer.state_dict().items()}, tmp_path / "outer_12.pt")
    inner2 = inner_link_from_state_dict(torch.load(tmp_path / "adapter.pt", weights_only=True))
    outer2 = outer_link_from_state_dict(torch.load(tmp_path / "outer_12.pt", weights_only=True))
    x = torch.randn(4, 32)
    assert torch.equal(inner2(x), inner(x))
    assert (outer2.in_dim, outer2.out_dim) == (32, 48)  # d_t inferred from proj2.bias
    bf16 = OuterLink(32, 48)
    bf16.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in outer.state_dict().items()})
    assert torch.equal(outer2(x), bf16(x))


def test_wrong_keys_fail_with_names():
    sd = InnerLink(8).state_dict()
    sd["extra.weight"] = sd.pop("proj1.weight")
    with pytest.raises(ValueError, match=r"missing keys \['proj1.weight'\].*unexpected keys \['extra.weight'\]"):
        inner_link_from_state_dict(sd)
