"""Continuous batching for one agent: the one-position steps of every request in flight (latent rollout
steps and decode tokens) run together in shared forward passes.

    submit  merged_rollout(e_BLD, mask_BL, m) / merged_decode(e_BLD, mask_BL, cfg), from any thread; blocks
            until done (`submit_rollout` / `submit_decode`: a Future)
    admit   every request that arrived since the last step is prefilled in ONE forward (their prompts left
            padded together; prefix KV reuse as `kv_cache.prefill`), then its rows take free slots
    step    one forward over every active row: rollout rows feed inner(h) of their last step, decode
            rows their last token; decode rows then go through the LM head and pick their next token
            on the device (greedy rows in one argmax), read back to the host once per step, not per row
    leave   a row leaves at its m-th latent step, its EOS or its token budget; the last rows fill the holes

The shared cache has one row per slot and one column per position, and every active row writes its
step at the same column C: a request's prompt is copied in so that it ends at column C, left padded
like a batch of its own. Columns and positions then differ by a constant per row, as in the batch
path, so causal and sliding-window masks see exactly what they see there. Active rows occupy slots
0..n-1, so each step runs over the first n rows.

Room (`_make_room`): C advances one column per step. When the active rows' span plus their remaining steps
no longer fits, the span is moved back to the left edge in place (compaction, at most once per width/2
steps: amortised O(1) per row and step), and only when it would fill more than half the width is the cache
reallocated, with half again its columns at least and twice what it needs (slots double): O(log n)
reallocations for n arrivals (`num_rebuilds`; tests/engine/test_scheduler.py counts them).

Greedy outputs and latents equal the one-request-at-a-time path (`Agent.latent_rollout`/`decode`);
sampled decoding draws per request from the request's own generator over all its rows, as there.
No Ray here: the local backend and agent actors use the same object.

Legend: R slots, S cache columns, H key/value heads, K head dim, B a request's rows, N rows admitted together,
n active rows, M latent steps.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.engine.decoding import eos_ids, model_top_k, pick as pick_rows
from recmas_ray.engine.kv_cache import cache_kw, pad_together, static_cache

MAX_ROWS = 256
"""Rows in the shared cache (slots); a request waits until its rows fit."""


@dataclass(eq=False)
class _Request:
    kind: str
    """"rollout" or "decode"."""
    e_BLD: torch.Tensor
    mask_BL: torch.Tensor
    prefix_ids: list | None
    future: Future
    num_steps: int = 0
    cfg: DecodeConfig | None = None
    gen: object = None
    on_token: object = None
    h_BMD: torch.Tensor | None = None
    step: int = 0
    """Rollout: latent steps done (every row of a rollout steps together)."""
    tokens: list = field(default_factory=list)
    """Decode: the picked ids per row."""
    done: list = field(default_factory=list)
    """Per row: finished (left the shared cache, or never entered it)."""

    @property
    def rows(self) -> int:
        return self.e_BLD.shape[0]

    def remaining(self, b: int) -> int:
        """Steps row b still has to run."""
        if self.kind == "rollout":
            return self.num_steps - self.step
        return self.cfg.max_new_tokens - len(self.tokens[b])


class StepScheduler:
    """Continuous batching of one agent's rollouts and decodes (see the module docstring); thread-safe.
    `threaded=False` runs nothing by itself: the caller drives it with `run_once()` (tests, benchmarks)."""

    def __init__(self, agent, *, max_rows: int = MAX_ROWS, threaded: bool = True):
        self.agent, self.max_rows, self.threaded = agent, max_rows, threaded
        self._pending: list[_Request] = []
        self._rows: list[tuple[_Request, int]] = []  # slot -> (request, row)
        self._start: list[int] = []  # slot -> first cache column of its row (its left padding before it)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._keys: list[torch.Tensor] = []  # per layer [R, H, S, K]
        self._values: list[torch.Tensor] = []
        self.mask_RS: torch.Tensor | None = None
        self.pos_R: torch.Tensor | None = None
        self._last_h_RD: torch.Tensor | None = None  # each slot's latest latent h (rollout rows' next input)
        self._last_id_R: torch.Tensor | None = None  # each slot's latest picked id (decode rows' next input)
        self._eos: torch.Tensor | None = None
        self.column = 0
        self.num_steps = 0
        """Shared forwards run so far (with `rows_stepped`: rows per step, for measurements)."""
        self.rows_stepped = 0
        self.num_prefills = 0
        """Admissions: each prefills every request that arrived since the step before in one go."""
        self.num_rebuilds = 0
        """Reallocations of the shared cache (more slots or columns); compactions in place are `num_compactions`."""
        self.num_compactions = 0
        self._closed = False

    # ----------------------------------------------------------------------------- submit
    def merged_rollout(self, e_BLD, mask_BL, num_steps: int, *, prefix_ids=None) -> torch.Tensor:
        """H_BMD of `num_steps` latent steps, as `Agent.latent_rollout`."""
        return self.submit_rollout(e_BLD, mask_BL, num_steps, prefix_ids=prefix_ids).result()

    def merged_decode(self, e_BLD, mask_BL, cfg: DecodeConfig, *, prefix_ids=None,
                      on_token=None) -> list[list[int]]:
        """Token ids per row (EOS kept), as `Agent._decode_static`."""
        return self.submit_decode(e_BLD, mask_BL, cfg, prefix_ids=prefix_ids, on_token=on_token).result()

    def submit_rollout(self, e_BLD, mask_BL, num_steps: int, *, prefix_ids=None) -> Future:
        return self._submit(_Request("rollout", e_BLD, mask_BL, prefix_ids, Future(), num_steps=num_steps))

    def submit_decode(self, e_BLD, mask_BL, cfg: DecodeConfig, *, prefix_ids=None, on_token=None) -> Future:
        if cfg.do_sample and cfg.top_k < 0:
            cfg = dataclasses.replace(cfg, top_k=model_top_k(self.agent.model))
        return self._submit(_Request("decode", e_BLD, mask_BL, prefix_ids, Future(), cfg=cfg,
                                     gen=self.agent.make_generator(cfg), on_token=on_token))

    def close(self, timeout_s: float = 30.0) -> None:
        """End the step thread once the requests in flight are done (a later request starts it again). A process
        should not exit with it inside a forward: torch's threads can then abort the interpreter's shutdown."""
        with self._cond:
            self._closed = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _submit(self, req: _Request) -> Future:
        if req.rows > self.max_rows:
            raise ValueError(f"a request of {req.rows} rows; the scheduler holds {self.max_rows}")
        if req.kind == "rollout" and req.num_steps < 1:
            raise ValueError(f"latent_steps must be >= 1 here, got {req.num_steps}")
        with self._cond:
            self._pending.append(req)
            self._closed = False
            if self.threaded and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._loop, name="recmas-step-scheduler", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return req.future

    # ----------------------------------------------------------------------------- loop
    def _take(self) -> list[_Request]:
        """Pending requests whose rows fit now, in arrival order (under the lock)."""
        admit, free = [], self.max_rows - len(self._rows)
        while self._pending and self._pending[0].rows <= free:
            req = self._pending.pop(0)
            free -= req.rows
            admit.append(req)
        return admit

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._rows:
                    if self._closed or not self._cond.wait(timeout=30.0):
                        if not self._pending and not self._rows:
                            self._thread = None
                            return
                admit = self._take()
            self._cycle(admit)

    def run_once(self) -> bool:
        """Admit what arrived and run one shared step (`threaded=False`); False when there was nothing to do."""
        with self._cond:
            admit = self._take()
        if not admit and not self._rows:
            return False
        self._cycle(admit)
        return True

    def _cycle(self, admit: list[_Request]) -> None:
        try:
            with torch.no_grad():
                if admit:
                    self._admit(admit)
                if self._rows:
                    self._step()
        except BaseException as e:  # noqa: BLE001 - fail every request in flight, keep serving
            failed = {id(r): r for r, _ in self._rows}
            failed.update({id(r): r for r in admit})
            for req in failed.values():
                if not req.future.done():
                    req.future.set_exception(e)
            self._rows.clear()
            self._start.clear()

    def _admit(self, reqs: list[_Request]) -> None:
        """Prefill every arriving request in one forward (left padded to the longest prompt), take each
        rollout's first h and each decode's first token, and place the rows that go on in free slots."""
        agent = self.agent
        e_NLD, mask_NL = pad_together([(req.e_BLD, req.mask_BL) for req in reqs])
        prefix_ids = None
        if any(req.prefix_ids is not None for req in reqs):  # rows without any compute their whole prompt
            prefix_ids = [ids for req in reqs for ids in (req.prefix_ids or [[]] * req.rows)]
        out, pre = agent._prefill_static(agent._hidden_run, e_NLD, mask_NL, 0, prefix_ids)
        self.num_prefills += 1
        h_ND = out[:, -1]
        first_id_N = torch.zeros(h_ND.shape[0], dtype=torch.long, device=h_ND.device)
        entries, dec_rows, offset = [], [], 0
        for req in reqs:
            rows = list(range(offset, offset + req.rows))
            req.done = [False] * req.rows
            if req.kind == "rollout":
                req.h_BMD = h_ND.new_empty(req.rows, req.num_steps, h_ND.shape[-1])
                req.h_BMD[:, 0] = h_ND[offset:offset + req.rows]
                req.step = 1
                if req.num_steps == 1:
                    req.done = [True] * req.rows
                    req.future.set_result(req.h_BMD)
            else:
                req.tokens = [[] for _ in range(req.rows)]
                entries += [(req, b) for b in range(req.rows)]
                dec_rows += rows
            offset += req.rows
        if dec_rows:
            idx = torch.tensor(dec_rows, device=h_ND.device)
            first_id_N[idx] = self._pick(entries, agent.logits(h_ND[idx]))
        place, offset = [], 0
        for req in reqs:
            place += [(req, b, offset + b) for b in range(req.rows) if not req.done[b]]
            offset += req.rows
        if place:
            self._place(place, pre, h_ND, first_id_N, max(req.mask_BL.shape[1] for req, _, _ in place))

    def _place(self, place, pre, h_ND, first_id_N, L: int) -> None:
        """Copy the rows' prompt KV (their last L columns) into slots n.. so that it ends at column C."""
        n, k = len(self._rows), len(place)
        self._make_room(L, max(req.remaining(b) for req, b, _ in place), n + k)
        C, L_all = self.column, pre.mask_BS.shape[1]
        idx = torch.tensor([i for _, _, i in place], device=h_ND.device)
        for i, layer in enumerate(pre.cache.layers):
            self._keys[i][n:n + k, :, C - L:C] = layer.keys[idx.to(layer.keys.device), :, L_all - L:]
            self._values[i][n:n + k, :, C - L:C] = layer.values[idx.to(layer.values.device), :, L_all - L:]
        self.mask_RS[n:n + k] = 1
        self.mask_RS[n:n + k, :C - L] = 0
        self.mask_RS[n:n + k, C - L:C] = pre.mask_BS[idx, L_all - L:]
        self.pos_R[n:n + k] = pre.pos_B1[idx, 0]
        self._last_h_RD[n:n + k] = h_ND[idx]
        self._last_id_R[n:n + k] = first_id_N[idx]
        self._rows += [(req, b) for req, b, _ in place]
        self._start += [C - L] * k

    def _make_room(self, L: int, steps: int, num_rows: int) -> None:
        """Shared tensors with C >= L, `num_rows` slots and room for every active row's remaining steps: as they
        are when that fits; else the active columns moved in place to end at max(L, their span) when that needs
        at most half the width; else reallocated (columns x1.5 at least, slots doubled as needed)."""
        n = len(self._rows)
        remaining = max([steps] + [req.remaining(b) for req, b in self._rows])
        width = self._keys[0].shape[2] if self._keys else 0
        slots = self._keys[0].shape[0] if self._keys else 0
        if self._keys and L <= self.column and self.column + remaining + 1 <= width and num_rows <= slots:
            return
        lo = min(self._start + [self.column])
        used = self.column - lo  # columns the active rows use, ending at C
        new_C = max(L, used)
        need = new_C + remaining + 1
        if self._keys and num_rows <= slots and 2 * need <= width:
            self._shift(n, lo, new_C)
            self.num_compactions += 1
            return
        new_slots = max(slots, min(self.max_rows, 1 << max(0, num_rows - 1).bit_length()))
        # columns grow by half at least (geometric: O(log) reallocations) and to twice the need (room to compact)
        new_width = width if self._keys and 2 * need <= width else max(2 * need, width + width // 2)
        dev, keys, values = self._device(), [], []
        for i, (k_shape, v_shape, dtype, device) in enumerate(self._template()):
            keys.append(torch.zeros(new_slots, k_shape[0], new_width, k_shape[1], dtype=dtype, device=device))
            values.append(torch.zeros(new_slots, v_shape[0], new_width, v_shape[1], dtype=dtype, device=device))
            if n and used:
                keys[i][:n, :, new_C - used:new_C] = self._keys[i][:n, :, lo:self.column]
                values[i][:n, :, new_C - used:new_C] = self._values[i][:n, :, lo:self.column]
        mask = torch.ones(new_slots, new_width, dtype=torch.long, device=dev)
        pos = torch.zeros(new_slots, dtype=torch.long, device=dev)
        last_h = torch.zeros(new_slots, self.agent.hidden_size, dtype=self.agent.dtype, device=dev)
        last_id = torch.zeros(new_slots, dtype=torch.long, device=dev)
        if n:
            mask[:n, :new_C - used] = 0
            mask[:n, new_C - used:new_C] = self.mask_RS[:n, lo:self.column]
            pos[:n], last_h[:n], last_id[:n] = self.pos_R[:n], self._last_h_RD[:n], self._last_id_R[:n]
        self._start = [s - lo + new_C - used for s in self._start]
        self._keys, self._values, self.mask_RS, self.pos_R, self.column = keys, values, mask, pos, new_C
        self._last_h_RD, self._last_id_R = last_h, last_id
        self.num_rebuilds += 1

    def _shift(self, n: int, lo: int, new_C: int) -> None:
        """Move the active rows' columns [lo, C) to end at new_C, in place (compaction)."""
        used = self.column - lo
        if n and used and new_C != self.column:
            for t in (*self._keys, *self._values):
                t[:n, :, new_C - used:new_C] = t[:n, :, lo:self.column].clone()
            self.mask_RS[:n, new_C - used:new_C] = self.mask_RS[:n, lo:self.column].clone()
        if n:
            self.mask_RS[:n, :new_C - used] = 0
            self.mask_RS[:n, new_C:] = 1
        self._start = [s - lo + new_C - used for s in self._start]
        self.column = new_C

    def _template(self):
        """Per layer: ((H, K) of keys, (H, K) of values, dtype, device), from the model's own config."""
        if self._keys:
            return [((k.shape[1], k.shape[3]), (v.shape[1], v.shape[3]), k.dtype, k.device)
                    for k, v in zip(self._keys, self._values)]
        probe = static_cache(self.agent.model, 1)
        layers = self.agent.model.get_decoder().layers
        text = self.agent.model.config.get_text_config()
        heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        out = []
        for i in range(len(probe.layers)):
            param = next(layers[i].parameters())
            out.append(((heads, head_dim), (heads, head_dim), param.dtype, param.device))
        return out

    def _device(self):
        return self.agent.device

    def _view_cache(self, n: int):
        """A transformers cache over the first n slots (views: the step writes into the shared tensors)."""
        cache = static_cache(self.agent.model, self._keys[0].shape[2])
        for layer, k, v in zip(cache.layers, self._keys, self._values):
            layer.device, layer.batch_size, layer.num_heads = k.device, n, k.shape[1]
            layer.k_head_dim, layer.v_head_dim = k.shape[3], v.shape[3]
            layer.keys, layer.values = k[:n], v[:n]
            layer.cumulative_length = torch.tensor(self.column, device=k.device)
            layer.is_initialized = True
        return cache

    def _step(self) -> None:
        """One shared forward over every active row, then each request's bookkeeping."""
        agent, n = self.agent, len(self._rows)
        dec = [s for s, (req, _) in enumerate(self._rows) if req.kind == "decode"]
        dec_t = torch.tensor(dec, device=agent.device) if dec else None
        if not dec:  # rollout rows feed inner(h) of their last step, decode rows their last token
            e_n1D = agent.inner_link(self._last_h_RD[:n]).to(agent.dtype)[:, None]
        elif len(dec) == n:
            e_n1D = agent.model.get_input_embeddings()(self._last_id_R[:n]).to(agent.dtype)[:, None]
        else:
            is_dec = set(dec)
            roll_t = torch.tensor([s for s in range(n) if s not in is_dec], device=agent.device)
            e_n1D = torch.empty(n, 1, agent.hidden_size, dtype=agent.dtype, device=agent.device)
            e_n1D[roll_t, 0] = agent.inner_link(self._last_h_RD[roll_t]).to(agent.dtype)
            e_n1D[dec_t, 0] = agent.model.get_input_embeddings()(self._last_id_R[dec_t]).to(agent.dtype)
        self.pos_R[:n] += 1
        cache = self._view_cache(n)
        h_nD = agent.model.get_decoder()(inputs_embeds=e_n1D, attention_mask=self.mask_RS[:n],
                                         position_ids=self.pos_R[:n, None], use_cache=True,
                                         **{cache_kw(): cache}).last_hidden_state[:, -1]
        self.column += 1
        self.num_steps += 1
        self.rows_stepped += n
        self._last_h_RD[:n] = h_nD
        leaving, rollouts = [], {}
        for s, (req, b) in enumerate(self._rows):
            if req.kind == "rollout":
                rollouts.setdefault(id(req), (req, [], []))
                rollouts[id(req)][1].append(s)
                rollouts[id(req)][2].append(b)
        for req, ss, bs in rollouts.values():
            req.h_BMD[torch.tensor(bs, device=h_nD.device), req.step] = h_nD[torch.tensor(ss, device=h_nD.device)]
            req.step += 1
            if req.step == req.num_steps:
                req.done = [True] * req.rows
                leaving += ss
                req.future.set_result(req.h_BMD)
        if dec_t is not None:
            entries = [self._rows[s] for s in dec]
            self._last_id_R[dec_t] = self._pick(entries, agent.logits(h_nD[dec_t]))
            leaving += [s for s, (req, b) in zip(dec, entries) if req.done[b]]
        if leaving:
            self._leave(set(leaving))

    def _pick(self, entries: list[tuple[_Request, int]], logits_nV: torch.Tensor) -> torch.Tensor:
        """Each entry's (decode row's) next token from its logits, on the device: greedy rows in one argmax, a
        sampled request's rows from its own generator over all its rows; read back once (not per row) to record
        the tokens, stop rows at EOS or their budget and stream. Returns the picks [n]."""
        if self._eos is None:
            self._eos = eos_ids(self.agent.model, self.agent.tokenizer).to(logits_nV.device)
        picks_n = torch.empty(len(entries), dtype=torch.long, device=logits_nV.device)
        greedy = [i for i, (req, _) in enumerate(entries) if not req.cfg.do_sample]
        if len(greedy) == len(entries):
            picks_n = logits_nV.float().argmax(-1)
        elif greedy:
            g = torch.tensor(greedy, device=logits_nV.device)
            picks_n[g] = logits_nV[g].float().argmax(-1)
        sampled: dict[int, tuple[_Request, list, list]] = {}
        for i, (req, b) in enumerate(entries):
            if req.cfg.do_sample:
                sampled.setdefault(id(req), (req, [], []))[1].append(i)
                sampled[id(req)][2].append(b)
        for req, ii, bs in sampled.values():
            full_BV = logits_nV.new_zeros(req.rows, logits_nV.shape[-1])
            ii_t, bs_t = torch.tensor(ii, device=full_BV.device), torch.tensor(bs, device=full_BV.device)
            full_BV[bs_t] = logits_nV[ii_t]
            picks_n[ii_t] = pick_rows(full_BV.float(), req.cfg, req.gen)[bs_t]
        is_eos_n = torch.isin(picks_n, self._eos)
        ids, stops = torch.stack([picks_n, is_eos_n.long()]).tolist()  # the one host sync of this step
        streams: dict[int, tuple[_Request, list]] = {}
        for (req, b), tok, stop in zip(entries, ids, stops):
            req.tokens[b].append(tok)
            if req.on_token is not None:
                streams.setdefault(id(req), (req, [None] * req.rows))[1][b] = tok
            if stop or len(req.tokens[b]) >= req.cfg.max_new_tokens:
                req.done[b] = True
        for req, stream in streams.values():
            req.on_token(stream)
        for req in {id(r): r for r, _ in entries}.values():
            if all(req.done) and not req.future.done():
                req.future.set_result(req.tokens)
        return picks_n

    def _leave(self, leaving: set[int]) -> None:
        """Free the leaving slots: the last active rows that stay move into the holes below the new count."""
        n = len(self._rows)
        keep = n - len(leaving)
        holes = sorted(s for s in leaving if s < keep)
        movers = sorted(s for s in range(keep, n) if s not in leaving)
        if holes:
            dst = torch.tensor(holes, device=self.mask_RS.device)
            src = torch.tensor(movers, device=self.mask_RS.device)
            for t in (*self._keys, *self._values):
                t[dst.to(t.device)] = t[src.to(t.device)]
            for t in (self.mask_RS, self.pos_R, self._last_h_RD, self._last_id_R):
                t[dst] = t[src]
            for d, s in zip(holes, movers):
                self._rows[d], self._start[d] = self._rows[s], self._start[s]
        del self._rows[keep:], self._start[keep:]
