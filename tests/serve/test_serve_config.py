"""Offline checks of the serving layer: cluster/serve.yaml validates (Serve's schema and ServeConfig), typos
fail with one line, and the request checks turn every bad request into a RequestError (HTTP 400)."""

from pathlib import Path

import pytest
import yaml

from recmas_ray.config.checks import ConfigError
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.serve.openai_api import RequestError, parse_request

SERVE_YAML = Path(__file__).resolve().parents[2] / "cluster" / "serve.yaml"


def test_cluster_serve_yaml_validates(monkeypatch):
    pytest.importorskip("ray.serve")
    import recmas_ray.config.inputs as inputs

    monkeypatch.setattr(inputs, "cuda_available", lambda: True)  # the file is for a GPU cluster
    from ray.serve.schema import ServeDeploySchema

    from recmas_ray.serve.app import app_builder

    doc = yaml.safe_load(SERVE_YAML.read_text())
    app = ServeDeploySchema.model_validate(doc).applications[0]
    assert app.import_path == "recmas_ray.serve.app:app_builder"
    assert app_builder(app.args) is not None  # binds the deployment; nothing starts
    with pytest.raises(ConfigError, match="unknown setting"):
        app_builder({**app.args, "latent_step": 4})
    with pytest.raises(ValueError, match="models names"):
        app_builder({**app.args, "system": {**app.args["system"], "role_models": {"judge": "tiny:qwen3"}}})
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['style'\]"):  # sections are nested
        app_builder({**app.args, "style": "mixture"})


