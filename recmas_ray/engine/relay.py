"""Two text rows over RecursiveMAS's own senders: `text_relay` and `rollout_as_text` (engine floor: no Ray).

Both run on the same agents a `recursive_mas` run loads (same base models, same inner links, same decoder prompt)
and send text where RecursiveMAS sends latents, so a comparison with it changes one thing at a time:

  text_relay       every sender, in stage order, DECODES text from a prompt that asks it to state what it knows
                   (`STATE_PROMPT`: what it was told, e.g. the hidden fact its own context holds, and what
                   answers the question), and that text goes into the receiver's slot; the decoder reads its
                   own style prompt with the upstream text in its slot. One round, like `textmas`.
  rollout_as_text  every sender runs its m-step LATENT ROLLOUT, exactly as `recursive_mas` computes it (its
                   prompt, its inner link, `Agent.latent_rollout`), and each step's last hidden state is read
                   out as its nearest token through the sender's own LM head (argmax); those m tokens, as
                   text, fill the receiver's slot where the latents would go (`AgentService.rollout_text`).
                   What the latents "say", as text. R rounds, the schedule of `recursive_mas` (feedback edges
                   carry text too).

How `text_relay` differs from `textmas` (`runner._run_text`): `textmas` prompts each sender with the style's own
template (the one its latents were trained under), which for distillation says "Do not give the final answer",
and for the hidden-fact tasks the answer is the fact, so the sender is told not to pass on the one thing the
decoder needs. `text_relay` asks each sender to state it. Text decoding never runs the inner link (the inner
link maps latent steps only), so both use the same loaded agents as RecursiveMAS; the decoder prompt is
the same in all three. Token counts: the relayed text's tokens are the sender's decoded tokens
(text_relay) or its m readout tokens (rollout_as_text), recorded per step in each sample's trace.
"""

from __future__ import annotations

from recmas_ray.styles import build_schedule, render_prompt
from recmas_ray.styles.base import split_edge
from recmas_ray.styles.role_context import question_for_role

RELAY_METHODS = ("text_relay", "rollout_as_text")
"""The methods this module runs (`runner.run_batch` hands them here)."""

STATE_PROMPT = ("{messages}Question: {question}\n\n"
                "You are the {role} agent in a multi-agent system. The {receiver} agent sees only what you write "
                "here, not what you were told. State what you know that answers the question: every fact or value "
                "you were told, and the answer if you know it. Be brief.")
"""The text relay's sender prompt: it lets the sender state what it knows (the fact it was told included). What
it was told comes first: a base model (Gemma-3-270M) repeats its prompt from the start, and with the instruction
first its 16-token message ended before the fact (0/64 at 53a7b3c)."""


def state_prompt(role: str, receivers: list[str], question: str, messages: dict[str, str]) -> str:
    """The text relay's prompt for sender `role` (`question` as `role` sees it: its own context first)."""
    heard = "".join(f"Message from the {src} agent:\n{text}\n\n" for src, text in messages.items())
    return (STATE_PROMPT.replace("{role}", role).replace("{receiver}", " and ".join(receivers) or "next")
            .replace("{messages}", heard).replace("{question}", question_for_role(question, role)))


def _slot_prompts(style, step, asked, tasks, texts: dict[str, list[str]]) -> list[str]:
    """`step`'s prompt per question, the texts received on its input edges in its slots."""
    return [render_prompt(style, step.role, step.variant, t, q, {m: texts[e][b] for m, e in step.inputs})
            for b, (q, t) in enumerate(zip(asked.of(step.role), tasks))]


def _decoder_calls(pool, style, step, asked, tasks, texts, cfg, *, scoring, score, capture_input, stream):
    """The decoder's step of both methods: its answer from its own prompt with the texts in its slots, scored,
    its input recorded (the runner's call entries)."""
    users = _slot_prompts(style, step, asked, tasks, texts)
    calls = [(step.round, step.role, "decode", pool.decode(step.role, users, [], cfg.decode, [], **(stream or {})),
              None)]
    calls += score(pool, step.role, users, [], [], scoring)
    capture_input(step.role, users)
    return calls


def run_text_relay(pool, style, asked, tasks, cfg, *, scoring, score, capture_input, ready, stream=None):
    """One round: each sender decodes from `state_prompt`; the decoder decodes from its own prompt with the
    senders' texts in its slots. Returns the runner's call list (round, role, action, handle, rows); `score`,
    `capture_input(role, users)` and `ready(value)` are the runner's (answer scoring, the decoder-input record, a
    value it already holds)."""
    texts: dict[str, list[str]] = {}  # edge -> text per question
    calls = []
    for step in build_schedule(style, 1):
        heard = [{split_edge(e)[0]: texts[e][b] for _, e in step.inputs} for b in range(len(tasks))]
        if step.decode:
            calls += _decoder_calls(pool, style, step, asked, tasks, texts, cfg, scoring=scoring, score=score,
                                    capture_input=capture_input, stream=stream)
            continue
        receivers = [split_edge(e)[1] for e in step.outputs]
        users = [state_prompt(step.role, receivers, q, heard[b]) for b, q in enumerate(asked.of(step.role))]
        decoded, stats = pool.get(pool.decode(step.role, users, [], cfg.decode, []),
                                  what=f"role {step.role}, round {step.round} (relay text)")
        calls.append((step.round, step.role, "text", ready((decoded, stats)), None))
        for edge in step.outputs:
            texts[edge] = [d.text for d in decoded]
    return calls


def run_rollout_as_text(pool, style, asked, tasks, cfg, *, scoring, score, capture_input, ready, stream=None):
    """`recursive_mas`'s schedule for R rounds where each sender's rollout is read out as text (`rollout_text`)
    and that text fills the receiver's slot. Returns the runner's call list."""
    texts: dict[str, list[str]] = {}
    calls = []
    for step in build_schedule(style, cfg.num_recursive_rounds):
        if step.decode:
            calls += _decoder_calls(pool, style, step, asked, tasks, texts, cfg, scoring=scoring, score=score,
                                    capture_input=capture_input, stream=stream)
            continue
        users = _slot_prompts(style, step, asked, tasks, texts)
        decoded, stats = pool.get(pool.rollout_text(step.role, users, [], cfg.latent_steps, []),
                                  what=f"role {step.role}, round {step.round} (rollout as text)")
        calls.append((step.round, step.role, "rollout_text", ready((decoded, stats)), None))
        for edge in step.outputs:
            texts[edge] = [d.text for d in decoded]
    return calls


__all__ = ["RELAY_METHODS", "STATE_PROMPT", "state_prompt", "run_text_relay", "run_rollout_as_text"]
