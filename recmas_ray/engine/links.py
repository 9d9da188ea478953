"""RecursiveLink modules: the inner link (d -> d) and the outer link (d_src -> d_dst).

Pure torch, no Ray and no transformers. Layer order and state-dict key names follow the public
RecursiveMAS release exactly, so its released `adapter.pt` / `outer_*.pt` files
load unchanged with `load_state_dict(strict=True)`.

Legend: B batch, M latent positions, D source hidden size, E target hidden size.
"""

from __future__ import annotations

import torch
from torch import nn

INNER_LINK_TYPE = "ln_res_adapter"
OUTER_LINK_TYPE = "outer_ln_res_adapter"

INNER_KEYS = frozenset(
    f"{layer}.{p}" for layer in ("proj1", "proj2", "pre_ln", "post_ln") for p in ("weight", "bias")
)
OUTER_KEYS = frozenset(
    f"{layer}.{p}"
    for layer in ("proj1", "proj2", "residual_proj", "ln_source", "ln_target")
    for p in ("weight", "bias")
)


class InnerLink(nn.Module):
    """Maps an agent's last hidden state back into its own input-embedding space (d -> d).

    y = LN_post(x + W2 GELU(W1 LN_pre(x)))   (reference class `Adapter`, type `ln_res_adapter`)
    """

    link_type = INNER_LINK_TYPE

    def __init__(self, hidden_size: int):
        super().__init__()
        if hidden_size <= 0:
            raise ValueError(f"InnerLink hidden_size must be positive, got {hidden_size}")
        self.hidden_size = hidden_size
        self.pre_ln = nn.LayerNorm(hidden_size)
        self.proj1 = nn.Linear(hidden_size, hidden_size)
        self.proj2 = nn.Linear(hidden_size, hidden_size)
        self.post_ln = nn.LayerNorm(hidden_size)

    def forward(self, h_BMD: torch.Tensor) -> torch.Tensor:
        u_BMD = self.proj2(nn.functional.gelu(self.proj1(self.pre_ln(h_BMD))))
        return self.post_ln(h_BMD + u_BMD)


class OuterLink(nn.Module):
    """Maps a source agent's inner-adapted latents into a target agent's embedding space (d_src -> d_dst).

    y = LN_target(W2 GELU(W1 LN_source(x)) + W3 x)   (reference `CrossModelAdapter`, `outer_ln_res_adapter`)
    The MLP's hidden width is 2 * out_dim; W3 (`residual_proj`) bridges different hidden sizes.
    """

    link_type = OUTER_LINK_TYPE

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        if in_dim <= 0 or out_dim <= 0:
            raise ValueError(f"OuterLink dims must be positive, got in_dim={in_dim} out_dim={out_dim}")
        self.in_dim, self.out_dim = in_dim, out_dim
        self.ln_source = nn.LayerNorm(in_dim)
        self.proj1 = nn.Linear(in_dim, 2 * out_dim)
        self.proj2 = nn.Linear(2 * out_dim, out_dim)
        self.residual_proj = nn.Linear(in_dim, out_dim)
        self.ln_target = nn.LayerNorm(out_dim)

    def forward(self, x_BMD: torch.Tensor) -> torch.Tensor:
        u_BME = self.proj2(nn.functional.gelu(self.proj1(self.ln_source(x_BMD))))
        return self.ln_target(u_BME + self.residual_proj(x_BMD))


