"""Preallocated KV cache and attention mask, and reuse of the prompt-prefix KV across calls.

The latent rollout and the decode know their final length up front (prompt + m steps, prompt + the
token budget), so one `StaticLayer` per layer and one [B, S] mask are allocated once and filled in
place: no per-step concatenation of keys, values or mask. Every layer is a full-length layer, also
the sliding-window ones (Gemma 3): the model's sliding-window mask works on cache columns, and with
left padding columns and positions differ by the same per-row offset, so the window is the same as
with transformers' own sliding cache.

Prefix reuse: the keys and values of the tokens before the first latent slot depend only on those
tokens and their positions (0..P-1, whatever the padding), so they are stored per row (`PrefixStore`)
and copied into a later call's cache at that row's columns instead of being recomputed.

Legend: B batch, L prompt columns, S cache columns, H key/value heads, P prefix tokens, K head dim.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch

BLOCK = 16
"""Prefix matches are found at multiples of this many tokens (or the whole stored prefix)."""


@functools.cache
def cache_kw() -> str:
    # transformers 5.x renamed past_key_values -> cache (the old name warns); 4.x only knows the old one.
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def out_cache(out):
    """The cache a model call returned (the attribute name differs between transformers 4.x and 5.x)."""
    return getattr(out, "cache", None) if cache_kw() == "cache" else out.past_key_values


def positions(mask_BL: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding: cumsum(mask) - 1, pads clamped to 0."""
    return (mask_BL.long().cumsum(-1) - 1).clamp(min=0)


