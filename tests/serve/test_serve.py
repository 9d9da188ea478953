"""jobs/serve.py over real HTTP on 127.0.0.1 with the official openai client: answers and usage, the API key,
the size limit, loopback-only listeners, stop strings, n, token streaming, 400s naming the field, /health,
/metrics, /v1/completions, and batched concurrent requests that answer as single ones."""

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
KEY = "test-key-" + "x" * 8
FAST = {"num_recursive_rounds": 1, "latent_steps": 2}
MAX_BODY = 65536


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
                           "--max_input_chars", "200", "--timeout_s", "120", "--api_key", KEY,
                           "--max_request_bytes", str(MAX_BODY), "--max_batch_size", "8",
                           "--batch_wait_timeout_s", "0.3"])
    assert KEY not in repr(cfg) and KEY not in json.dumps(cfg.api_key)  # only the digest is held
    url = serve_job.start(cfg)
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, timeout=180, max_retries=0)
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


def _http(url, path, data=None, headers=None):
    request = urllib.request.Request(url + path, data=data, method="POST" if data is not None else "GET",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_models_and_a_completion_with_usage_of_every_agent(server):
    _, client = server
    assert [m.id for m in client.models.list().data] == [MODEL]
    resp = ask(client)
    assert resp.model == MODEL and resp.object == "chat.completion"
    choice = resp.choices[0]
    assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    side = resp.model_extra["recmas"]
    assert side["method"] == "recursive_mas" and side["num_recursive_rounds"] == 1 and side["latent_steps"] == 2
    assert [t["role"] for t in side["trace"]] == ["planner", "critic", "solver"]
    # prompt tokens: what every agent read (three chat prompts), far more than the question alone
    assert resp.usage.prompt_tokens == sum(t["prompt_tokens"] for t in side["trace"]) > 3 * 8
    assert resp.usage.completion_tokens == side["trace"][-1]["text_tokens"] > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert side["usage"]["latent_steps"] == side["total_latent_steps"] == 2 * 2  # planner + critic, m = 2
    text = ask(client, extra_body={"method": "recursive_textmas", "task": "math"})
    assert text.model_extra["recmas"]["method"] == "recursive_textmas"
    assert text.model_extra["recmas"]["usage"]["intermediate_text_tokens"] > 0


def test_api_key_is_required_on_v1_routes(server):
    url, _ = server
    wrong = openai.OpenAI(base_url=url + "/v1", api_key="wrong", timeout=60, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        ask(wrong)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    status, data = _http(url, "/v1/models")  # no Authorization header at all
    assert status == 401 and json.loads(data)["error"]["type"] == "invalid_request_error"
    status, data = _http(url, "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi"}).encode())
    assert status == 401
    assert _http(url, "/health")[0] == 200  # health and metrics stay open (as vLLM's)
    for path in ("/docs", "/openapi.json"):  # the API's description follows the key too
        assert _http(url, path)[0] == 401
    status, data = _http(url, "/openapi.json", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and "/v1/chat/completions" in json.loads(data)["paths"]
    assert "/docs" not in json.loads(data)["paths"]
    status, page = _http(url, "/docs", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and b"swagger" in page.lower()


def test_oversized_body_gets_413_before_it_runs(server):
    url, _ = server
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * (2 * MAX_BODY)}]}).encode()
    status, data = _http(url, "/v1/chat/completions", body, {"Authorization": f"Bearer {KEY}"})
    assert status == 413 and str(MAX_BODY) in json.loads(data)["error"]["message"]