# ----------------------------------------------------------------------------- non-reference options
def rescale_rows(x_MD: torch.Tensor, norm: float) -> torch.Tensor:
    """Each row of `x_MD` scaled to L2 norm `norm` (direction kept; differentiable)."""
    return x_MD * (norm / x_MD.float().norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(x_MD.dtype)


@torch.no_grad()
def mean_embedding_norm(embed: nn.Module, vocab_size: int, *, device=None, chunk: int = 8192) -> float:
    """Mean L2 norm of the embedding module's output over every token id (the module's own scaling included,
    e.g. Gemma-3's sqrt(d)), in chunks so a 262k vocabulary never sits in memory at once."""
    total = 0.0
    for start in range(0, vocab_size, chunk):
        ids = torch.arange(start, min(vocab_size, start + chunk), device=device)
        total += float(embed(ids).float().norm(dim=-1).sum())
    return total / vocab_size


class TokenLink(nn.Module):
    """An outer link that re-says each latent as the target's embedding of the source token it is nearest to,
    plus a trained residual (non-reference).

    y = softmax(cos(x, e_src(s_k)) / tau over the K token pairs) @ [e_dst(t_k)] + W x + b, with (s_k, t_k) the
    tokens that read the same in both vocabularies. A sender whose inner link was trained long enough emits
    latents near its own next token's embedding (docs/learning_runs.md, two hops): this reads that token off in
    the sender's vocabulary and writes it in the receiver's, where a regression across families
    (`ridge_bridge`) picks the right digit for only 16-63% of rollout steps. W, b start at zero (the link
    starts as the pure translation) and carry what the loss asks beyond it.

    Only W, b are parameters. The token ids (`ids=`) are saved with them; the two tables are the models' own
    input embeddings of those ids, frozen buffers that are never saved: a link read from a checkpoint is
    built `unbound` and `bind`s them where its sender's model lives (`service.AgentService`).
    """

    link_type = "token_link"

    def __init__(self, source_table_KD: torch.Tensor | None, target_table_KE: torch.Tensor | None, tau: float, *,
                 ids: tuple | None = None, dims: tuple[int, int] | None = None):
        super().__init__()
        if not (isinstance(tau, (int, float)) and tau > 0):
            raise ValueError(f"TokenLink tau must be positive, got {tau}")
        self.tau = float(tau)
        if ids is not None:
            src, dst = (torch.as_tensor(i, dtype=torch.long).reshape(-1) for i in ids)
            if len(src) != len(dst) or len(src) == 0:
                raise ValueError(f"TokenLink: expected as many source as target token ids (> 0), got {len(src)} "
                                 f"and {len(dst)}")
            self.register_buffer("source_ids", src)
            self.register_buffer("target_ids", dst)
        if source_table_KD is None:  # unbound: sizes from `dims`, tables from `bind`
            if dims is None or ids is None:
                raise ValueError("TokenLink without tables needs ids= and dims=(in_dim, out_dim)")
            self.in_dim, self.out_dim = int(dims[0]), int(dims[1])
            self.register_buffer("source_unit_KD", None, persistent=False)
            self.register_buffer("target_KE", None, persistent=False)
        else:
            self.in_dim, self.out_dim = int(source_table_KD.shape[-1]), int(target_table_KE.shape[-1])
            self.register_buffer("source_unit_KD", None, persistent=False)
            self.register_buffer("target_KE", None, persistent=False)
            self.bind(source_table_KD, target_table_KE)
        if self.in_dim <= 0 or self.out_dim <= 0:
            raise ValueError(f"TokenLink dims must be positive, got {self.in_dim}->{self.out_dim}")
        self.residual = nn.Linear(self.in_dim, self.out_dim)
        nn.init.zeros_(self.residual.weight)
        nn.init.zeros_(self.residual.bias)

    @property
    def num_tokens(self) -> int:
        """K, the token pairs (from the ids, else the bound tables)."""
        return int(len(self.source_ids) if hasattr(self, "source_ids") else len(self.target_KE))

    @property
    def bound(self) -> bool:
        return self.target_KE is not None

    @torch.no_grad()
    def bind(self, source_table_KD: torch.Tensor, target_table_KE: torch.Tensor) -> "TokenLink":
        """Set the two frozen tables (the sender's and the receiver's input embeddings of the token pairs)."""
        if source_table_KD.dim() != 2 or target_table_KE.dim() != 2 or len(source_table_KD) != len(target_table_KE):
            raise ValueError(f"TokenLink: expected paired [K, D] and [K, E] tables, got {tuple(source_table_KD.shape)} "
                             f"and {tuple(target_table_KE.shape)}")
        if hasattr(self, "residual") and (source_table_KD.shape[1], target_table_KE.shape[1]) != (self.in_dim,
                                                                                                  self.out_dim):
            raise ValueError(f"TokenLink maps {self.in_dim}->{self.out_dim}, but the tables are "
                             f"{source_table_KD.shape[1]}- and {target_table_KE.shape[1]}-wide")
        self.source_unit_KD = nn.functional.normalize(source_table_KD.detach().float(), dim=-1)
        self.target_KE = target_table_KE.detach().float()
        return self

    def forward(self, x_BMD: torch.Tensor) -> torch.Tensor:
        if not self.bound:
            raise RuntimeError("TokenLink is unbound: bind() the token tables of its two models first")
        u_BMD = nn.functional.normalize(x_BMD.float(), dim=-1)
        p_BMK = torch.softmax(u_BMD @ self.source_unit_KD.float().T / self.tau, dim=-1)
        r_BME = nn.functional.linear(x_BMD.float(), self.residual.weight.float(), self.residual.bias.float())
        return (p_BMK @ self.target_KE.float() + r_BME).to(x_BMD.dtype)


@torch.no_grad()
def token_channel(link: TokenLink, x_BMD: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a token link sends, per position of its input x (the sender's inner(h)): `top1_BM` the top-1
    probability of its softmax over the K token pairs, `source_ids_BM` the source token it picks (the message's
    nearest token; its row of the tables when the link holds no ids), `residual_share_BM` = ||r|| / (||p T|| +
    ||r||) of its output p T + r (0: the pure translation, 1: the residual alone). Same arithmetic as
    `TokenLink.forward`; all on the link's device."""
    if not link.bound:
        raise RuntimeError("TokenLink is unbound: bind() the token tables of its two models first")
    u_BMD = nn.functional.normalize(x_BMD.float(), dim=-1)
    p_BMK = torch.softmax(u_BMD @ link.source_unit_KD.float().T / link.tau, dim=-1)
    r_BME = nn.functional.linear(x_BMD.float(), link.residual.weight.float(), link.residual.bias.float())
    t_norm, r_norm = (p_BMK @ link.target_KE.float()).norm(dim=-1), r_BME.norm(dim=-1)
    top1_BM, k_BM = p_BMK.max(dim=-1)
    share_BM = r_norm / (t_norm + r_norm).clamp_min(torch.finfo(torch.float32).tiny)
    ids = getattr(link, "source_ids", None)  # a link built from bare tables has none: the table's row
    return {"top1_BM": top1_BM, "source_ids_BM": k_BM if ids is None else ids.to(k_BM.device)[k_BM],
            "residual_share_BM": share_BM}


def ridge_bridge(x_ND: torch.Tensor, y_NE: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_ED, b_E) minimising ||x W^T + b - y||^2 + ridge * N * ||W||^2 (the intercept unpenalised).

    Paired rows, e.g. the same token's embedding in the source and in the target model: the closed form on
    centred data, solved in float64 (a third-party re-run's aligned bridge, docs/reproducing.md#sources;
    non-reference)."""
    if x_ND.shape[0] != y_NE.shape[0] or x_ND.dim() != 2 or y_NE.dim() != 2:
        raise ValueError(f"ridge_bridge: expected paired [N, D] and [N, E] rows, got {tuple(x_ND.shape)} and "
                         f"{tuple(y_NE.shape)}")
    x, y = x_ND.double(), y_NE.double()
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    gram_DD = xc.T @ xc + ridge * x.shape[0] * torch.eye(x.shape[1], dtype=torch.float64)
    w_ED = torch.linalg.solve(gram_DD, xc.T @ yc).T
    return w_ED.float(), (my - w_ED @ mx).float()


@torch.no_grad()
def init_bridge(link: "OuterLink", x_ND: torch.Tensor, y_NE: torch.Tensor, *, ridge: float = 1e-2,
                mlp_scale: float = 1e-3) -> "OuterLink":
    """Start `link` as the ridge bridge x -> y (non-reference): residual_proj = the ridge solution,
    the MLP branch scaled to ~0 (still trainable), ln_target's gain set to the targets' mean per-row standard
    deviation and its bias to their mean value, so link(x) ~ y in scale as well as direction."""
    w, b = ridge_bridge(x_ND, y_NE, ridge)
    link.residual_proj.weight.copy_(w)
    link.residual_proj.bias.copy_(b)
    link.proj2.weight.mul_(mlp_scale)
    link.proj2.bias.mul_(mlp_scale)
    y = y_NE.float()
    link.ln_target.weight.fill_(float(y.std(dim=-1, unbiased=False).mean()))
    link.ln_target.bias.fill_(float(y.mean()))  # LN removes each row's mean: put the average one back
    return link


def check_state_dict_keys(state_dict: dict, expected: frozenset, what: str) -> None:
    """Raise ValueError naming missing/unexpected keys (the release's loaders fail the same way)."""
    keys = set(state_dict)
    missing, unexpected = sorted(expected - keys), sorted(keys - expected)
    if missing or unexpected:
        raise ValueError(
            f"{what}: state dict does not match the {('inner' if expected is INNER_KEYS else 'outer')} "
            f"link layout; missing keys {missing}, unexpected keys {unexpected}"
        )


def inner_link_from_state_dict(state_dict: dict, *, what: str = "inner link") -> InnerLink:
    """Build an InnerLink whose size is read from the weights, checking keys strictly."""
    check_state_dict_keys(state_dict, INNER_KEYS, what)
    link = InnerLink(int(state_dict["proj1.weight"].shape[0]))
    link.load_state_dict({k: v.float() for k, v in state_dict.items()})
    return link


def outer_link_from_state_dict(state_dict: dict, *, what: str = "outer link") -> OuterLink:
    """Build an OuterLink; d_dst is inferred from `proj2.bias` as the reference does."""
    check_state_dict_keys(state_dict, OUTER_KEYS, what)
    link = OuterLink(int(state_dict["residual_proj.weight"].shape[1]), int(state_dict["proj2.bias"].shape[0]))
    link.load_state_dict({k: v.float() for k, v in state_dict.items()})
    return link


# ----------------------------------------------------------------------------- the registry of link kinds
TOKEN_LINK_TYPE = TokenLink.link_type
TOKEN_KEYS = frozenset({"residual.weight", "residual.bias", "source_ids", "target_ids", "tau"})
LINK_KINDS = {INNER_LINK_TYPE: "inner", OUTER_LINK_TYPE: "outer", TOKEN_LINK_TYPE: "outer"}
"""Every link kind a checkpoint may name (its manifest's `kind`) -> the place it takes (inner or outer)."""
_KIND_KEYS = {INNER_LINK_TYPE: INNER_KEYS, OUTER_LINK_TYPE: OUTER_KEYS, TOKEN_LINK_TYPE: TOKEN_KEYS}


def link_kind(link: nn.Module) -> str:
    """The registered kind of a link module (ValueError for a module that is no registered link)."""
    kind = getattr(link, "link_type", None)
    if kind not in LINK_KINDS:
        raise ValueError(f"{type(link).__name__} is not a saveable link kind; expected one of {sorted(LINK_KINDS)}")
    return kind


def link_args(link: nn.Module) -> dict:
    """The constructor arguments of a link that a manifest records (JSON values), beside its kind."""
    kind = link_kind(link)
    if kind == INNER_LINK_TYPE:
        return {"hidden_size": link.hidden_size}
    args = {"in_dim": link.in_dim, "out_dim": link.out_dim}
    return args | ({"num_tokens": link.num_tokens, "tau": link.tau} if kind == TOKEN_LINK_TYPE else {})


def link_state(link: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that rebuild a link anywhere (CPU; a token link's ids and temperature, never its tables)."""
    sd = {k: v.detach().cpu() for k, v in link.state_dict().items()}
    if link_kind(link) == TOKEN_LINK_TYPE:
        sd["tau"] = torch.tensor(link.tau, dtype=torch.float64)
    return sd


def expected_shapes(kind: str, args: dict) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a link of `kind` built with `args` (what a checkpoint's header must hold)."""
    if kind == INNER_LINK_TYPE:
        d = int(args["hidden_size"])
        return {f"{layer}.{p}": ((d, d) if p == "weight" and layer.startswith("proj") else (d,))
                for layer in ("proj1", "proj2", "pre_ln", "post_ln") for p in ("weight", "bias")}
    d, e = int(args["in_dim"]), int(args["out_dim"])
    if kind == OUTER_LINK_TYPE:
        return {"ln_source.weight": (d,), "ln_source.bias": (d,), "proj1.weight": (2 * e, d), "proj1.bias": (2 * e,),
                "proj2.weight": (e, 2 * e), "proj2.bias": (e,), "residual_proj.weight": (e, d),
                "residual_proj.bias": (e,), "ln_target.weight": (e,), "ln_target.bias": (e,)}
    if kind == TOKEN_LINK_TYPE:
        k = int(args["num_tokens"])
        return {"residual.weight": (e, d), "residual.bias": (e,), "source_ids": (k,), "target_ids": (k,), "tau": ()}
    raise ValueError(f"unknown link kind {kind!r}; expected one of {sorted(LINK_KINDS)}")


def kind_of_state(state_dict: dict, place: str, what: str) -> str:
    """The kind whose tensors `state_dict` holds, among the kinds that take `place` (inner or outer)."""
    keys = set(state_dict)
    for kind, want in _KIND_KEYS.items():
        if LINK_KINDS[kind] == place and keys == want:
            return kind
    expected = INNER_KEYS if place == "inner" else OUTER_KEYS
    if place == "outer" and "source_ids" in keys:
        expected = TOKEN_KEYS
    missing, unexpected = sorted(expected - keys), sorted(keys - expected)
    raise ValueError(f"{what}: state dict does not match the {place} link layout; missing keys {missing}, "
                     f"unexpected keys {unexpected}")


def link_from_state(state_dict: dict, *, place: str = "outer", what: str = "link") -> nn.Module:
    """A link of whichever registered kind `state_dict` holds (token links come back unbound)."""
    kind = kind_of_state(state_dict, place, what)
    if kind == INNER_LINK_TYPE:
        return inner_link_from_state_dict(state_dict, what=what)
    if kind == OUTER_LINK_TYPE:
        return outer_link_from_state_dict(state_dict, what=what)
    w, ids = state_dict["residual.weight"], (state_dict["source_ids"], state_dict["target_ids"])
    if w.dim() != 2 or any(i.dim() != 1 or i.is_floating_point() for i in ids) or state_dict["tau"].numel() != 1:
        raise ValueError(f"{what}: token link tensors of unexpected shapes or types (residual.weight "
                         f"{tuple(w.shape)}, ids {[tuple(i.shape) for i in ids]}, tau {tuple(state_dict['tau'].shape)})")
    if min(int(ids[0].min()), int(ids[1].min())) < 0:
        raise ValueError(f"{what}: negative token ids")
    link = TokenLink(None, None, float(state_dict["tau"]), ids=ids, dims=(int(w.shape[1]), int(w.shape[0])))
    link.residual.load_state_dict({"weight": w.float(), "bias": state_dict["residual.bias"].float()})
    return link
