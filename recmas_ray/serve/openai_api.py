"""The OpenAI chat-completions surface: request checks and response bodies (no Ray, no FastAPI here).

Request (`POST /v1/chat/completions`): `model` names the system, the last `user` message is the question
(earlier messages are ignored: each request is one question to the whole system); `max_tokens` /
`max_completion_tokens`, `temperature` (0: greedy), `top_p`, `seed`, `stream`; extra body fields `task`
(math, choice, code, qa), `method`, `num_recursive_rounds`, `latent_steps`. Anything wrong is a
`RequestError` (HTTP 400, OpenAI's error body), never a server error.

Response: OpenAI's `chat.completion` (or `chat.completion.chunk` events when streaming), `usage` with
token counts, and the side field `recmas` with the per-agent, per-round trace.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any

from recmas_ray.config.checks import ConfigError, check_tree
from recmas_ray.config.recursion import METHODS, RecursionConfig
from recmas_ray.styles.base import TASK_TYPES

EXTRA_FIELDS = ("task", "method", "num_recursive_rounds", "latent_steps")
IGNORED_FIELDS = ("frequency_penalty", "presence_penalty", "logit_bias", "user", "stop", "response_format",
                  "tools", "tool_choice", "parallel_tool_calls", "metadata", "store", "stream_options",
                  "logprobs", "top_logprobs", "service_tier", "extra_body")


class RequestError(ValueError):
    """A bad request: HTTP 400 with OpenAI's `{"error": {"message", "type", "param", "code"}}` body."""

    status = 400

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


@dataclass
class ChatRequest:
    """A checked chat-completions request."""

    question: str
    task: str
    recursion: RecursionConfig
    stream: bool


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if all(isinstance(p, str) for p in parts) and len(parts) == len(content):
            return "\n".join(parts)
    raise RequestError("messages[].content must be a string or a list of text parts", param="messages")


def parse_chat_request(body: Any, *, served_name: str, defaults: RecursionConfig, default_task: str,
                       max_input_chars: int) -> ChatRequest:
    """Check a request body against the served system; raises `RequestError` with one clear line."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model != served_name:
        raise RequestError(f"unknown model {model!r}; this server serves {served_name!r} (see GET /v1/models)",
                           param="model", code="model_not_found")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise RequestError("every message must be an object with a role", param="messages")
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise RequestError("messages hold no user message (the last user message is the question)", param="messages")
    question = _text(users[-1].get("content"))
    if not question.strip():
        raise RequestError("the last user message is empty", param="messages")
    if len(question) > max_input_chars:
        raise RequestError(f"the question has {len(question)} characters; this server accepts at most "
                           f"{max_input_chars}", param="messages")
    task = body.get("task", default_task)
    if task not in TASK_TYPES:
        raise RequestError(f"unknown task {task!r}; expected one of {list(TASK_TYPES)}", param="task")
    method = body.get("method", defaults.method)
    if method not in METHODS:
        raise RequestError(f"unknown method {method!r}; expected one of {list(METHODS)}", param="method")
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported", param="n")
    for name in ("stream",):
        if not isinstance(body.get(name, False), bool):
            raise RequestError(f"{name} must be true or false", param=name)
    decode = defaults.decode
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    temperature = body.get("temperature")
    try:
        if max_tokens is not None:
            decode = dataclasses.replace(decode, max_new_tokens=_int(max_tokens, "max_tokens"))
        if temperature is not None:
            t = _num(temperature, "temperature")
            decode = dataclasses.replace(decode, do_sample=t > 0, temperature=t if t > 0 else decode.temperature)
        if body.get("top_p") is not None:
            decode = dataclasses.replace(decode, top_p=_num(body["top_p"], "top_p"))
        if body.get("seed") is not None:
            decode = dataclasses.replace(decode, seed=_int(body["seed"], "seed"))
        rc = dataclasses.replace(
            defaults, method=method, decode=decode,
            num_recursive_rounds=_int(body.get("num_recursive_rounds", defaults.num_recursive_rounds),
                                      "num_recursive_rounds"),
            latent_steps=_int(body.get("latent_steps", defaults.latent_steps), "latent_steps"))
        check_tree(rc, lambda path: path.rsplit(".", 1)[-1].replace("max_new_tokens", "max_tokens"))
    except ConfigError as e:
        raise RequestError(str(e)) from None
    return ChatRequest(question, task, rc, bool(body.get("stream", False)))


def _int(value, name) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}", param=name)
    return value


def _num(value, name) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name} must be a number, got {value!r}", param=name)
    return float(value)


def side_info(req: ChatRequest, result) -> dict:
    """The `recmas` side field: settings used and the per-agent, per-round trace."""
    rc = req.recursion
    return {"task": req.task, "method": rc.method, "num_recursive_rounds": rc.num_recursive_rounds,
            "latent_steps": req.recursion.latent_steps, "total_latent_steps": result.num_latent_steps,
            "seconds": result.seconds, "trace": result.trace}


def _usage(prompt_tokens: int, result) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": result.num_text_tokens,
            "total_tokens": prompt_tokens + result.num_text_tokens}


def _finish_reason(req: ChatRequest, result) -> str:
    decoded = [t for t in result.trace if t.get("action") == "decode"]
    return "length" if decoded and decoded[-1]["text_tokens"] >= req.recursion.decode.max_new_tokens else "stop"


def completion_body(req: ChatRequest, result, *, model: str, prompt_tokens: int) -> dict:
    """OpenAI's `chat.completion` object for one finished request."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": result.prediction},
                                         "finish_reason": _finish_reason(req, result), "logprobs": None}],
            "usage": _usage(prompt_tokens, result), "recmas": side_info(req, result)}


def stream_chunks(req: ChatRequest, result, *, model: str, prompt_tokens: int, piece_chars: int = 64):
    """Server-sent `chat.completion.chunk` events of the final agent's text, then usage and `[DONE]`."""
    import json

    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}

    def event(delta: dict, finish=None, **extra) -> str:
        return "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                                            "logprobs": None}], **extra}) + "\n\n"

    yield event({"role": "assistant", "content": ""})
    text = result.prediction
    for k in range(0, len(text), piece_chars):
        yield event({"content": text[k:k + piece_chars]})
    yield event({}, _finish_reason(req, result), usage=_usage(prompt_tokens, result), recmas=side_info(req, result))
    yield "data: [DONE]\n\n"


def models_body(model: str, *, style: str, role_models: dict[str, str]) -> dict:
    """`GET /v1/models`: the one served system."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": int(time.time()),
                                        "owned_by": "recmas_ray", "style": style, "role_models": role_models}]}