def test_jobs_serve_flags_and_user_errors(capsys):
    from jobs import serve as serve_job

    cfg = serve_job.parse(["--style", "mixture", "--role_model", "code=tiny:qwen3", "--latent_steps", "4",
                           "--placement", "cpu"])
    assert cfg.served_name == "mixture" and cfg.recursion.latent_steps == 4 and cfg.system.role_models == {"code": "tiny:qwen3"}
    assert serve_job.main(["--style", "mixture", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err


def parse(body, kind="chat", **kw):
    return parse_request(body, kind=kind, served_name="m", defaults=RecursionConfig(), default_task="math",
                         max_input_chars=kw.get("max_input_chars", 100), roles=kw.get("roles", ("expert", "learner")))


def test_request_checks():
    user = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
            {"role": "assistant", "content": "..."}, {"role": "user", "content": [{"type": "text", "text": "Q?"}]}]
    req = parse({"model": "m", "messages": user, "max_tokens": 9, "temperature": 0, "latent_steps": 3,
                 "task": "choice", "method": "textmas", "logprobs": False, "tools": None, "n": 2, "stop": "##"})
    assert (req.question, req.task, req.recursion.method, req.recursion.latent_steps) == ("Q?", "choice", "textmas", 3)
    assert req.recursion.decode.max_new_tokens == 9 and not req.recursion.decode.do_sample
    assert (req.n, req.stop, req.num_rows) == (2, ["##"], 1)  # greedy n: one row, copied
    sampled = parse({"model": "m", "messages": user, "temperature": 0.7, "n": 3, "top_k": -1})
    assert sampled.recursion.decode.do_sample and sampled.num_rows == 3 and sampled.recursion.decode.top_k == 0
    bad = [({"model": "x", "messages": user}, "unknown model"), ({"model": "m", "messages": []}, "non-empty"),
           ({"model": "m", "messages": [{"role": "system", "content": "s"}]}, "no user message"),
           ({"model": "m", "messages": [{"role": "user", "content": "  "}]}, "empty"),
           ({"model": "m", "messages": [{"role": "user", "content": "x" * 101}]}, "at most 100"),
           ({"model": "m", "messages": user, "task": "poetry"}, "unknown task"),
           ({"model": "m", "messages": user, "latent_steps": "8"}, "integer"),
           ({"model": "m", "messages": user, "num_recursive_rounds": 0}, "num_recursive_rounds"),
           ({"model": "m", "messages": user, "n": 0}, "n must be between"),
           ({"model": "m", "messages": user, "n": 65}, "n must be between"),
           ({"model": "m", "messages": user, "temperature": -0.5}, "temperature must be >= 0"),
           ({"model": "m", "messages": user, "logprobs": True}, "logprobs is not supported"),
           ({"model": "m", "messages": user, "top_logprobs": 2}, "top_logprobs is not supported"),
           ({"model": "m", "messages": user, "tools": [{"type": "function"}]}, "tools is not supported"),
           ({"model": "m", "messages": user, "response_format": {"type": "json_object"}}, "response_format"),
           ({"model": "m", "messages": user, "frequency_penalty": 0.5}, "frequency_penalty"),
           ({"model": "m", "messages": user, "latent_step": 4}, "unknown field 'latent_step'"),
           ({"model": "m", "messages": user, "prompt": "x"}, "unknown field 'prompt'"),
           ({"model": "m", "messages": user, "stop": ["a", 1]}, "stop must be"),
           ({"model": "m", "messages": user, "stop": [""]}, "stop must be"),
           ({"model": "m", "messages": user, "stream": "yes"}, "stream must be"),
           ({"model": "m", "messages": user, "stream_options": {"x": 1}}, "include_usage"),
           ("text", "JSON object")]
    for body, message in bad:
        with pytest.raises(RequestError, match=message) as e:
            parse(body)
        assert e.value.body()["error"]["type"] == "invalid_request_error"
        if isinstance(body, dict) and e.value.param is not None and "field" in message:
            assert e.value.param in message


def test_role_context_is_told_only_to_the_roles_it_names():
    from recmas_ray.styles.role_context import question_for_role

    user = [{"role": "user", "content": "What is x?"}]
    req = parse({"model": "m", "messages": user, "role_context": {"expert": "x = 65."}})
    assert question_for_role(req.question, "expert") == "x = 65. What is x?"
    assert question_for_role(req.question, "learner") == "What is x?"
    both = parse({"model": "m", "prompt": ["What is x?", "Is x odd?"], "role_context": {"expert": "x = 65."}},
                 kind="completion")
    assert [question_for_role(q, "expert") for q in both.questions] == ["x = 65. What is x?", "x = 65. Is x odd?"]
    for context, message in [({"planner": "x = 1."}, r"role_context names \['planner'\]; this system's roles"),
                             ({"expert": 65}, "role_context must map role names to non-empty text"),
                             ({}, "role_context must be an object"), ("x = 65.", "role_context must be an object")]:
        with pytest.raises(RequestError, match=message) as e:
            parse({"model": "m", "messages": user, "role_context": context})
        assert e.value.param == "role_context"


def test_completion_request_checks():
    req = parse({"model": "m", "prompt": ["a?", "b?"], "n": 2, "temperature": 1.0, "seed": 4}, kind="completion")
    assert req.kind == "completion" and req.questions == ["a?", "b?"] and req.num_rows == 4 and req.seeded
    assert req.batch_key("r1") != req.batch_key("r2")  # a seeded request runs alone (its seed reproduces it)
    unseeded = parse({"model": "m", "prompt": "a?", "temperature": 1.0}, kind="completion")
    assert unseeded.batch_key("r1") == unseeded.batch_key("r2")
    greedy = parse({"model": "m", "prompt": "a?"}, kind="completion")
    longer = parse({"model": "m", "prompt": "a?", "max_tokens": 7}, kind="completion")
    assert greedy.batch_key("r") != unseeded.batch_key("r") and greedy.batch_key("r") != longer.batch_key("r")
    for body, message in [({"model": "m", "prompt": [1, 2]}, "token ids are not accepted"),
                          ({"model": "m", "prompt": []}, "non-empty list"),
                          ({"model": "m", "prompt": ["x"] * 65}, "at most 64"),
                          ({"model": "m", "prompt": "x", "messages": []}, "unknown field 'messages'"),
                          ({"model": "m", "prompt": "x", "echo": True}, "echo is not supported")]:
        with pytest.raises(RequestError, match=message):
            parse(body, kind="completion")


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
