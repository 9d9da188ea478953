"""The recursion runner: walks a style's schedule over a pool of agents, local objects or Ray actors.

One runner serves RecursiveMAS and the text baselines:
  recursive_mas      latents between agents and as feedback, R rounds; only the decoder decodes, once
  recursive_textmas  the same schedule with text in every slot (each non-final step decodes text)
  textmas            recursive_textmas with one round
  single_agent       the decoding role alone, no collaborators
  text_relay         the senders state what they know as text (`relay.py`; how it differs from textmas there)
  rollout_as_text    recursive_mas's rollouts read out as their argmax tokens and sent as text (`relay.py`)

The pool (`pool.AgentPool`) hides where agents live. Its calls return handles (values in-process,
ObjectRefs on Ray, or handles of calls the Ray pool submits once their inputs exist); the runner chains
handles from step to step and only materialises texts (text methods) and small stats, never latents, so on
Ray the latents move agent to agent through the object store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from recmas_ray.config.checks import check_tree
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.engine import relay
from recmas_ray.engine.pool import AgentPool, DecoderInput
from recmas_ray.styles import StyleSpec, build_schedule, render_prompt, render_single_agent_prompt


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
    num_rounds: int | None = None
    """Rounds this question ran (recursive methods): R, or fewer when adaptive rounds stopped it early."""
    round_changes: list[float] = field(default_factory=list)
    """Adaptive rounds only: the change of its decoder's latent input at each check, rounds 2, 3, ...
    (`RecursionConfig.adaptive_threshold`)."""


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
    if on_token is not None and _adaptive(cfg):
        raise ValueError("adaptive rounds (adaptive_threshold) decode questions in several calls and do not "
                         "stream tokens; leave adaptive_threshold unset to stream")
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
        calls = [(1, style.decoder, "decode", pool.decode(style.decoder, users, [], cfg.decode, [], **stream), None)]
        calls += _score(pool, style.decoder, users, [], [], scoring)
        _capture_input(capture, pool, style.decoder, users, [], [], received)
    elif cfg.method == "recursive_mas":
        calls = _run_latent(pool, style, asked, tasks, cfg, scoring, capture, stream, received)
    elif cfg.method in ("text_relay", "rollout_as_text"):
        run = relay.run_text_relay if cfg.method == "text_relay" else relay.run_rollout_as_text
        calls = run(pool, style, asked, tasks, cfg, scoring=scoring, score=_score, ready=_Ready, stream=stream,
                    capture_input=lambda role, users: _capture_input(capture, pool, role, users, [], [], received))
    else:
        rounds = 1 if cfg.method == "textmas" else cfg.num_recursive_rounds
        calls = _run_text(pool, style, asked, tasks, cfg, rounds, scoring, capture, stream, received)
    results = _collect(pool, calls, len(questions), t0)
    for inp, rows in received:  # each final decode's input and the questions it decoded
        for pos, b in enumerate(rows):
            results[b].decoder_input, results[b].decoder_row = inp, pos
    return results


def _adaptive(cfg: RecursionConfig) -> bool:
    return cfg.method == "recursive_mas" and cfg.adaptive_threshold is not None


@dataclass
class _Asked:
    """The question text each role sees (the same for every role unless `role_questions` says otherwise)."""

    questions: list[str]
    role_questions: list[dict[str, str]] | None

    def of(self, role: str) -> list[str]:
        if self.role_questions is None:
            return self.questions
        return [rq.get(role, q) for q, rq in zip(self.questions, self.role_questions)]


def _capture_input(capture, pool, role, users, slot_names, latents, received: list | None = None,
                   rows: list[int] | None = None) -> None:
    """Record a final decode's input (`received`: (DecoderInput, the questions' rows)) and show it to `capture`
    (with "rows" when it decodes only some questions of the batch: adaptive rounds)."""
    if received is not None:
        received.append((DecoderInput(role, list(users), list(slot_names), list(latents)),
                         list(range(len(users))) if rows is None else list(rows)))
    if capture is not None:
        event = {"kind": "decoder_input", "role": role, "users": list(users), "slot_names": list(slot_names),
                 "latents": [pool.get(h, what=f"role {role} (captured input)") for h in latents]}
        capture(event if rows is None else {**event, "rows": list(rows)})


def _score(pool, role, users, slot_names, latents, scoring, rows: list[int] | None = None) -> list:
    """The scoring call of the final decode step (none without targets); `scoring` is (targets, continuation);
    `rows`: the questions decoded (all when None)."""
    if scoring is None:
        return []
    targets, continuation = scoring
    if rows is not None:
        targets = [targets[b] for b in rows]
    kw = {"continuation": True} if continuation else {}  # pools that only score turns keep working
    return [(None, role, "score", pool.score(role, users, slot_names, targets, latents, **kw), rows)]


def _ablate(pool, handles: list, mode: str, what: str) -> list:
    """Received latent blocks replaced: shuffle = batch rolled by one (question b gets b+1's), zero = zeros."""
    if mode == "none":
        return handles
    import torch  # lazy: torch must not load with --help or before a job's first line

    out = []
    for h in handles:
        x = pool.get(h, what=what)
        out.append(torch.zeros_like(x) if mode == "zero" else torch.roll(x, shifts=-1, dims=0))
    return out


def _run_latent(pool, style, asked, tasks, cfg, scoring=None, capture=None, stream=None, received=None):
    """The latent schedule; with `cfg.adaptive_threshold` each question may stop before the decoder's step of a
    round (`_stop_check`), its final decode then being the one a fixed run of that many rounds makes."""
    num_rounds, threshold = cfg.num_recursive_rounds, cfg.adaptive_threshold
    batch = _Rows(pool, list(range(len(tasks))))
    messages: dict[str, tuple[Any, list[int]]] = {}  # edge -> (handle of its latest [B', M, E] message, its rows)
    previous: tuple[list, list[int]] | None = None  # the decoder's inputs of the last round checked, their rows
    calls = []
    for step in build_schedule(style, num_rounds, decode_every_round=cfg.decode_every_round):
        if not batch.active:
            break
        if threshold is not None and step.role == style.decoder and step.round < num_rounds:
            previous = _stop_check(pool, style, asked, tasks, cfg, step, batch, messages, previous, calls,
                                   scoring, capture, received)
            if not batch.active:
                break
        rows = batch.rows_arg()
        seen = asked.of(step.role)
        users = [render_prompt(style, step.role, step.variant, tasks[b], seen[b]) for b in batch.active]
        slot_names = [m for m, _ in step.inputs]
        latents = _ablate(pool, [batch.take(step.role, messages[e]) for _, e in step.inputs], cfg.latent_ablation,
                          f"role {step.role}, round {step.round} (latents to ablate)")
        if step.decode or step.discard_decode:
            calls.append((step.round, step.role, "decode" if step.decode else "discarded_decode",
                          pool.decode(step.role, users, slot_names, cfg.decode, latents,
                                      **((stream or {}) if step.decode else {})), rows))
            if step.decode:
                calls += _score(pool, step.role, users, slot_names, latents, scoring, rows)
                _capture_input(capture, pool, step.role, users, slot_names, latents, received, rows)
        if step.outputs:
            outs, stats = pool.rollout(step.role, users, slot_names, cfg.latent_steps, step.outputs, latents)
            messages.update((e, (h, list(batch.active))) for e, h in zip(step.outputs, outs))
            for edge, h in zip(step.outputs, outs) if capture is not None else ():
                event = {"kind": "message", "round": step.round, "role": step.role, "edge": edge,
                         "message": pool.get(h, what=f"role {step.role}, round {step.round} (captured message)")}
                capture(event if rows is None else {**event, "rows": rows})
            calls.append((step.round, step.role, "rollout", stats, rows))
    return calls


@dataclass
class _Rows:
    """The questions of a batch still in the recursion (adaptive rounds drop those that stopped)."""

    pool: Any
    active: list[int]
    stopped_any: bool = False

    def rows_arg(self) -> list[int] | None:
        """The active rows of a call's results, None while they are the whole batch in order."""
        return list(self.active) if self.stopped_any else None

    def take(self, role: str, message: tuple[Any, list[int]], rows: list[int] | None = None) -> Any:
        """The message's handle cut to `rows` (default: the active ones) where `role` reads it."""
        handle, have = message
        want = self.active if rows is None else rows
        if have == want:
            return handle
        return self.pool.select_rows(role, handle, [have.index(b) for b in want])


def _stop_check(pool, style, asked, tasks, cfg, step, batch, messages, previous, calls, scoring, capture, received):
    """Adaptive rounds, before the decoder's step of round r < R: compare its forward latent inputs with those of
    round r - 1; questions whose relative change is below the threshold leave the batch and decode now from
    round r's inputs, with the step a fixed R = r run makes there. Returns this round's (inputs, rows)."""
    forward = [(m, e) for m, e in step.inputs if e in style.forward_edges]
    current = ([messages[e] for _, e in forward], list(batch.active))
    if previous is None:  # round 1: nothing to compare with yet
        return current
    old_msgs, old_rows = previous
    what = f"role {step.role}, round {step.round} (latent change)"
    changes = pool.get(pool.latent_change(step.role, [old_rows.index(b) for b in batch.active],
                                          [h for h, _ in old_msgs], [batch.take(step.role, m) for m in current[0]]),
                       what=what)
    calls.append((step.round, step.role, "check", _Ready(changes), list(batch.active)))
    stop = [b for b, c in zip(batch.active, changes) if c < cfg.adaptive_threshold]
    if stop:
        final = next(s for s in build_schedule(style, step.round) if s.round == step.round and s.role == style.decoder)
        seen = asked.of(final.role)
        users = [render_prompt(style, final.role, final.variant, tasks[b], seen[b]) for b in stop]
        slot_names = [m for m, _ in final.inputs]
        latents = _ablate(pool, [batch.take(final.role, messages[e], stop) for _, e in final.inputs],
                          cfg.latent_ablation, f"role {final.role}, round {final.round} (latents to ablate)")
        calls.append((final.round, final.role, "decode", pool.decode(final.role, users, slot_names, cfg.decode,
                                                                      latents), stop))
        calls += _score(pool, final.role, users, slot_names, latents, scoring, stop)
        _capture_input(capture, pool, final.role, users, slot_names, latents, received, stop)
        batch.active = [b for b in batch.active if b not in stop]
        batch.stopped_any = True
    return current


def _run_text(pool, style, asked, tasks, cfg, rounds, scoring=None, capture=None, stream=None, received=None):
    texts: dict[str, list[str]] = {}  # edge -> latest text per sample
    calls = []
    for step in build_schedule(style, rounds):
        users = [render_prompt(style, step.role, step.variant, t, q, {m: texts[e][b] for m, e in step.inputs})
                 for b, (q, t) in enumerate(zip(asked.of(step.role), tasks))]
        handle = pool.decode(step.role, users, [], cfg.decode, [], **((stream or {}) if step.decode else {}))
        if step.decode:
            calls.append((step.round, step.role, "decode", handle, None))
            calls += _score(pool, step.role, users, [], [], scoring)
            _capture_input(capture, pool, step.role, users, [], [], received)
            continue
        decoded, stats = pool.get(handle, what=f"role {step.role}, round {step.round} (text)")
        calls.append((step.round, step.role, "text", _Ready((decoded, stats)), None))
        for edge in step.outputs:
            texts[edge] = [d.text for d in decoded]
    return calls


@dataclass
class _Ready:
    """A result the runner already holds (text steps are materialised to render the next prompt)."""

    value: Any


def _await_last(pool, calls) -> None:
    """Wait for the batch's last call first: its upstream calls have finished once it has, so reading the calls in
    order then waits once, not once per call (on Ray, each wait wakes this batch's thread). A failure is left to
    the reading in order, which names the first call that failed; a timeout is raised here (waiting again per
    call would double it)."""
    last = next((c for c in reversed(calls) if not isinstance(c[3], _Ready)), None)
    if last is None:
        return
    rnd, role, action, handle, _ = last
    try:
        pool.get(handle, what=f"role {role}, round {rnd} ({action})")
    except Exception as e:  # noqa: BLE001 - see above
        if isinstance(e, TimeoutError) or isinstance(e.__cause__, TimeoutError):
            raise


def _read_calls(pool, calls) -> list:
    """Every call's value, in order. A pool that waits for several handles at once (`get_all`: on Ray, one
    `ray.get` for the batch) reads them together; otherwise the last call is awaited first (`_await_last`)."""
    remote = [(c[3], f"role {c[1]}, round {c[0]} ({c[2]})") for c in calls if not isinstance(c[3], _Ready)]
    get_all = getattr(pool, "get_all", None)
    if get_all is not None and remote:
        values = iter(get_all([h for h, _ in remote], whats=[w for _, w in remote]))
    else:
        _await_last(pool, calls)
        values = (pool.get(h, what=w) for h, w in remote)
    return [c[3].value if isinstance(c[3], _Ready) else next(values) for c in calls]


def _collect(pool, calls, batch_size, t0) -> list[SampleResult]:
    """Results per question from the calls (round, role, action, handle, rows): `rows` names the questions a
    call served, in its order (None: the whole batch)."""
    results = [SampleResult("", 0, 0, 0.0) for _ in range(batch_size)]
    score_seconds = 0.0
    for (rnd, role, action, _, rows), value in zip(calls, _read_calls(pool, calls)):
        served = [results[b] for b in (range(batch_size) if rows is None else rows)]
        if action == "check":  # adaptive rounds: the change each question's decoder input showed
            for res, change in zip(served, value):
                res.round_changes.append(float(change))
            continue
        if action == "score":  # answer likelihood: no trace entry, no tokens, its time not counted
            scores, stats = value
            score_seconds += stats["seconds"]
            for res, score in zip(served, scores):
                if isinstance(score, (list, tuple)):  # a continuation: (sum log p, greedy?)
                    res.target_logprob, res.target_greedy = float(score[0]), bool(score[1])
                else:
                    res.nll = float(score)
            continue
        decoded, stats = value if action != "rollout" else (None, value)
        for b, res in enumerate(served):
            entry = {"role": role, "round": rnd, "action": action, "latent_steps": stats["latent_steps"],
                     "text_tokens": stats["text_tokens"][b], "seconds": stats["seconds"] / len(served)}
            if stats.get("prompt_tokens"):  # the prompt as this agent read it (latent positions not counted)
                entry["prompt_tokens"] = stats["prompt_tokens"][b]
            if stats.get("channel"):  # token links: what crossed each edge for this question (service._channel)
                entry["channel"] = {e: {k: v[b] for k, v in c.items()} for e, c in stats["channel"].items()}
            if decoded is not None and action != "decode":
                entry["text"] = decoded[b].text
            if decoded is not None and getattr(decoded[b], "tool_calls", None):
                entry["tool_calls"] = decoded[b].tool_calls
            res.trace.append(entry)
            res.num_text_tokens += entry["text_tokens"]
            res.num_latent_steps += entry["latent_steps"]
            if action == "decode":
                res.prediction, res.num_rounds = decoded[b].text, rnd
    elapsed = time.perf_counter() - t0 - score_seconds  # includes waiting for the last remote call
    for res in results:  # each question's latency: its batch was submitted together and came back together
        res.seconds = elapsed
    return results