def left_pad(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack [L_i, D] rows into (E_BLD, mask_BL), zero vectors and mask 0 on the left."""
    L = max(r.shape[0] for r in rows)
    e_BLD = rows[0].new_zeros(len(rows), L, rows[0].shape[-1])
    mask_BL = torch.zeros(len(rows), L, dtype=torch.long, device=rows[0].device)
    for b, r in enumerate(rows):
        e_BLD[b, L - r.shape[0]:] = r
        mask_BL[b, L - r.shape[0]:] = 1
    return e_BLD, mask_BL


def pad_together(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded batches (E_BLD, mask_BL) of different L stacked into one (more left padding where shorter):
    positions ignore padding, so each row computes what it computes in its own batch."""
    if len(batches) == 1:
        return batches[0]
    L = max(m.shape[1] for _, m in batches)
    e0, m0 = batches[0]
    N = sum(m.shape[0] for _, m in batches)
    e_NLD = e0.new_zeros(N, L, e0.shape[-1])
    mask_NL = m0.new_zeros(N, L)
    o = 0
    for e, m in batches:
        e_NLD[o:o + m.shape[0], L - m.shape[1]:] = e
        mask_NL[o:o + m.shape[0], L - m.shape[1]:] = m
        o += m.shape[0]
    return e_NLD, mask_NL


def static_cache(model, max_len: int):
    """A transformers Cache of full-length static layers, one per decoder layer."""
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from transformers.cache_utils import Cache, StaticLayer

    num_layers = model.config.get_text_config().num_hidden_layers
    return Cache(layers=[StaticLayer(max_cache_len=max_len) for _ in range(num_layers)])


@dataclass
class _Entry:
    ids: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (K_HPK, V_HPK)
    num_bytes: int
    index_keys: list[tuple[int, ...]] = field(default_factory=list)


class PrefixStore:
    """Least-recently-used store of per-row prefix KV, bounded in bytes, matched by token ids."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._index: dict[tuple[int, ...], tuple[int, ...]] = {}  # ids[:n] -> key of an entry holding them
        self._lock = threading.Lock()  # an agent served from threads (Ray Serve replicas) shares one store

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: list[int]) -> tuple[_Entry | None, int]:
        """The entry sharing the longest stored prefix with `ids` and that length (whole, or blocks)."""
        lengths = [len(ids)] + [n for n in range(len(ids) // BLOCK * BLOCK, 0, -BLOCK) if n != len(ids)]
        with self._lock:
            for n in lengths:
                key = self._index.get(tuple(ids[:n]))
                if key is not None:
                    self._entries.move_to_end(key)
                    return self._entries[key], n
        return None, 0

    def add(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store the KV of `ids` (per layer [H, P, K]); evicts the least recently used beyond the budget."""
        key = tuple(ids)
        num_bytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        with self._lock:
            if not key or num_bytes > self.max_bytes or key in self._entries:
                return
            entry = _Entry(key, kv, num_bytes)
            for n in [*range(BLOCK, len(key), BLOCK), len(key)]:
                entry.index_keys.append(key[:n])
                self._index[key[:n]] = key  # the newest entry answers for a shared prefix
            self._entries[key] = entry
            self.num_bytes += num_bytes
            while self.num_bytes > self.max_bytes:
                self._evict(next(iter(self._entries)))

    def _evict(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self.num_bytes -= entry.num_bytes
        for k in entry.index_keys:
            if self._index.get(k) == key:
                del self._index[k]
        # a shorter shared prefix may still be held by another entry: index it again
        for other in self._entries.values():
            for k in other.index_keys:
                self._index.setdefault(k, other.ids)


@dataclass
class Prefilled:
    """A static cache after the prompt, with what the next positions need."""

    cache: object
    """transformers Cache of full-length static layers (S columns)."""
    mask_BS: torch.Tensor
    """Attention mask over all S columns: the prompt's padding, ones after it (causality hides the future)."""
    pos_B1: torch.Tensor
    """Position id of the last prompt column."""
    tokens_prefilled: int
    """Prompt tokens (not padding) run through the model in this call."""
    tokens_reused: int
    """Prompt tokens whose KV was copied from the prefix store instead."""


GROUP_OVERHEAD_TOKENS = 32
"""Row-tokens one more prefill forward is worth: rows are split into groups by where their stored prefix
ends only when that saves more recomputed row-tokens than this per extra forward."""


def prefill(model, run: Callable, e_BLD: torch.Tensor, mask_BL: torch.Tensor, extra: int, *,
            prefix_ids: list[list[int]] | None = None, store: PrefixStore | None = None):
    """Run the prompt into a new static cache with room for `extra` more columns.

    `run(e_BTD, mask_BS, pos_BT, cache)` is the model call (decoder for hidden states, LM for logits);
    returns (its output at the last prompt column: [B, 1, D] or [B, V], Prefilled). With `prefix_ids`
    (row b's tokens before its first latent) and a store, the longest stored prefix of each row is copied
    in and each row computes only what follows it: rows whose prefixes end at different columns run in
    separate forwards (`row_groups`), so one row without a stored prefix does not make every row
    recompute its own.
    """
    B, L = mask_BL.shape
    cache = static_cache(model, L + extra)
    mask_BS = torch.ones(B, L + extra, dtype=mask_BL.dtype, device=mask_BL.device)
    mask_BS[:, :L] = mask_BL
    pos_BL = positions(mask_BL)
    if store is None or prefix_ids is None:
        out = run(e_BLD, mask_BS, pos_BL, cache)
        return out, Prefilled(cache, mask_BS, pos_BL[:, -1:], int(mask_BL.sum()), 0)
    lengths = mask_BL.sum(-1).tolist()
    rows = []
    for b in range(B):
        pad = L - int(lengths[b])
        want = prefix_ids[b][:max(int(lengths[b]) - 1, 0)]  # the last prompt token always runs
        entry, hit = store.lookup(want) if want else (None, 0)
        rows.append((pad, want, entry, hit))
    # a row with nothing stored computes from column 0, as without a store
    groups = row_groups([pad + hit if hit else 0 for pad, _, _, hit in rows], L)
    if len(groups) == 1:
        start = groups[0][0]
        if start > 0:
            _copy_prefixes(model, cache, rows, start, B, L + extra)
        out = run(e_BLD[:, start:], mask_BS, pos_BL[:, start:], cache)
    else:
        _copy_prefixes(model, cache, rows, L, B, L + extra)
        out = _run_groups(model, run, cache, groups, e_BLD, mask_BS, pos_BL, L)
    for b, (pad, want, _, hit) in enumerate(rows):
        if want and hit < len(want):
            store.add(want, [(layer.keys[b, :, pad:pad + len(want)].clone(),
                              layer.values[b, :, pad:pad + len(want)].clone()) for layer in cache.layers])
    computed = sum(int(mask_BL[idx, start:].sum()) for start, idx in groups)
    return out, Prefilled(cache, mask_BS, pos_BL[:, -1:], computed, int(mask_BL.sum()) - computed)


def row_groups(starts: list[int], L: int) -> list[tuple[int, list[int]]]:
    """Rows grouped for prefill: (first column the group computes, its rows), fewest computed row-tokens
    plus `GROUP_OVERHEAD_TOKENS` per forward (rows sorted by start, split where it pays)."""
    order = sorted(range(len(starts)), key=lambda b: starts[b])
    n = len(order)
    # best[i]: cost of the rows order[i:] ; a group order[i:j] starts at starts[order[i]] (its smallest)
    best, cut = [0.0] * (n + 1), [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i] = float("inf")
        for j in range(i + 1, n + 1):
            cost = (j - i) * (L - starts[order[i]]) + GROUP_OVERHEAD_TOKENS + best[j]
            if cost < best[i]:
                best[i], cut[i] = cost, j
    out, i = [], 0
    while i < n:
        out.append((starts[order[i]], sorted(order[i:cut[i]])))
        i = cut[i]
    return out


def _run_groups(model, run, cache, groups, e_BLD, mask_BS, pos_BL, L: int):
    """Each group's rows through their own forward on a cache of their rows (its prefix columns copied in),
    written back into `cache`; returns the last prompt column's output of every row."""
    outs = {}
    for start, idx in groups:
        sub = static_cache(model, cache.layers[0].max_cache_len)
        ix = torch.tensor(idx, device=cache.layers[0].keys.device)
        for layer, full in zip(sub.layers, cache.layers):
            layer.lazy_initialization(full.keys[ix, :, :1], full.values[ix, :, :1])
            layer.keys[:, :, :start] = full.keys[ix, :, :start]
            layer.values[:, :, :start] = full.values[ix, :, :start]
            layer.cumulative_length.fill_(start)
        out = run(e_BLD[ix, start:], mask_BS[ix], pos_BL[ix, start:], sub)
        for layer, full in zip(sub.layers, cache.layers):
            full.keys[ix, :, start:L] = layer.keys[:, :, start:L]
            full.values[ix, :, start:L] = layer.values[:, :, start:L]
        outs[start, tuple(idx)] = out[:, -1:] if out.dim() == 3 else out
    for layer in cache.layers:
        layer.cumulative_length.fill_(L)
    first = next(iter(outs.values()))
    combined = first.new_empty(len(pos_BL), *first.shape[1:])
    for (_, idx), out in outs.items():
        combined[torch.tensor(idx, device=combined.device)] = out
    return combined


def _copy_prefixes(model, cache, rows, start: int, B: int, S: int) -> None:
    """Allocate every layer's static tensors and copy each row's stored prefix into columns < start."""
    entry = next(e for _, _, e, hit in rows if hit)
    layers = model.get_decoder().layers
    for i, layer in enumerate(cache.layers):
        k_HPK, v_HPK = entry.kv[i]
        device = next(layers[i].parameters()).device  # a model split over GPUs keeps each layer's cache there
        layer.lazy_initialization(k_HPK.new_zeros(B, k_HPK.shape[0], 1, k_HPK.shape[-1], device=device),
                                  v_HPK.new_zeros(B, v_HPK.shape[0], 1, v_HPK.shape[-1], device=device))
        for b, (pad, _, e, hit) in enumerate(rows):
            n = min(hit, start - pad)
            if n > 0:
                k, v = e.kv[i]
                layer.keys[b, :, pad:pad + n] = k[:, :n].to(device)
                layer.values[b, :, pad:pad + n] = v[:, :n].to(device)
        layer.cumulative_length.fill_(start)
