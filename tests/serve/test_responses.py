"""Response bodies without a server: usage of every agent, n choices, stop-aware token streaming that sends
exactly the final (cut) text, and the SSE chunk layout the openai client reads."""

import json

import pytest

from recmas_ray.api_inputs import finish
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.engine.runner import SampleResult
from recmas_ray.serve.openai_api import parse_request
from recmas_ray.serve.responses import ChunkWriter, TextStream, body


@pytest.fixture(scope="module")
def tokenizer(tiny_cache):
    from transformers import AutoTokenizer

    from recmas_ray.models.loader import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny:qwen3"))


def req(kind="chat", **fields):
    base = {"model": "m", **({"messages": [{"role": "user", "content": "q?"}]} if kind == "chat" else {"prompt": "q?"})}
    return parse_request({**base, **fields}, kind=kind, served_name="m", defaults=RecursionConfig(),
                         default_task="math", max_input_chars=100)


def result(text, tokens=5, max_new_tokens=256, stops=()):
    trace = [{"role": "planner", "round": 1, "action": "rollout", "latent_steps": 4, "text_tokens": 0,
              "prompt_tokens": 30, "seconds": 0.1},
             {"role": "solver", "round": 1, "action": "decode", "latent_steps": 0, "text_tokens": tokens,
              "prompt_tokens": 40, "seconds": 0.1}]
    return finish(SampleResult(text, tokens, 4, 0.2, trace), max_new_tokens, list(stops))


def test_usage_counts_every_agents_prompt_once_per_question_and_every_choice(tokenizer):
    r = req(n=2, temperature=0.5)
    out = body(r, [result("a b"), result("c d e", tokens=7)], model="m", tokenizer=tokenizer)
    assert out["usage"] == {"prompt_tokens": 70, "completion_tokens": 12, "total_tokens": 82}
    assert out["recmas"]["usage"]["latent_steps"] == 8 and out["recmas"]["usage"]["prompt_tokens_per_role"] == {
        "planner": 30, "solver": 40}
    assert [c["index"] for c in out["choices"]] == [0, 1] and out["object"] == "chat.completion"
    cut = result("12 ## rest", tokens=9, stops=["##"])
    assert cut.prediction == "12 " and cut.finish_reason == "stop"
    assert body(req(stop="##"), [cut], model="m", tokenizer=tokenizer)["usage"]["completion_tokens"] < 9
    full = result("x", tokens=256)
    assert full.finish_reason == "length"
    assert body(req("completion"), [full], model="m", tokenizer=tokenizer)["choices"][0]["text"] == "x"


def test_text_stream_holds_back_stop_prefixes_and_ends_with_the_final_text(tokenizer):
    text = "The answer is 42. ### Explanation follows"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    for stops in ([], ["###"], ["###", "Expl"], ["42."]):
        stream = TextStream(tokenizer, stops)
        sent = "".join(stream.add(i) for i in ids)
        final = result(text, stops=stops).prediction
        assert final.startswith(sent)
        sent += stream.close(final)
        assert sent == final
        if stops:
            assert not any(s in sent for s in stops)
    stream = TextStream(tokenizer, [])
    assert sum(1 for i in ids if stream.add(i)) > 1  # more than one piece


def test_chunks_parse_as_the_openai_client_reads_them(tokenizer):
    r = req(stream=True, stream_options={"include_usage": True})
    w = ChunkWriter(r, "m")
    events = w.start(1) + w.text(0, "he") + w.text(0, "") + w.text(0, "llo") + w.finish([result("hello")], tokenizer)
    payloads = [e[len("data: "):] for e in events.split("\n\n") if e]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "hello"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "recmas" in chunks[-2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
