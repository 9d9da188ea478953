"""Offline checks of the serving layer: cluster/serve.yaml validates (Serve's schema and ServeConfig), typos
fail with one line, and the request checks turn every bad request into a RequestError (HTTP 400)."""

from pathlib import Path

import pytest
import yaml

from recmas_ray.config.checks import ConfigError
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.serve.openai_api import RequestError, parse_chat_request

SERVE_YAML = Path(__file__).resolve().parents[2] / "cluster" / "serve.yaml"


def test_cluster_serve_yaml_validates():
    pytest.importorskip("ray.serve")
    from ray.serve.schema import ServeDeploySchema

    from recmas_ray.serve.app import app_builder

    doc = yaml.safe_load(SERVE_YAML.read_text())
    app = ServeDeploySchema.model_validate(doc).applications[0]
    assert app.import_path == "recmas_ray.serve.app:app_builder"
    assert app_builder(app.args) is not None  # binds the deployment; nothing starts
    with pytest.raises(ConfigError, match="unknown setting"):
        app_builder({**app.args, "latent_step": 4})
    with pytest.raises(ValueError, match="models names"):
        app_builder({**app.args, "models": {"judge": "tiny:qwen3"}})


def test_jobs_serve_flags_and_user_errors(capsys):
    from jobs import serve as serve_job

    cfg = serve_job.parse(["--style", "mixture", "--role_model", "code=tiny:qwen3", "--latent_steps", "4",
                           "--placement", "cpu"])
    assert cfg.served_name == "mixture" and cfg.recursion.latent_steps == 4 and cfg.models == {"code": "tiny:qwen3"}
    assert serve_job.main(["--style", "mixture", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err


def parse(body, **kw):
    return parse_chat_request(body, served_name="m", defaults=RecursionConfig(), default_task="math",
                              max_input_chars=kw.get("max_input_chars", 100))


def test_request_checks():
    user = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
            {"role": "assistant", "content": "..."}, {"role": "user", "content": [{"type": "text", "text": "Q?"}]}]
    req = parse({"model": "m", "messages": user, "max_tokens": 9, "temperature": 0, "latent_steps": 3,
                 "task": "choice", "method": "textmas"})
    assert (req.question, req.task, req.recursion.method, req.recursion.latent_steps) == ("Q?", "choice", "textmas", 3)
    assert req.recursion.decode.max_new_tokens == 9 and not req.recursion.decode.do_sample
    assert parse({"model": "m", "messages": user, "temperature": 0.7}).recursion.decode.do_sample
    bad = [({"model": "x", "messages": user}, "unknown model"), ({"model": "m", "messages": []}, "non-empty"),
           ({"model": "m", "messages": [{"role": "system", "content": "s"}]}, "no user message"),
           ({"model": "m", "messages": [{"role": "user", "content": "  "}]}, "empty"),
           ({"model": "m", "messages": [{"role": "user", "content": "x" * 101}]}, "at most 100"),
           ({"model": "m", "messages": user, "task": "poetry"}, "unknown task"),
           ({"model": "m", "messages": user, "latent_steps": "8"}, "integer"),
           ({"model": "m", "messages": user, "num_recursive_rounds": 0}, "num_recursive_rounds"),
           ({"model": "m", "messages": user, "n": 2}, "n=1"), ("text", "JSON object")]
    for body, message in bad:
        with pytest.raises(RequestError, match=message) as e:
            parse(body)
        assert e.value.body()["error"]["type"] == "invalid_request_error"


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
