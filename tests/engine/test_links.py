"""Links: reference layout and key names, parameter counts, release state dicts load unchanged."""

import itertools

import pytest
import torch

from recmas_ray.engine.links import (INNER_KEYS, OUTER_KEYS, InnerLink, OuterLink, inner_link_from_state_dict,
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


# ----------------------------------------------------------------------------- non-reference recipe options
def test_rescale_rows_gives_the_target_norm_and_keeps_direction():
    from recmas_ray.engine.links import rescale_rows

    x = torch.randn(5, 16) * torch.arange(1, 6)[:, None]
    y = rescale_rows(x, 3.2)
    assert torch.allclose(y.norm(dim=-1), torch.full((5,), 3.2), atol=1e-5)
    assert torch.allclose(torch.nn.functional.cosine_similarity(x, y, dim=-1), torch.ones(5), atol=1e-6)


def test_mean_embedding_norm_counts_every_token_and_the_modules_scaling():
    from recmas_ray.engine.links import mean_embedding_norm

    emb = torch.nn.Embedding(50, 8)

    class Scaled(torch.nn.Module):  # as Gemma-3 multiplies by sqrt(d) inside its embedding module
        def forward(self, ids):
            return emb(ids) * 4.0

    want = float(emb.weight.detach().norm(dim=-1).mean())
    assert mean_embedding_norm(emb, 50, chunk=7) == pytest.approx(want, rel=1e-5)
    assert mean_embedding_norm(Scaled(), 50, chunk=64) == pytest.approx(4 * want, rel=1e-5)


def test_ridge_bridge_solves_the_ridge_problem():
    from recmas_ray.engine.links import ridge_bridge

    torch.manual_seed(0)
    x = torch.randn(400, 12)
    w_true, b_true = torch.randn(6, 12), torch.randn(6)
    w, b = ridge_bridge(x, x @ w_true.T + b_true, ridge=0.0)  # noiseless, no penalty: the exact map
    assert torch.allclose(w, w_true, atol=1e-4) and torch.allclose(b, b_true, atol=1e-4)
    y = x @ w_true.T + b_true + 0.3 * torch.randn(400, 6)
    lam = 0.5
    w, b = ridge_bridge(x, y, ridge=lam)
    # optimality: the gradient of ||x W^T + b - y||^2 + lam N ||W||^2 vanishes in W and b
    resid = (x @ w.T + b - y).double()
    assert torch.allclose(resid.T @ x.double() + lam * 400 * w.double(), torch.zeros(6, 12, dtype=torch.float64),
                          atol=1e-3)
    assert torch.allclose(resid.sum(0), torch.zeros(6, dtype=torch.float64), atol=1e-3)
    assert w.norm() < ridge_bridge(x, y, ridge=0.0)[0].norm()  # the penalty shrinks
    with pytest.raises(ValueError, match="paired"):
        ridge_bridge(x, y[:10], ridge=lam)


def test_init_bridge_makes_the_link_map_source_rows_near_their_targets():
    from recmas_ray.engine.links import init_bridge

    torch.manual_seed(1)
    x = torch.randn(600, 24)
    y = (x @ torch.randn(32, 24).T) * 0.1  # targets at a small scale, like SmolLM2's token embeddings
    link = OuterLink(24, 32)
    before = torch.nn.functional.cosine_similarity(link(x), y, dim=-1).mean()
    init_bridge(link, x, y, ridge=1e-3)
    with torch.no_grad():
        out = link(x)
    assert torch.nn.functional.cosine_similarity(out, y, dim=-1).mean() > 0.95 > before
    assert float(out.norm(dim=-1).mean()) == pytest.approx(float(y.norm(dim=-1).mean()), rel=0.15)
    assert set(link.state_dict()) == OUTER_KEYS  # still the release's layout


def test_token_link_resays_the_nearest_source_token_in_the_target_table_and_trains_only_its_residual():
    from recmas_ray.engine.links import TokenLink

    torch.manual_seed(0)
    src_KD, dst_KE = torch.randn(40, 8), torch.randn(40, 12)
    link = TokenLink(src_KD, dst_KE, tau=1e-3)
    assert set(link.state_dict()) == {"residual.weight", "residual.bias"}  # the tables are not saved
    k_BM = torch.randint(0, 40, (3, 5))
    x_BMD = src_KD[k_BM] * 3.0 + 0.01 * torch.randn(3, 5, 8)  # near a source token, at another scale
    torch.testing.assert_close(link(x_BMD), dst_KE[k_BM], atol=1e-4, rtol=1e-4)  # zero residual: the translation
    link(x_BMD).pow(2).sum().backward()
    assert link.residual.weight.grad.abs().sum() > 0 and link.residual.bias.grad.abs().sum() > 0
    with torch.no_grad():
        link.residual.bias.fill_(1.0)
    torch.testing.assert_close(link(x_BMD), dst_KE[k_BM] + 1.0, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="tau must be positive"):
        TokenLink(src_KD, dst_KE, tau=0.0)
    with pytest.raises(ValueError, match="paired"):
        TokenLink(src_KD, dst_KE[:30], tau=0.1)
