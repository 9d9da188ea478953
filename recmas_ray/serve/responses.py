"""OpenAI response bodies of finished requests, streamed chunks, and usage (no Ray, no FastAPI here).

One request has `len(questions) x n` choices; choice `i * n + k` is answer k of question i. Usage:
`prompt_tokens` counts what every agent read (each agent's prompt in its own tokenizer, every round;
latent positions not counted), once per question; `completion_tokens` the final agent's tokens of every
choice (after a stop string: the kept text's tokens); the side field `recmas.usage` adds the latent
steps of every agent and the tokens intermediate text steps wrote (text methods).
"""

from __future__ import annotations

import json
import time
import uuid

from recmas_ray.api_inputs import cut_at_stop
from recmas_ray.serve.openai_api import GenRequest


def completion_tokens(req: GenRequest, result, tokenizer) -> int:
    """Final agent's tokens of one choice: as decoded, or of the kept text when a stop string may have cut it."""
    decoded = [t for t in result.trace if t.get("action") == "decode"]
    full = decoded[-1]["text_tokens"] if decoded else 0
    if req.stop and result.finish_reason == "stop":
        return min(full, len(tokenizer(result.prediction, add_special_tokens=False).input_ids))
    return full


def usage(req: GenRequest, choices: list, tokenizer) -> tuple[dict, dict]:
    """(OpenAI `usage`, the side usage) of a request's choices (`choices[i * n + k]`)."""
    firsts = choices[::req.n]  # one result per question: what its agents read
    prompt = sum(t.get("prompt_tokens", 0) for r in firsts for t in r.trace)
    completion = sum(completion_tokens(req, r, tokenizer) for r in choices)
    side = {"latent_steps": sum(r.num_latent_steps for r in choices),
            "intermediate_text_tokens": sum(t["text_tokens"] for r in choices for t in r.trace
                                            if t.get("action") != "decode"),
            "prompt_tokens_per_role": _per_role(firsts)}
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}, side


def _per_role(results) -> dict:
    out: dict[str, int] = {}
    for r in results:
        for t in r.trace:
            out[t["role"]] = out.get(t["role"], 0) + t.get("prompt_tokens", 0)
    return out


def side_info(req: GenRequest, choices: list, side_usage: dict) -> dict:
    """The `recmas` side field: settings used, side usage and the per-agent, per-round trace of choice 0."""
    rc = req.recursion
    return {"task": req.task, "method": rc.method, "num_recursive_rounds": rc.num_recursive_rounds,
            "latent_steps": rc.latent_steps, "total_latent_steps": choices[0].num_latent_steps,
            "seconds": choices[0].seconds, "usage": side_usage, "trace": choices[0].trace}


def body(req: GenRequest, choices: list, *, model: str, tokenizer) -> dict:
    """`chat.completion` or `text_completion` object of a finished request."""
    use, side = usage(req, choices, tokenizer)
    if req.kind == "chat":
        items = [{"index": i, "message": {"role": "assistant", "content": r.prediction},
                  "finish_reason": r.finish_reason, "logprobs": None} for i, r in enumerate(choices)]
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion"}
    else:
        items = [{"index": i, "text": r.prediction, "finish_reason": r.finish_reason, "logprobs": None}
                 for i, r in enumerate(choices)]
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion"}
    return {**head, "created": int(time.time()), "model": model, "choices": items, "usage": use,
            "recmas": side_info(req, choices, side)}


class ChunkWriter:
    """Server-sent events of one streamed request (chat.completion.chunk or text_completion)."""

    def __init__(self, req: GenRequest, model: str):
        self.req = req
        chat = req.kind == "chat"
        self.base = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                     "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": model}

    def _event(self, choices: list, **extra) -> str:
        return "data: " + json.dumps({**self.base, "choices": choices, **extra}) + "\n\n"

    def _choice(self, index: int, text: str | None, finish=None) -> dict:
        if self.req.kind == "chat":
            delta = {} if text is None else {"content": text}
            return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}

    def start(self, num_choices: int) -> str:
        if self.req.kind != "chat":
            return ""
        return self._event([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                             "logprobs": None} for i in range(num_choices)])

    def text(self, index: int, text: str) -> str:
        return self._event([self._choice(index, text)]) if text else ""

    def finish(self, choices: list, tokenizer) -> str:
        use, side = usage(self.req, choices, tokenizer)
        out = self._event([self._choice(i, None, r.finish_reason) for i, r in enumerate(choices)],
                          recmas=side_info(self.req, choices, side))
        if self.req.include_usage:
            out += self._event([], usage=use)
        return out + "data: [DONE]\n\n"

    @staticmethod
    def error(message: str) -> str:
        return "data: " + json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                                "code": None}}) + "\n\ndata: [DONE]\n\n"


class TextStream:
    """One row's text as its tokens arrive: incremental detokenization that holds back what could still
    become a stop string, and stops at the first one (the text sent equals the final, cut prediction)."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def add(self, token_id: int) -> str:
        """The new text that can be sent after this token ("" while it is held back)."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.sent):  # a partial character: wait for more
            return ""
        text, hit = cut_at_stop(text, self.stops)
        if hit:
            self.stopped = True
            return self._send(text)
        return self._send(text[:len(text) - self.hold] if self.hold else text)

    def close(self, final: str) -> str:
        """The rest of the final (already cut) text."""
        self.stopped = True
        return self._send(final) if final.startswith(self.sent) else ""

    def _send(self, text: str) -> str:
        if len(text) <= len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta
