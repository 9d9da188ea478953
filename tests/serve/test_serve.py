"""jobs/serve.py over real HTTP on 127.0.0.1 with the official openai client: answers, usage and trace,
8 concurrent requests, streaming, and 400s with a message for bad requests (never a 500)."""

import json
import socket
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("ray.serve")

from jobs import serve as serve_job  # noqa: E402

pytestmark = pytest.mark.integration  # Serve controller, proxy, replica and agent actors: ~30-90 s here

MODEL = "recmas-test"
FAST = {"num_recursive_rounds": 1, "latent_steps": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(ray_cluster, tiny_cache):
    import ray
    from ray import serve

    had_serve = any(a["name"] == "SERVE_CONTROLLER_ACTOR" for a in ray.util.list_named_actors(all_namespaces=True))
    cfg = serve_job.parse(["--style", "sequential_light", "--role_model", "solver=tiny:qwen3", "--model_name", MODEL,
                           "--backend", "ray", "--port", str(_free_port()), "--app_name", "recmas-test",
                           "--num_recursive_rounds", "2", "--latent_steps", "4", "--max_new_tokens", "6",
                           "--max_input_chars", "200", "--timeout_s", "120"])
    url = serve_job.start(cfg)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=180, max_retries=0)
    try:
        yield url, client
    finally:
        serve.delete(cfg.app_name)
        if not had_serve:
            serve.shutdown()


def ask(client, question="What is 7 * 8?", **kw):
    extra = {**FAST, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          max_tokens=kw.pop("max_tokens", 6), extra_body=extra, **kw)


def test_models_and_a_completion(server):
    _, client = server
    assert [m.id for m in client.models.list().data] == [MODEL]
    resp = ask(client, messages_note := "What is 7 * 8?")
    assert resp.model == MODEL and resp.object == "chat.completion" and messages_note
    choice = resp.choices[0]
    assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    side = resp.model_extra["recmas"]
    assert side["method"] == "recursive_mas" and side["num_recursive_rounds"] == 1 and side["latent_steps"] == 2
    assert [t["role"] for t in side["trace"]] == ["planner", "critic", "solver"]
    assert side["trace"][-1]["text_tokens"] == resp.usage.completion_tokens
    text = ask(client, extra_body={"method": "recursive_textmas", "task": "math"})
    assert text.model_extra["recmas"]["method"] == "recursive_textmas" and text.usage.completion_tokens > 0


def test_eight_concurrent_requests_are_all_answered(server):
    _, client = server
    questions = [f"What is {i} + {i}?" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda q: ask(client, q), questions))
    assert len(answers) == 8 and all(isinstance(a.choices[0].message.content, str) for a in answers)
    assert len({a.id for a in answers}) == 8


def test_streaming_gives_the_final_agents_text(server):
    _, client = server
    whole = ask(client, "What is 3 + 4?").choices[0].message.content
    chunks = list(ask(client, "What is 3 + 4?", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("kwargs, message", [
    ({"extra_body": {"task": "poetry"}}, "unknown task 'poetry'"),
    ({"question": "x" * 201}, "at most 200"),
    ({"model": "gpt-4o"}, "unknown model 'gpt-4o'"),
    ({"extra_body": {"num_recursive_rounds": 1000}}, "num_recursive_rounds"),
    ({"extra_body": {"method": "magic"}}, "unknown method"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_requests_get_400_with_a_message(server, kwargs, message):
    _, client = server
    model = kwargs.pop("model", MODEL)
    question = kwargs.pop("question", "What is 1 + 1?")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                       max_tokens=kwargs.pop("max_tokens", 4),
                                       extra_body={**FAST, **kwargs.pop("extra_body", {})})
    assert e.value.status_code == 400 and message in e.value.message


def test_empty_messages_and_broken_json_get_400(server):
    url, client = server
    with pytest.raises(openai.BadRequestError, match="non-empty list"):
        client.chat.completions.create(model=MODEL, messages=[])
    request = urllib.request.Request(url + "/v1/chat/completions", data=b"{not json", method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=60)
    assert e.value.code == 400 and "not valid JSON" in json.loads(e.value.read())["error"]["message"]


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
