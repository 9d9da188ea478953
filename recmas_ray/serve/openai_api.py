"""The OpenAI request surface: checks of `/v1/chat/completions` and `/v1/completions` bodies (no Ray, no FastAPI).

Chat: `model` names the system, the last `user` message is the question (earlier messages are ignored:
each request is one question to the whole system). Completions: `prompt` is the question (a string or
a list of them, one choice per prompt and n). Both take `max_tokens` / `max_completion_tokens`,
`temperature` (0: greedy; < 0 refused), `top_p`, `top_k`, `seed`, `n`, `stop`, `stream`,
`stream_options.include_usage`, and the extra body fields `task` (math, choice, code, qa), `method`,
`num_recursive_rounds`, `latent_steps` and `role_context` (role -> text told only to that role, as the hidden-fact
tasks tell the first stage "x = 65."; `styles.role_context`). Fields this server cannot honour (`logprobs`, `tools`,
`response_format`, penalties, ...) and unknown fields are refused with a 400 naming the field, never
silently ignored; neutral values (null, false, 0, []) of known OpenAI fields are accepted.

Anything wrong is a `RequestError` (HTTP 400, OpenAI's error body), never a server error.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from recmas_ray.api_inputs import MAX_N, MAX_STOP_STRINGS
from recmas_ray.config.checks import ConfigError, check_tree
from recmas_ray.config.recursion import METHODS, RecursionConfig
from recmas_ray.styles.role_context import with_role_context
from recmas_ray.tasks import TASK_TYPES

EXTRA_FIELDS = ("task", "method", "num_recursive_rounds", "latent_steps", "top_k", "role_context")
COMMON_FIELDS = ("model", "max_tokens", "temperature", "top_p", "seed", "n", "stop", "stream", "stream_options",
                 "user", *EXTRA_FIELDS)
CHAT_FIELDS = ("messages", "max_completion_tokens", *COMMON_FIELDS)
COMPLETION_FIELDS = ("prompt", *COMMON_FIELDS)
# OpenAI fields this server cannot honour: accepted only at their neutral value.
UNSUPPORTED_FIELDS = ("logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "functions",
                      "function_call", "response_format", "logit_bias", "frequency_penalty", "presence_penalty",
                      "echo", "best_of", "suffix", "audio", "modalities", "prediction", "reasoning_effort",
                      "web_search_options", "metadata", "store", "service_tier")
MAX_PROMPTS = 64


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
class GenRequest:
    """A checked request: its questions (chat: one; completions: one per prompt) and settings."""

    kind: str
    """chat or completion."""
    questions: list[str]
    task: str
    recursion: RecursionConfig
    stream: bool = False
    n: int = 1
    stop: list[str] = field(default_factory=list)
    include_usage: bool = False
    """stream_options.include_usage: a last chunk with usage (and no choices)."""
    seeded: bool = False
    """The request named its sampling seed (then it runs alone, so the seed reproduces it)."""

    @property
    def question(self) -> str:
        return self.questions[0]

    @property
    def sampled(self) -> bool:
        return self.recursion.decode.do_sample

    @property
    def num_rows(self) -> int:
        """Rows this request adds to a batch: one per prompt, times n when sampling (greedy copies one)."""
        return len(self.questions) * (self.n if self.sampled else 1)

    def batch_key(self, request_id: str) -> str:
        """Requests with equal keys may share a batch: same method, R, m and decoding."""
        return json.dumps([dataclasses.asdict(self.recursion), request_id if self.seeded else None])


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if all(isinstance(p, str) for p in parts) and len(parts) == len(content):
            return "\n".join(parts)
    raise RequestError("messages[].content must be a string or a list of text parts", param="messages")


def _neutral(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == [] or value == {}


def _check_fields(body: dict, allowed: tuple[str, ...]) -> None:
    for name, value in body.items():
        if name in allowed:
            continue
        if name in UNSUPPORTED_FIELDS:
            if _neutral(value):
                continue
            raise RequestError(f"{name} is not supported by this server (a RecursiveMAS system); remove it",
                               param=name, code="unsupported_parameter")
        raise RequestError(f"unknown field {name!r}; this endpoint accepts {sorted(allowed)}", param=name,
                           code="unknown_parameter")


def _check_question(question: str, max_input_chars: int, param: str) -> str:
    if not question.strip():
        raise RequestError(f"the {'last user message' if param == 'messages' else 'prompt'} is empty", param=param)
    if len(question) > max_input_chars:
        raise RequestError(f"the question has {len(question)} characters; this server accepts at most "
                           f"{max_input_chars}", param=param)
    return question


def _chat_questions(body: dict, max_input_chars: int) -> list[str]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise RequestError("every message must be an object with a role", param="messages")
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise RequestError("messages hold no user message (the last user message is the question)", param="messages")
    return [_check_question(_text(users[-1].get("content")), max_input_chars, "messages")]


def _completion_prompts(body: dict, max_input_chars: int) -> list[str]:
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise RequestError("prompt must be a string or a non-empty list of strings (token ids are not accepted)",
                           param="prompt")
    if len(prompts) > MAX_PROMPTS:
        raise RequestError(f"prompt holds {len(prompts)} prompts; at most {MAX_PROMPTS}", param="prompt")
    return [_check_question(p, max_input_chars, "prompt") for p in prompts]


def parse_request(body: Any, *, kind: str, served_name: str, defaults: RecursionConfig, default_task: str,
                  max_input_chars: int, roles: tuple[str, ...] = ()) -> GenRequest:
    """Check a chat (kind="chat") or completions (kind="completion") body; raises `RequestError`. `roles`: the
    served system's roles, the only keys `role_context` may name."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _check_fields(body, CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS)
    model = body.get("model")
    if model != served_name:
        raise RequestError(f"unknown model {model!r}; this server serves {served_name!r} (see GET /v1/models)",
                           param="model", code="model_not_found")
    questions = _with_role_context((_chat_questions if kind == "chat" else _completion_prompts)(body, max_input_chars),
                                   body.get("role_context"), roles)
    task = body.get("task", default_task)
    if task not in TASK_TYPES:
        raise RequestError(f"unknown task {task!r}; expected one of {list(TASK_TYPES)}", param="task")
    method = body.get("method", defaults.method)
    if method not in METHODS:
        raise RequestError(f"unknown method {method!r}; expected one of {list(METHODS)}", param="method")
    n = 1 if body.get("n") is None else _int(body["n"], "n")
    if not 1 <= n <= MAX_N:
        raise RequestError(f"n must be between 1 and {MAX_N}, got {n}", param="n")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise RequestError("stream_options accepts only include_usage", param="stream_options")
    return GenRequest(kind, questions, task, _recursion(body, defaults, method), stream, n,
                      _stops(body.get("stop")), bool(options.get("include_usage", False)),
                      seeded=body.get("seed") is not None)


