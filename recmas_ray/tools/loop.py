"""The deliberation toolcaller's tool loop: decode, run `<python>`/`<search>` calls, splice results, continue.

As the reference does, with one deliberate change: the reference resumes by re-embedding the whole
sequence after each call; here each sample keeps its KV cache and only the appended tokens are fed.

Per sample (rows are decoded one at a time, B=1, so each row has its own cache and stopping point):
  1. generate until EOS, the token budget, or a closing ``</python>``/``</search>`` (any case) in the last
     ``stop_window_tokens`` decoded tokens;
  2. on a closing tag: cut the text after the tag, parse the first unprocessed ``<python|search>...</...>`` call,
     run it (python in the sandbox with the keys file unreadable; search through ``WebSearchTool``), append
     " <result> {output} </result>", feed those tokens into the cache and go back to 1;
  3. a call beyond ``max_tool_rounds`` is not run: " [tool limit reached]" is appended and the sample stops.

Budget: ``DecodeConfig.max_new_tokens`` counts the tokens the model generates, summed over all continuations of a
sample. Result tokens are prompt-like input, not generated, so they do not count (a long tool output cannot starve
the answer); they still grow the cache. A call whose closing tag uses the last budget token is not run.

Secrets: keys are loaded where this runs (the toolcaller's machine) and every tool text passes through ``redact``.
"""
from __future__ import annotations

import logging
import math
import re
import time

import torch

from recmas_ray.engine.agent import Agent
from recmas_ray.engine.decoding import Decoded
from recmas_ray.config.recursion import DecodeConfig, ToolLoopConfig
from recmas_ray.sandbox import SandboxConfig
from recmas_ray.tools.output import ToolOutput
from recmas_ray.tools.python_tool import run_python_tool
from recmas_ray.tools.search import SearchBackend, SearchConfig, WebSearchTool, _Secrets, load_keys, redact

log = logging.getLogger(__name__)

CALL_RE = re.compile(r"<(python|search)>(.*?)</\1\s*>", re.IGNORECASE | re.DOTALL)
CLOSE_RE = re.compile(r"</(?:python|search)\s*>", re.IGNORECASE)
LIMIT_NOTE = " [tool limit reached]"


class Toolbox:
    """Runs one parsed call and returns a redacted, truncated ``ToolOutput``; never raises.

    Args:
        cfg: tool settings; its keys file is read here (ValueError when it is not a file).
        search_backend: search service for ``WebSearchTool``; None means Tavily.
    """

    def __init__(self, cfg: ToolLoopConfig, *, search_backend: SearchBackend | None = None):
        self.cfg = cfg
        self._keys = _Secrets(load_keys(cfg.tavily_keys_file))
        self.search = WebSearchTool(self._keys, search_backend, config=SearchConfig(keys_file=cfg.tavily_keys_file))
        self.sandbox = SandboxConfig(timeout_s=cfg.python_timeout_s, cpu_time_s=max(1, math.ceil(cfg.python_timeout_s)),
                                     max_output_chars=cfg.result_max_chars,
                                     deny_read_paths=(cfg.tavily_keys_file,) if cfg.tavily_keys_file else ())

    def __repr__(self) -> str:
        return f"Toolbox(num_keys={len(self._keys)}, max_tool_rounds={self.cfg.max_tool_rounds})"

    def __call__(self, kind: str, body: str) -> ToolOutput:
        """Run a "python" or "search" call with `body` as code or query."""
        start = time.monotonic()
        try:
            if kind == "python":
                out = run_python_tool(body, config=self.sandbox, echo_last_expr=self.cfg.echo_last_expr)
            elif kind == "search":
                out = self.search(body)
            else:
                out = ToolOutput(f"unknown tool {kind!r}", False, 0.0)
        except Exception as exc:  # a broken tool must not end the run; the message may quote secrets
            out = ToolOutput(f"tool error: {type(exc).__name__}: {exc}", False, time.monotonic() - start)
        text = redact(out.text, self._keys)
        if len(text) > self.cfg.result_max_chars:
            text = text[:self.cfg.result_max_chars] + "\n...[truncated]"
        return ToolOutput(text, out.ok, out.seconds)


def decode_with_tools(agent: Agent, users: list[str], latents: dict[str, torch.Tensor], cfg: DecodeConfig,
                      toolbox: Toolbox) -> list[Decoded]:
    """Tool-loop decode of a batch, row by row; `latents` maps slot -> [B, M, D]. Row b samples with seed + b."""
    if cfg.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    out = []
    for b, user in enumerate(users):
        e_1LD, mask_1L = agent.embed_batch([user], {k: v[b:b + 1] for k, v in latents.items()})
        out.append(run_tool_loop(agent, e_1LD, mask_1L, cfg, toolbox, gen=agent.make_generator(cfg, b)))
    return out


@torch.no_grad()
def run_tool_loop(agent: Agent, e_1LD: torch.Tensor, mask_1L: torch.Tensor, cfg: DecodeConfig, toolbox: Toolbox,
                  *, gen: torch.Generator | None = None) -> Decoded:
    """Decode one sample (B=1) with tool calls; the returned `Decoded.tool_calls` is its call trace."""
    assert e_1LD.shape[0] == 1, "the tool loop decodes one row at a time"
    tok, window = agent.tokenizer, toolbox.cfg.stop_window_tokens

    def closed_tag(_row: int, toks: list[int]) -> bool:
        return CLOSE_RE.search(tok.decode(toks[-window:], skip_special_tokens=True)) is not None

    state = agent.prefill(e_1LD, mask_1L)
    pieces: list[str] = []
    calls: list[dict] = []
    processed = 0  # characters of the text whose calls are handled
    generated = 0
    while generated < cfg.max_new_tokens:
        toks = agent.generate(state, cfg, max_new_tokens=cfg.max_new_tokens - generated, gen=gen,
                              stop_fn=closed_tag)[0]
        generated += len(toks)
        seg = agent.detokenize(toks)
        if not toks or not closed_tag(0, toks):  # EOS or budget
            pieces.append(seg)
            break
        seg, tail_ids = _cut_after_tag(agent, toks, seg)
        pieces.append(seg)
        text = "".join(pieces)
        call = CALL_RE.search(text, processed)
        feed_ids = tail_ids or []
        if call is not None:
            if len(calls) >= toolbox.cfg.max_tool_rounds:
                pieces.append(LIMIT_NOTE)
                break
            if generated >= cfg.max_new_tokens:
                break  # no budget left to read the result
            kind, body = call.group(1).lower(), call.group(2)
            out = toolbox(kind, body)
            result = f" <result> {out.text} </result>"
            pieces.append(result)
            calls.append({"kind": kind, "input": redact(body, toolbox._keys), "result": out.text, "ok": out.ok,
                          "seconds": round(out.seconds, 4), "round": len(calls) + 1})
            log.debug("tool call %d: %s, ok=%s, %.2fs", len(calls), kind, out.ok, out.seconds)
            # split_special_tokens: tool output that prints "<|im_end|>" must stay text, not become a control token.
            feed_ids = feed_ids + tok(result, add_special_tokens=False, split_special_tokens=True).input_ids
        processed = len("".join(pieces))  # a closing tag without its opening tag is skipped, not retried
        if tail_ids is not None or feed_ids:
            agent.feed(state, torch.tensor([feed_ids], dtype=torch.long), replace_pending=tail_ids is not None)
    return Decoded("".join(pieces), generated, calls)


def _cut_after_tag(agent: Agent, toks: list[int], seg: str) -> tuple[str, list[int] | None]:
    """Drop text after the closing tag (it can only sit in the last token, as we stop at the first tag).

    Returns (text up to the tag, None) when nothing follows the tag, else (cut text, ids that replace the last
    token in the cache). Where the last token's text is not a clean suffix (a split UTF-8 byte), nothing is cut.
    """
    tag = CLOSE_RE.search(seg)
    if tag is None or tag.end() == len(seg):
        return seg, None
    end = tag.end()
    prev = agent.detokenize(toks[:-1])
    if not seg.startswith(prev) or end <= len(prev):
        return seg, None
    tail = agent.tokenizer(seg[len(prev):end], add_special_tokens=False, split_special_tokens=True).input_ids
    return seg[:end], tail
