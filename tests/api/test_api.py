"""The Python API on both backends, --role_model in jobs/run.py, and the named-benchmark warning."""

import glob
import json

import pytest

import recmas_ray as rm
from jobs import run as run_job
from tests.conftest import write_jsonl

MODELS = {"planner": "tiny:qwen3", "critic": "tiny:llama", "solver": "tiny:qwen3"}
GEN = dict(num_recursive_rounds=2, latent_steps=4, max_new_tokens=6)


@pytest.fixture(scope="module")
def local_system(tiny_cache):
    with rm.System.build("sequential_light", role_models=MODELS, backend="local", seed=3) as system:
        yield system


def test_generate_returns_prediction_and_trace(local_system):
    out = [answers[0] for answers in local_system.generate(["What is 7 * 8?", "What is 2 + 2?"], task="math", **GEN)]
    assert len(out) == 2 and all(isinstance(o, rm.SampleResult) for o in out)
    trace = out[0].trace
    assert [(t["role"], t["round"]) for t in trace][:3] == [("planner", 1), ("critic", 1), ("solver", 1)]
    assert trace[-1]["action"] == "decode" and trace[-1]["role"] == "solver"
    assert all({"latent_steps", "text_tokens", "seconds"} <= set(t) for t in trace)
    assert out[0].num_latent_steps == sum(t["latent_steps"] for t in trace) > 0
    assert local_system.role_models["solver"] == "tiny:qwen3"
    assert local_system.manifest()["roles"]["critic"]["base_model"] == "tiny:llama"
    text = local_system.generate("What is 7 * 8?", method="recursive_textmas", **GEN)
    assert text[0][0].num_latent_steps == 0 and any("text" in t for t in text[0][0].trace)


def test_generate_rejects_bad_arguments(local_system):
    with pytest.raises(ValueError, match="task type"):
        local_system.generate(["q"], task="poetry")
    with pytest.raises(ValueError, match="method"):
        local_system.generate(["q"], method="magic")
    with pytest.raises(ValueError, match="latent_steps"):
        local_system.generate(["q"], latent_steps=-1)


def test_evaluate_on_the_running_agents(local_system, question_file, tmp_path, monkeypatch):
    import recmas_ray.engine.service as service

    monkeypatch.setattr(service.AgentService, "__init__", lambda *a, **k: pytest.fail("agents were reloaded"))
    report = local_system.evaluate(str(question_file), methods=["recursive_mas", "recursive_textmas"],
                                   output_path=str(tmp_path), num_samples=2, **GEN)
    assert set(report["results"]) == {"questions/recursive_mas", "questions/recursive_textmas"}
    data = json.load(open(report["results_path"]))
    assert data["config"]["system"]["role_models"] == MODELS and data["warnings"] == []
    assert data["config"]["system"]["roles"]["solver"]["base_model"] == "tiny:qwen3"


def test_build_errors_before_models_load(tiny_cache, monkeypatch, tmp_path):
    import recmas_ray.engine.service as service

    monkeypatch.setattr(service.AgentService, "__init__", lambda *a, **k: pytest.fail("models loaded"))
    with pytest.raises(ValueError, match="models names"):
        rm.System.build("sequential_light", role_models={"summarizer": "tiny:qwen3"}, backend="local")
    with pytest.raises(ValueError, match="num_replicas"):
        rm.System.build("sequential_light", backend="local", num_replicas=2)
    with pytest.raises(ValueError, match="no folder named after a role"):
        rm.System.build("sequential_light", backend="local", links=str(tmp_path))
    with pytest.raises(ValueError, match="backend"):
        rm.System.build("sequential_light", backend="gpu-cloud")


@pytest.mark.integration  # a Ray system of its own: minutes on a busy 2-core machine
def test_ray_backend_matches_local(ray_cluster, local_system):
    questions = ["What is 7 * 8?", "What is 10 - 3?"]
    want = [o[0].prediction for o in local_system.generate(questions, **GEN)]
    with rm.System.build("sequential_light", role_models=MODELS, backend="ray", seed=3, timeout_s=120) as system:
        got = system.generate(questions, **GEN)
    assert [o[0].prediction for o in got] == want
    assert got[0][0].trace[-1]["role"] == "solver"


def _run_args(dataset, out, *extra):
    return ["--style", "sequential_light", "--preset", "tiny", "--dataset", str(dataset), "--backend", "local",
            "--num_recursive_rounds", "1", "--latent_steps", "2", "--output_path", str(out), "--max_new_tokens", "4",
            "--num_samples", "2", "--no_progress", *extra]


def test_role_model_flag_of_jobs_run(tmp_path, tiny_cache, question_file, capsys):
    out = tmp_path / "out"
    assert run_job.main(_run_args(question_file, out, "--role_model", "solver=tiny:mistral", "critic=tiny:qwen3")) == 0
    res = json.load(open(glob.glob(f"{out}/results_*.json")[0]))
    roles = res["config"]["system"]["roles"]
    assert roles["solver"]["base_model"] == "tiny:mistral" and roles["critic"]["base_model"] == "tiny:qwen3"
    assert roles["planner"]["base_model"] == "tiny:qwen3"  # the preset's
    assert json.load(open(out / "config.json"))["system"]["role_models"] == {"solver": "tiny:mistral",
                                                                             "critic": "tiny:qwen3"}
    assert run_job.main(_run_args(question_file, out, "--role_model", "judge=tiny:qwen3")) == 2
    assert "--models names ['judge']" in capsys.readouterr().err


def test_named_benchmark_on_tiny_models_warns(tmp_path, tiny_cache, capsys):
    rows = [{"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}\n#### {2 * a}"} for a in (1, 2)]
    data = write_jsonl(tmp_path / "gsm8k_copy.jsonl", rows)
    out = tmp_path / "out"
    assert run_job.main(_run_args("gsm8k", out, "--dataset_path", str(data))) == 0
    assert "warning: benchmark gsm8k runs on random-weight tiny models" in capsys.readouterr().err
    res = json.load(open(glob.glob(f"{out}/results_*.json")[0]))
    assert len(res["warnings"]) == 1 and "random-weight" in res["warnings"][0]


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])


def test_continuous_batching_is_on_by_default_and_switched_off_by_build_and_by_the_jobs_flag(local_system, tiny_cache):
    """The Python API's agents batch unless told not to; `continuous_batching=False` and jobs.run's
    `--no_continuous_batching` reach every agent's engine (and the plan's specs, which Ray actors are built from)."""
    from recmas_ray.config.cli import parse_config
    from recmas_ray.eval.config import EvalConfig
    from recmas_ray.system.plan import plan_system

    assert all(s.agent.engine.continuous_batching for s in local_system.agents.services.values())
    assert all(s.continuous_batching for s in local_system.plan.specs.values())
    with rm.System.build("sequential_light", role_models=MODELS, backend="local", seed=3,
                         continuous_batching=False) as system:
        assert not any(s.agent.engine.continuous_batching for s in system.agents.services.values())
        assert not any(s.continuous_batching for s in system.plan.specs.values())
    for argv, on in ((["--style", "sequential_light", "--dataset", "gsm8k"], True),
                     (["--style", "sequential_light", "--dataset", "gsm8k", "--no_continuous_batching"], False)):
        cfg = parse_config(EvalConfig, argv)[0]
        assert cfg.system.continuous_batching is on
        assert all(s.continuous_batching is on for s in plan_system(cfg.system).specs.values())