def _with_role_context(questions: list[str], context: Any, roles: tuple[str, ...]) -> list[str]:
    """Each question with `role_context` attached (told only to the roles it names); unchanged without it."""
    if context is None:
        return questions
    if not isinstance(context, dict) or not context:
        raise RequestError("role_context must be an object mapping role names to text told only to that role",
                           param="role_context")
    unknown = sorted(set(context) - set(roles))
    if unknown:
        raise RequestError(f"role_context names {unknown}; this system's roles are {list(roles)}",
                           param="role_context")
    try:
        return [with_role_context(q, context) for q in questions]
    except ValueError as e:  # a non-string text, or a question that carries a context already
        raise RequestError(str(e), param="role_context") from None


def _stops(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them",
                           param="stop")
    return stops


def _recursion(body: dict, defaults: RecursionConfig, method: str) -> RecursionConfig:
    decode = defaults.decode
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    try:
        if max_tokens is not None:
            decode = dataclasses.replace(decode, max_new_tokens=_int(max_tokens, "max_tokens"))
        if body.get("temperature") is not None:
            t = _num(body["temperature"], "temperature")
            if t < 0:
                raise RequestError(f"temperature must be >= 0 (0: greedy), got {t:g}", param="temperature")
            decode = dataclasses.replace(decode, do_sample=t > 0, temperature=t if t > 0 else decode.temperature)
        if body.get("top_p") is not None:
            decode = dataclasses.replace(decode, top_p=_num(body["top_p"], "top_p"))
        if body.get("top_k") is not None:  # vLLM's meaning: -1 or 0 disable it
            decode = dataclasses.replace(decode, top_k=max(0, _int(body["top_k"], "top_k")))
        if body.get("seed") is not None:
            decode = dataclasses.replace(decode, seed=_int(body["seed"], "seed"))
        rc = dataclasses.replace(
            defaults, method=method, decode=decode,
            num_recursive_rounds=_int(body.get("num_recursive_rounds", defaults.num_recursive_rounds),
                                      "num_recursive_rounds"),
            latent_steps=_int(body.get("latent_steps", defaults.latent_steps), "latent_steps"))
        check_tree(rc, lambda path: path.rsplit(".", 1)[-1].replace("max_new_tokens", max_name))
    except ConfigError as e:  # a value out of range: the message starts with the request field it names
        name = str(e).split(" ", 1)[0].rstrip(":")
        raise RequestError(str(e), param=name if name in REQUEST_PARAMS else None) from None
    return rc


REQUEST_PARAMS = ("num_recursive_rounds", "latent_steps", "max_tokens", "max_completion_tokens", "temperature",
                  "top_p", "top_k", "seed")
"""Request fields the recursion settings come from (a range error names its `param`)."""


def _int(value, name) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}", param=name)
    return value


def _num(value, name) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name} must be a number, got {value!r}", param=name)
    return float(value)