def test_every_listener_of_the_server_is_on_loopback(server):
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    listeners = []
    for proc in [me, *me.children(recursive=True)]:  # the local cluster and Serve were started from here
        try:
            listeners += [(proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue
    assert any("ServeReplica" in name for name, _, _ in listeners)  # the replica's gRPC server is among them
    assert any(port == int(server[0].rsplit(":", 1)[1]) for _, _, port in listeners)  # the HTTP proxy too
    open_ones = [x for x in listeners if not (x[1].startswith("127.") or x[1] in ("::1", "::ffff:127.0.0.1")
                                              or x[1].startswith("::ffff:127."))]
    assert not open_ones, f"listening beyond loopback: {open_ones}"


def test_stop_strings_cut_the_answer(server):
    _, client = server
    whole = ask(client, "What is 9 + 9?", max_tokens=12).choices[0].message.content
    assert len(whole) >= 4, whole
    stop = whole[2:4]
    cut = whole[:whole.find(stop)]
    resp = ask(client, "What is 9 + 9?", max_tokens=12, stop=[stop, "\x00never"])
    assert resp.choices[0].message.content == cut and resp.choices[0].finish_reason == "stop"
    chunks = list(ask(client, "What is 9 + 9?", max_tokens=12, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut


def test_n_choices_sampled_and_greedy(server):
    _, client = server
    sampled = ask(client, "Name a number.", n=2, temperature=1.0, seed=3, max_tokens=8)
    assert [c.index for c in sampled.choices] == [0, 1]
    assert all(isinstance(c.message.content, str) for c in sampled.choices)
    again = ask(client, "Name a number.", n=2, temperature=1.0, seed=3, max_tokens=8)
    assert [c.message.content for c in again.choices] == [c.message.content for c in sampled.choices]  # seeded
    greedy = ask(client, "Name a number.", n=2, temperature=0, max_tokens=8)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content  # vLLM: identical greedy


def test_streaming_sends_tokens_as_they_are_decoded(server):
    _, client = server
    whole = ask(client, "What is 3 + 4?", max_tokens=12).choices[0].message.content
    chunks = list(ask(client, "What is 3 + 4?", max_tokens=12, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == whole and len(pieces) > 1  # token by token, not one chunk at the end
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 1
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("kwargs, message", [
    ({"extra_body": {"task": "poetry"}}, "unknown task 'poetry'"),
    ({"question": "x" * 201}, "at most 200"),
    ({"model": "gpt-4o"}, "unknown model 'gpt-4o'"),
    ({"extra_body": {"num_recursive_rounds": 1000}}, "num_recursive_rounds"),
    ({"extra_body": {"method": "magic"}}, "unknown method"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"extra_body": {"best_off": 2}}, "best_off"),
    ({"temperature": -1}, "temperature"),
])
def test_bad_requests_get_400_naming_the_field(server, kwargs, message):
    _, client = server
    model = kwargs.pop("model", MODEL)
    question = kwargs.pop("question", "What is 1 + 1?")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                       max_tokens=kwargs.pop("max_tokens", 4),
                                       extra_body={**FAST, **kwargs.pop("extra_body", {})}, **kwargs)
    assert e.value.status_code == 400 and message in e.value.message


def test_empty_messages_and_broken_json_get_400(server):
    url, client = server
    with pytest.raises(openai.BadRequestError, match="non-empty list"):
        client.chat.completions.create(model=MODEL, messages=[])
    status, data = _http(url, "/v1/chat/completions", b"{not json", {"Authorization": f"Bearer {KEY}"})
    assert status == 400 and "not valid JSON" in json.loads(data)["error"]["message"]


def test_completions_route(server):
    _, client = server
    resp = client.completions.create(model=MODEL, prompt=["What is 2 + 2?", "What is 5 + 1?"], max_tokens=6,
                                     extra_body=FAST)
    assert resp.object == "text_completion" and [c.index for c in resp.choices] == [0, 1]
    assert all(isinstance(c.text, str) and c.finish_reason in ("stop", "length") for c in resp.choices)


def test_concurrent_requests_are_batched_and_answer_as_single_ones(server):
    url, client = server
    questions = [f"What is {i} + {i}?" for i in range(6)]
    single = [ask(client, q, max_tokens=8).choices[0].message.content for q in questions]
    _, before = _http(url, "/metrics")
    with ThreadPoolExecutor(len(questions)) as pool:
        together = list(pool.map(lambda q: ask(client, q, max_tokens=8), questions))
    assert [a.choices[0].message.content for a in together] == single  # left-padded batches = single prompts
    status, after = _http(url, "/metrics")
    assert status == 200

    def batches(text: bytes) -> tuple[float, float]:  # (batches run, batches of one row)
        lines = dict(line.rsplit(" ", 1) for line in text.decode().splitlines() if line and line[0] != "#")
        return float(lines["recmas_batch_rows_count"]), float(lines['recmas_batch_rows_bucket{le="1.0"}'])

    (n0, ones0), (n1, ones1) = batches(before), batches(after)
    assert n1 - n0 < len(questions) and ones1 - ones0 < len(questions), "six concurrent requests ran one by one"
    assert "recmas_requests_total" in after.decode() and "recmas_queue_depth" in after.decode()
    assert "recmas_completion_tokens_total" in after.decode()
    status, health = _http(url, "/health")
    assert status == 200 and json.loads(health)["status"] == "ok"


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
