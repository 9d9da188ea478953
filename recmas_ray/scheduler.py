"""Continuous batching for one agent: the one-position steps of every request in flight (latent rollout
steps and decode tokens) run together in shared forward passes.

    submit  rollout(e_BLD, mask_BL, m) / decode(e_BLD, mask_BL, cfg), from any thread; blocks until done
    admit   a request's prompt is prefilled alone (its own forward, prefix KV reuse as `kv_cache.prefill`)
            between two shared steps, then its rows take free slots of the shared cache
    step    one forward over every active row: rollout rows feed inner(h) of their last step, decode
            rows their last token; decode rows then go through the LM head and pick their next token
    leave   a row leaves at its m-th latent step, its EOS or its token budget; its slot is reused

The shared cache has one row per slot and one column per position, and every active row writes its
step at the same column C: a request's prompt is copied in so that it ends at column C, left padded
like a batch of its own. Columns and positions then differ by a constant per row, as in the batch
path, so causal and sliding-window masks see exactly what they see there. Active rows occupy slots
0..n-1 (a leaving row's slot is filled by the last one), so each step runs over the first n rows.

Greedy outputs and latents equal the one-request-at-a-time path (`Agent.latent_rollout`/`decode`);
sampled decoding draws per request from the request's own generator over all its rows, as there.
No Ray here: the local backend and agent actors use the same object.

Legend: R slots, S cache columns, H key/value heads, K head dim, B a request's rows, M latent steps.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.kv_cache import cache_kw, static_cache

MAX_ROWS = 256
"""Rows in the shared cache (slots); a request waits until its rows fit."""


@dataclass
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
    tokens: list = field(default_factory=list)
    """Decode: the picked ids per row."""
    done: list = field(default_factory=list)
    """Per row: left the shared cache."""
    slot: list = field(default_factory=list)
    """Per row: its slot while active."""
    step: list = field(default_factory=list)
    """Per row: latent steps done (rollout) or tokens picked (decode)."""
    eos_B: torch.Tensor | None = None
    last: torch.Tensor | None = None
    """Per row: the input of its next step (rollout: h [B, D]; decode: ids [B])."""


class StepScheduler:
    """Continuous batching of one agent's rollouts and decodes (see the module docstring); thread-safe."""

    def __init__(self, agent, *, max_rows: int = MAX_ROWS):
        self.agent, self.max_rows = agent, max_rows
        self._pending: list[_Request] = []
        self._rows: list[tuple[_Request, int]] = []  # slot -> (request, row)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._keys: list[torch.Tensor] = []  # per layer [R, H, S, K]
        self._values: list[torch.Tensor] = []
        self.mask_RS: torch.Tensor | None = None
        self.pos_R: torch.Tensor | None = None
        self.column = 0
        self.num_steps = 0
        """Shared forwards run so far (with `rows_stepped`: rows per step, for measurements)."""
        self.rows_stepped = 0
        self._closed = False

    # ----------------------------------------------------------------------------- submit
    def rollout(self, e_BLD, mask_BL, num_steps: int, *, prefix_ids=None) -> torch.Tensor:
        """H_BMD of `num_steps` latent steps, as `Agent.latent_rollout`."""
        return self._submit(_Request("rollout", e_BLD, mask_BL, prefix_ids, Future(), num_steps=num_steps))

    def decode(self, e_BLD, mask_BL, cfg: DecodeConfig, *, prefix_ids=None, on_token=None) -> list[list[int]]:
        """Token ids per row (EOS kept), as `Agent._decode_static`."""
        import dataclasses

        from recmas_ray.decoding import model_top_k

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

    def _submit(self, req: _Request):
        if req.e_BLD.shape[0] > self.max_rows:
            raise ValueError(f"a request of {req.e_BLD.shape[0]} rows; the scheduler holds {self.max_rows}")
        with self._cond:
            self._pending.append(req)
            self._closed = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="recmas-step-scheduler", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return req.future.result()

    # ----------------------------------------------------------------------------- loop
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._rows:
                    if self._closed or not self._cond.wait(timeout=30.0):
                        if not self._pending and not self._rows:
                            self._thread = None
                            return
                admit = []
                free = self.max_rows - len(self._rows)
                while self._pending and self._pending[0].e_BLD.shape[0] <= free:
                    req = self._pending.pop(0)
                    free -= req.e_BLD.shape[0]
                    admit.append(req)
            try:
                with torch.no_grad():
                    for req in admit:
                        self._admit(req)
                    if self._rows:
                        self._step()
            except BaseException as e:  # noqa: BLE001 - fail every request in flight, keep serving
                failed = {id(r): r for r, _ in self._rows}
                failed.update({id(r): r for r in admit})
                for req in failed.values():
                    if not req.future.done():
                        req.future.set_exception(e)
                self._rows.clear()

    def _admit(self, req: _Request) -> None:
        agent = self.agent
        B, L = req.mask_BL.shape
        run = agent._hidden_run if req.kind == "rollout" else agent._logits_run
        out, pre = agent._prefill_static(run, req.e_BLD, req.mask_BL, 0, req.prefix_ids)
        req.done, req.step, req.slot = [False] * B, [0] * B, [-1] * B
        if req.kind == "rollout":
            h_BD = out[:, -1]
            req.h_BMD = h_BD.new_empty(B, req.num_steps, h_BD.shape[-1])
            req.h_BMD[:, 0] = h_BD
            req.step = [1] * B
            req.last = h_BD
            if req.num_steps == 1:
                req.future.set_result(req.h_BMD)
                return
        else:
            from recmas_ray.decoding import eos_ids

            req.eos_B = eos_ids(agent.model, agent.tokenizer).to(out.device)
            req.tokens = [[] for _ in range(B)]
            if self._pick(req, out):
                return
        self._place(req, pre, L)

    def _place(self, req: _Request, pre, L: int) -> None:
        """Copy the request's prompt KV into free slots so that it ends at column C."""
        B = len(req.done)
        rows = [b for b in range(B) if not req.done[b]]
        self._make_room(L, max(_remaining(req, b) for b in rows), len(self._rows) + len(rows))
        C = self.column
        for b in rows:
            slot = len(self._rows)
            self._rows.append((req, b))
            req.slot[b] = slot
            for i, layer in enumerate(pre.cache.layers):
                self._keys[i][slot, :, C - L:C] = layer.keys[b, :, :L]
                self._values[i][slot, :, C - L:C] = layer.values[b, :, :L]
            self.mask_RS[slot] = 1
            self.mask_RS[slot, :C - L] = 0
            self.mask_RS[slot, C - L:C] = req.mask_BL[b]
            self.pos_R[slot] = pre.pos_B1[b, 0]

    def _make_room(self, L: int, steps: int, num_rows: int) -> None:
        """Shared tensors with C >= L and room for every active row's remaining steps: as they are when
        they fit, else rebuilt with the columns in use moved to end at max(L, their width) (compaction)
        and grown when needed."""
        remaining = max([steps] + [_remaining(r, b) for r, b in self._rows])
        current = self._keys[0].shape[2] if self._keys else 0
        slots = self._keys[0].shape[0] if self._keys else 0
        if self._keys and L <= self.column and self.column + remaining + 1 <= current and num_rows <= slots:
            return
        # slots grow by doubling (up to max_rows): a few rebuilds, never the whole budget up front
        slots = max(slots, min(self.max_rows, 1 << max(0, num_rows - 1).bit_length()))
        lo = min([int(self.mask_RS[s].nonzero()[0]) for s in range(len(self._rows))] + [self.column])
        used = self.column - lo  # columns the active rows use, ending at C
        new_C = max(L, used)
        width = max(new_C + remaining + 1, current)
        template = self._template()
        keys, values = [], []
        for i, (k_shape, v_shape, dtype, device) in enumerate(template):
            keys.append(torch.zeros(slots, k_shape[0], width, k_shape[1], dtype=dtype, device=device))
            values.append(torch.zeros(slots, v_shape[0], width, v_shape[1], dtype=dtype, device=device))
            n = len(self._rows)
            if self._keys and used and n:
                keys[i][:n, :, new_C - used:new_C] = self._keys[i][:n, :, lo:self.column]
                values[i][:n, :, new_C - used:new_C] = self._values[i][:n, :, lo:self.column]
        mask = torch.ones(slots, width, dtype=torch.long, device=self._device())
        pos = torch.zeros(slots, dtype=torch.long, device=self._device())
        n = len(self._rows)
        if self.mask_RS is not None and n:
            mask[:n, :new_C - used] = 0
            mask[:n, new_C - used:new_C] = self.mask_RS[:n, lo:self.column]
            pos[:n] = self.pos_R[:n]
        self.pos_R = pos
        self._keys, self._values, self.mask_RS, self.column = keys, values, mask, new_C

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
        """One shared forward over every active row, then each row's bookkeeping."""
        agent, n = self.agent, len(self._rows)
        e_n1D = torch.empty(n, 1, agent.hidden_size, dtype=agent.dtype, device=agent.device)
        roll = [s for s, (r, _) in enumerate(self._rows) if r.kind == "rollout"]
        dec = [s for s, (r, _) in enumerate(self._rows) if r.kind == "decode"]
        if roll:
            h = torch.stack([self._rows[s][0].last[self._rows[s][1]] for s in roll])
            e_n1D[roll, 0] = agent.inner_link(h).to(agent.dtype)
        if dec:
            ids = torch.stack([self._rows[s][0].last[self._rows[s][1]] for s in dec])
            e_n1D[dec, 0] = agent.model.get_input_embeddings()(ids).to(agent.dtype)
        self.pos_R[:n] += 1
        cache = self._view_cache(n)
        h_nD = agent.model.get_decoder()(inputs_embeds=e_n1D, attention_mask=self.mask_RS[:n],
                                         position_ids=self.pos_R[:n, None], use_cache=True,
                                         **{cache_kw(): cache}).last_hidden_state[:, -1]
        self.column += 1
        self.num_steps += 1
        self.rows_stepped += n
        by_request: dict[int, tuple[_Request, list[tuple[int, int]]]] = {}
        for s, (req, b) in enumerate(self._rows):
            by_request.setdefault(id(req), (req, []))[1].append((s, b))
        logits = _head(agent.model, h_nD[dec]) if dec else None
        dec_index = {s: i for i, s in enumerate(dec)}
        leaving = []
        for req, members in by_request.values():
            if req.kind == "rollout":
                for s, b in members:
                    req.h_BMD[b, req.step[b]] = h_nD[s]
                    req.step[b] += 1
                    if req.step[b] == req.num_steps:
                        req.done[b] = True
                        leaving.append(s)
                req.last = _last_h(req)
                if all(req.done):
                    req.future.set_result(req.h_BMD)
            else:
                B = len(req.done)
                full = torch.zeros(B, logits.shape[-1], dtype=logits.dtype, device=logits.device)
                for s, b in members:
                    full[b] = logits[dec_index[s]]
                self._pick(req, full)
                leaving += [s for s, b in members if req.done[b]]
        self._leave(sorted(set(leaving), reverse=True))

    def _pick(self, req: _Request, logits_BV: torch.Tensor) -> bool:
        """Pick each live row's next token from [B, V] logits; True when the request is complete."""
        from recmas_ray.decoding import pick as _pick

        cfg = req.cfg
        picks = _pick(logits_BV.float(), cfg, req.gen)
        stream = []
        for b in range(len(req.done)):
            if req.done[b]:
                stream.append(None)
                continue
            tok = int(picks[b])
            req.tokens[b].append(tok)
            stream.append(tok)
            if tok in req.eos_B.tolist() or len(req.tokens[b]) >= cfg.max_new_tokens:
                req.done[b] = True
        if req.on_token is not None:
            req.on_token(stream)
        req.last = picks
        if all(req.done):
            req.future.set_result(req.tokens)
            return True
        return False

    def _leave(self, slots: list[int]) -> None:
        """Free slots (highest first): the last active row moves into each hole."""
        for s in slots:
            last = len(self._rows) - 1
            if s != last:
                req, b = self._rows[last]
                self._rows[s] = (req, b)
                req.slot[b] = s
                for k, v in zip(self._keys, self._values):
                    k[s], v[s] = k[last], v[last]
                self.mask_RS[s] = self.mask_RS[last]
                self.pos_R[s] = self.pos_R[last]
            self._rows.pop()


def _remaining(req: _Request, b: int) -> int:
    """Steps row b still has to run."""
    if req.kind == "rollout":
        return req.num_steps - req.step[b]
    return req.cfg.max_new_tokens - len(req.tokens[b])


def _last_h(req: _Request) -> torch.Tensor:
    """Each row's latest latent h [B, D] (rows at different steps)."""
    idx = torch.tensor([max(0, t - 1) for t in req.step], device=req.h_BMD.device)
    return req.h_BMD[torch.arange(req.h_BMD.shape[0], device=idx.device), idx]


def _head(model, h_nD: torch.Tensor) -> torch.Tensor:
    """Next-token logits from last hidden states, as the model's own forward computes them."""
    logits = model.get_output_embeddings()(h_nD)
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits
