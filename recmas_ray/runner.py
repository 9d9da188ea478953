"""The recursion runner: walks a style's schedule over a pool of agents, local objects or Ray actors.

One runner serves RecursiveMAS and the text baselines:
  recursive_mas      latents between agents and as feedback, R rounds; only the decoder decodes, once
  recursive_textmas  the same schedule with text in every slot (each non-final step decodes text)
  textmas            recursive_textmas with one round
  single_agent       the decoding role alone, no collaborators

The pool hides where agents live. Its calls return handles (values in-process, ObjectRefs on Ray);
the runner chains handles from step to step and only materialises texts (text methods) and small
stats, never latents, so on Ray the latents move agent to agent through the object store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from recmas_ray.config.checks import check_tree
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.styles import StyleSpec, build_schedule, render_prompt, render_single_agent_prompt



class AgentPool(Protocol):
    """What the runner needs from a set of agents (see `service.AgentService` for the semantics)."""

    def rollout(self, role: str, users: list[str], slot_names: list[str], num_steps: int,
                edges: tuple[str, ...], latents: list[Any]) -> tuple[list[Any], Any]: ...

    def decode(self, role: str, users: list[str], slot_names: list[str], cfg: DecodeConfig,
               latents: list[Any]) -> Any: ...

    def get(self, handle: Any, *, what: str) -> Any: ...

    def score(self, role: str, users: list[str], slot_names: list[str], targets: list[str], latents: list[Any],
              *, continuation: bool = False) -> Any:
        """Only when `run_batch` gets `targets` (answer likelihood): handle of (per sample: mean NLL, or
        (sum log p, greedy?) with continuation=True; stats)."""

    def retry_format(self, role: str, texts: list[str], suffixes: list[str], max_new_tokens: int, *,
                     cfg: DecodeConfig, context: tuple[DecoderInput, list[int]] | None = None) -> Any:
        """Handle of the answer-format retry's continuations (see `AgentService.retry_format`); `context`: the
        decoder's input of the batch and the rows retried, so each reply is continued after its own prompt."""

    def set_links(self, role: str, inner_state: dict, outer_states: dict[str, dict]) -> Any:
        """Handle of swapping a role's links in place, the model staying loaded (`AgentService.set_links`)."""


@dataclass
class SampleResult:
    """One question's outcome and its per-agent, per-round trace."""

    prediction: str
    num_text_tokens: int
    num_latent_steps: int
    seconds: float
    """From the submission of the question's batch to its result (the questions of a batch share it)."""
    trace: list[dict] = field(default_factory=list)
    nll: float | None = None
    """Mean token NLL of the gold target under the decoder's final prompt (only when targets were given)."""
    target_logprob: float | None = None
    """Sum log p of the target as a raw continuation of that prompt (`score_continuation`, lm-eval)."""
    target_greedy: bool | None = None
    """Whether greedy decoding would produce that continuation (`score_continuation`)."""
    finish_reason: str | None = None
    """Why the final text ended: "stop" (EOS or a stop string) or "length" (the budget); set by `System.generate`."""
    decoder_input: DecoderInput | None = field(default=None, repr=False, compare=False)
    """What the decoder received for this question's batch (prompts and latent handles): the answer-format
    retry continues the reply from there (`eval.stream.format_retry`); row `decoder_row` is this question's."""
    decoder_row: int = 0
    """This question's row in `decoder_input`."""


@dataclass
class DecoderInput:
    """The final decode's input for one batch: the decoder's prompts and the latent blocks spliced into them
    (pool handles: tensors in-process, ObjectRefs on Ray; after any ablation), in the order of its slots."""

    role: str
    users: list[str]
    slot_names: list[str]
    latents: list[Any]


def run_batch(pool: AgentPool, style: StyleSpec, questions: list[str], tasks: list[str],
              cfg: RecursionConfig, *, targets: list[str] | None = None,
              role_questions: list[dict[str, str]] | None = None,
              capture: Callable[[dict], None] | None = None, on_token=None,
              score_continuation: bool = False) -> list[SampleResult]:
    """Run one batch of questions through the style with `cfg.method`.

    `targets` (one gold answer text per question): the decoder also teacher-forces each target after
    the very prompt it decodes from (latents or upstream texts spliced in) and `SampleResult.nll` is
    its mean token negative log-likelihood; the same code path for every method. Scoring time is not
    counted in `seconds`, and traces and token counts are unchanged.

    `role_questions[b]` (optional): role -> the question text that role sees for question b (roles not
    named see `questions[b]`), for tasks where only some agents hold a fact. `capture` (measurement
    hook, e.g. `jobs.experiments.probe`): called with {"kind": "message", "round", "role", "edge",
    "message" [B, M, E] tensor} for every latent message produced, and once with {"kind":
    "decoder_input", "role", "users", "slot_names", "latents"} for the prompt the final decode starts
    from (latents after any ablation); materialising them is the hook's only cost.

    `score_continuation` (lm-eval's loglikelihood): `targets` are scored as raw continuations right after the
    decoder's prompt instead (`SampleResult.target_logprob` and `target_greedy`; no chat-template turn end).

    `on_token` (streaming): passed to the final decode step only, called with the token id picked per
    question at every decoding step (None for questions already done); see `Agent.decode`.
    """
    stream = {} if on_token is None else {"on_token": on_token}  # pools without streaming keep working
    check_tree(cfg, lambda path: path)
    if targets is not None and len(targets) != len(questions):
        raise ValueError(f"run_batch: {len(targets)} targets for {len(questions)} questions")
    if role_questions is not None and len(role_questions) != len(questions):
        raise ValueError(f"run_batch: {len(role_questions)} role_questions for {len(questions)} questions")
    asked = _Asked(questions, role_questions)
    scoring = None if targets is None else (list(targets), score_continuation)
    t0 = time.perf_counter()
    received: list[DecoderInput] = []  # the final decode's input (the last decode step's)
    if cfg.method == "single_agent":
        users = [render_single_agent_prompt(style, t, q) for q, t in zip(asked.of(style.decoder), tasks)]
        calls = [(1, style.decoder, "decode", pool.decode(style.decoder, users, [], cfg.decode, [], **stream))]
        calls += _score(pool, style.decoder, users, [], [], scoring)
        _capture_input(capture, pool, style.decoder, users, [], [], received)
    elif cfg.method == "recursive_mas":
        calls = _run_latent(pool, style, asked, tasks, cfg, scoring, capture, stream, received)
    else:
        rounds = 1 if cfg.method == "textmas" else cfg.num_recursive_rounds
        calls = _run_text(pool, style, asked, tasks, cfg, rounds, scoring, capture, stream, received)
    results = _collect(pool, calls, len(questions), t0)
    for b, res in enumerate(results):
        res.decoder_input, res.decoder_row = (received[-1] if received else None), b
    return results


@dataclass
class _Asked:
    """The question text each role sees (the same for every role unless `role_questions` says otherwise)."""

    questions: list[str]
    role_questions: list[dict[str, str]] | None

    def of(self, role: str) -> list[str]:
        if self.role_questions is None:
            return self.questions
        return [rq.get(role, q) for q, rq in zip(self.questions, self.role_questions)]


def _capture_input(capture, pool, role, users, slot_names, latents, received: list | None = None) -> None:
    if received is not None:
        received.append(DecoderInput(role, list(users), list(slot_names), list(latents)))
    if capture is not None:
        capture({"kind": "decoder_input", "role": role, "users": list(users), "slot_names": list(slot_names),
                 "latents": [pool.get(h, what=f"role {role} (captured input)") for h in latents]})


def _score(pool, role, users, slot_names, latents, scoring) -> list:
    """The scoring call of the final decode step (none without targets); `scoring` is (targets, continuation)."""
    if scoring is None:
        return []
    targets, continuation = scoring
    kw = {"continuation": True} if continuation else {}  # pools that only score turns keep working
    return [(None, role, "score", pool.score(role, users, slot_names, targets, latents, **kw))]


def _ablate(pool, handles: list, mode: str, what: str) -> list:
    """Received latent blocks replaced: shuffle = batch rolled by one (question b gets b+1's), zero = zeros."""
    if mode == "none":
        return handles
    import torch

    out = []
    for h in handles:
        x = pool.get(h, what=what)
        out.append(torch.zeros_like(x) if mode == "zero" else torch.roll(x, shifts=-1, dims=0))
    return out


def _run_latent(pool, style, asked, tasks, cfg, scoring=None, capture=None, stream=None, received=None):
    messages: dict[str, Any] = {}  # edge -> handle of its latest [B, M, E] message
    calls = []
    for step in build_schedule(style, cfg.num_recursive_rounds, decode_every_round=cfg.decode_every_round):
        users = [render_prompt(style, step.role, step.variant, t, q) for q, t in zip(asked.of(step.role), tasks)]
        slot_names = [m for m, _ in step.inputs]
        latents = _ablate(pool, [messages[e] for _, e in step.inputs], cfg.latent_ablation,
                          f"role {step.role}, round {step.round} (latents to ablate)")
        if step.decode or step.discard_decode:
            calls.append((step.round, step.role, "decode" if step.decode else "discarded_decode",
                          pool.decode(step.role, users, slot_names, cfg.decode, latents,
                                      **((stream or {}) if step.decode else {}))))
            if step.decode:
                calls += _score(pool, step.role, users, slot_names, latents, scoring)
                _capture_input(capture, pool, step.role, users, slot_names, latents, received)
        if step.outputs:
            outs, stats = pool.rollout(step.role, users, slot_names, cfg.latent_steps, step.outputs, latents)
            messages.update(zip(step.outputs, outs))
            for edge, h in zip(step.outputs, outs) if capture is not None else ():
                capture({"kind": "message", "round": step.round, "role": step.role, "edge": edge,
                         "message": pool.get(h, what=f"role {step.role}, round {step.round} (captured message)")})
            calls.append((step.round, step.role, "rollout", stats))
    return calls


def _run_text(pool, style, asked, tasks, cfg, rounds, scoring=None, capture=None, stream=None, received=None):
    texts: dict[str, list[str]] = {}  # edge -> latest text per sample
    calls = []
    for step in build_schedule(style, rounds):
        users = [render_prompt(style, step.role, step.variant, t, q, {m: texts[e][b] for m, e in step.inputs})
                 for b, (q, t) in enumerate(zip(asked.of(step.role), tasks))]
        handle = pool.decode(step.role, users, [], cfg.decode, [], **((stream or {}) if step.decode else {}))
        if step.decode:
            calls.append((step.round, step.role, "decode", handle))
            calls += _score(pool, step.role, users, [], [], scoring)
            _capture_input(capture, pool, step.role, users, [], [], received)
            continue
        decoded, stats = pool.get(handle, what=f"role {step.role}, round {step.round} (text)")
        calls.append((step.round, step.role, "text", _Ready((decoded, stats))))
        for edge in step.outputs:
            texts[edge] = [d.text for d in decoded]
    return calls


@dataclass
class _Ready:
    """A result the runner already holds (text steps are materialised to render the next prompt)."""

    value: Any


def _collect(pool, calls, batch_size, t0) -> list[SampleResult]:
    results = [SampleResult("", 0, 0, 0.0) for _ in range(batch_size)]
    score_seconds = 0.0
    for rnd, role, action, handle in calls:
        value = handle.value if isinstance(handle, _Ready) else pool.get(handle, what=f"role {role}, round {rnd} ({action})")
        if action == "score":  # answer likelihood: no trace entry, no tokens, its time not counted
            scores, stats = value
            score_seconds += stats["seconds"]
            for res, score in zip(results, scores):
                if isinstance(score, (list, tuple)):  # a continuation: (sum log p, greedy?)
                    res.target_logprob, res.target_greedy = float(score[0]), bool(score[1])
                else:
                    res.nll = float(score)
            continue
        decoded, stats = value if action != "rollout" else (None, value)
        for b, res in enumerate(results):
            entry = {"role": role, "round": rnd, "action": action, "latent_steps": stats["latent_steps"],
                     "text_tokens": stats["text_tokens"][b], "seconds": stats["seconds"] / batch_size}
            if stats.get("prompt_tokens"):  # the prompt as this agent read it (latent positions not counted)
                entry["prompt_tokens"] = stats["prompt_tokens"][b]
            if decoded is not None and action != "decode":
                entry["text"] = decoded[b].text
            if decoded is not None and getattr(decoded[b], "tool_calls", None):
                entry["tool_calls"] = decoded[b].tool_calls
            res.trace.append(entry)
            res.num_text_tokens += entry["text_tokens"]
            res.num_latent_steps += entry["latent_steps"]
            if action == "decode":
                res.prediction = decoded[b].text
    elapsed = time.perf_counter() - t0 - score_seconds  # includes waiting for the last remote call
    for res in results:  # each question's latency: its batch was submitted together and came back together
        res.seconds = elapsed
    return results


def retry_context_args(context: tuple[DecoderInput, list[int]] | None) -> tuple[list, dict]:
    """(latent handles, keyword arguments) of `AgentService.retry_format` for a retry `context` (none: the bare
    continuation); the latents go positionally so Ray resolves them."""
    if context is None:
        return [], {}
    inp, rows = context
    return list(inp.latents), {"users": list(inp.users), "slot_names": list(inp.slot_names), "rows": list(rows)}


class LocalPool:
    """In-process pool: handles are plain values and every call runs immediately."""

    def __init__(self, services: dict):
        self.services = services

    def rollout(self, role, users, slot_names, num_steps, edges, latents):
        *msgs, stats = self.services[role].rollout(users, slot_names, num_steps, edges, *latents)
        return msgs, stats

    def decode(self, role, users, slot_names, cfg, latents, **stream):
        return self.services[role].decode(users, slot_names, cfg, *latents, **stream)

    def score(self, role, users, slot_names, targets, latents, **kw):
        return self.services[role].score(users, slot_names, targets, *latents, **kw)

    def retry_format(self, role, texts, suffixes, max_new_tokens, *, cfg, context=None):
        latents, kw = retry_context_args(context)
        return self.services[role].retry_format(texts, suffixes, max_new_tokens, *latents, cfg=cfg, **kw)

    def set_links(self, role, inner_state, outer_states):
        return self.services[role].set_links(inner_state, outer_states)

    def get(self, handle, *, what):
        return handle
