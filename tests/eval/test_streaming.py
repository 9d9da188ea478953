"""Ray Data streaming evaluation: both methods end to end, parity with the local backend, a killed
client actor (ending the run, then restarted during --resume), and the answer-format retry."""

import glob
import json
import os

import pytest

from recmas_ray.engine.decoding import Decoded
from recmas_ray.eval.stream import format_retry, needs_format_retry
from recmas_ray.engine.runner import SampleResult
from recmas_ray.tasks import get_task

from jobs import run as run_job

METHODS = "recursive_mas,recursive_textmas"


def args(qfile, out, backend, *extra):
    return ["--style", "sequential_light", "--preset", "tiny", "--dataset", str(qfile), "--backend", backend,
            "--num_recursive_rounds", "2", "--latent_steps", "4", "--max_new_tokens", "6", "--batch_size", "2",
            "--output_path", str(out), "--no_progress", *extra]


def samples(out):
    files = glob.glob(f"{out}/samples_*.jsonl")
    assert len(files) == 1, files
    return [json.loads(line) for line in open(files[0])]


def by_key(rows):
    return {(r["method"], r["doc_id"], r["rollout"]): r for r in rows}


# ----------------------------------------------------------------------------- retry rules, no models

def test_needs_format_retry_per_task():
    assert needs_format_retry({"task_type": "math"}, "so it is 5")
    assert not needs_format_retry({"task_type": "math"}, "so \\boxed{5}")
    assert needs_format_retry({"task_type": "qa"}, "Paris")
    assert needs_format_retry({"task_type": "choice", "options": ["a", "b", "c", "d"]}, "I am unsure")
    assert not needs_format_retry({"task_type": "choice", "options": ["a", "b", "c", "d"]}, "Final Choice: C")
    assert needs_format_retry({"task_type": "code"}, "def f(): return 1")
    assert not needs_format_retry({"task_type": "code"}, "```python\ndef f():\n    return 1\n```")


def test_format_retry_refeeds_raw_output_with_suffix():
    items = [{"task_type": "math"}, {"task_type": "math"}, {"task_type": "code"}]
    results = [SampleResult("thus five", 7, 0, 1.0), SampleResult("\\boxed{3}", 4, 0, 1.0),
               SampleResult("def f(): pass", 9, 0, 1.0)]
    calls = []

    def retry(texts, suffixes, n, decode, context):
        calls.append((texts, suffixes, n))
        assert context is None  # results without a recorded decoder input: the reply alone is continued
        return [Decoded("5}", 2) if n == 16 else Decoded("def f():\n    return 5", 11)] * len(texts)

    infos = format_retry(items, results, None, retry)
    assert sorted(c[2] for c in calls) == [16, 256]  # one call per token budget
    assert calls[0][0] == ["thus five"] and calls[0][1] == [get_task("math").retry_suffix]
    assert results[0].prediction == "thus five\nFinal Answer: \\boxed{5}" and results[0].num_text_tokens == 9
    assert infos[1] is None and results[1].prediction == "\\boxed{3}"
    assert infos[0]["raw_prediction"] == "thus five" and infos[0]["tokens"] == 2
    assert not needs_format_retry(items[2], results[2].prediction)  # the opened fence is closed
    assert results[2].trace[-1]["action"] == "format_retry"


# ----------------------------------------------------------------------------- end to end on Ray

@pytest.fixture(scope="module")
def qfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "questions.jsonl"
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(2, 3), (10, 7), (4, 4), (21, 5)]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def local_run(qfile, tiny_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    assert run_job.main(args(qfile, out, "local", "--method", METHODS)) == 0
    return samples(out)


@pytest.mark.integration  # a Ray system of its own: minutes on a busy 2-core machine
def test_ray_stream_two_methods_matches_local(ray_cluster, qfile, local_run, tmp_path, capsys):
    out = tmp_path / "ray"
    assert run_job.main(args(qfile, out, "ray", "--method", METHODS, "--plot")) == 0
    rows = samples(out)
    assert len(rows) == 8 and len(by_key(rows)) == 8
    ray_by, local_by = by_key(rows), by_key(local_run)
    assert ray_by.keys() == local_by.keys()
    for k, r in ray_by.items():
        assert r["prediction"] == local_by[k]["prediction"], k
        assert r["retry_used"] == local_by[k]["retry_used"] and r["tokens"] == local_by[k]["tokens"]
        assert r.get("retry") == local_by[k].get("retry"), k  # continued in context on both backends
        if r["retry_used"]:  # random tiny weights: never a \boxed{} on their own
            assert r["retry"]["in_context"], k
            assert r["prediction"].startswith(r["retry"]["raw_prediction"] + get_task("math").retry_suffix)
            assert 1 <= r["retry"]["tokens"] <= 16
    assert any(r["retry_used"] for r in rows)
    results = [json.load(open(f)) for f in glob.glob(f"{out}/results_*.json")]
    assert len(results) == 1
    assert set(results[0]["results"]) == {"questions/recursive_mas", "questions/recursive_textmas"}
    assert all(v["retry_rate,none"] is not None and v["throughput_samples_per_s,none"] > 0
               for v in results[0]["results"].values())
    table = capsys.readouterr().out
    assert "Speedup" in table and "Token reduction" in table and "|questions|recursive_mas|" in table.replace(" ", "")
    assert os.path.getsize(out / "plot_questions.png") > 1000


@pytest.fixture(scope="module")
def shared_system(ray_cluster, qfile):
    """One running system for the crash run and its --resume rerun (agents load once)."""
    from recmas_ray.distributed.replicas import build_ray_system
    from recmas_ray.system.plan import plan_system

    cfg = config(qfile, "unused", "ray")
    plan = plan_system(cfg.system, task="math", tools=cfg.tool_loop())
    system = build_ray_system(plan, cfg.placement, timeout_s=120)
    yield system
    system.shutdown()


def config(qfile, out, backend, *extra):
    return run_job.parse(args(qfile, out, backend, *extra))


@pytest.mark.integration
def test_killed_client_ends_run_then_resume_completes(shared_system, qfile, local_run, tmp_path, inject_faults):
    from recmas_ray.eval.run import evaluate

    out = tmp_path / "crash"
    one = ["--method", "recursive_mas", "--batch_size", "1", "--max_inflight_batches", "1"]
    inject_faults(client_exit_after=2)  # the client dies before its third batch
    with pytest.raises(RuntimeError, match="rerun with --resume"):
        evaluate(config(qfile, out, "ray", *one, "--client_max_restarts", "0"), system=shared_system)
    first = samples(out)
    assert 1 <= len(first) <= 2  # finished batches reached the file before the client died
    # The rerun (>= 2 batches left) loses its client before the second batch; Ray Data restarts it.
    inject_faults(client_exit_after=1)
    evaluate(config(qfile, out, "ray", *one, "--resume"), system=shared_system)
    rows = samples(out)
    assert len(rows) == 4 and len(by_key(rows)) == 4
    local = {r["doc_id"] for r in local_run if r["method"] == "recursive_mas"}
    assert {r["doc_id"] for r in rows} == local


def test_rounds_sweep_plots_one_point_per_method_and_round(qfile, tiny_cache, tmp_path, monkeypatch):
    import recmas_ray.eval.run as ev

    seen = []
    monkeypatch.setattr(ev, "plot_vs_rounds", lambda rows, path: seen.extend(rows) or ev.Path(path))
    out = tmp_path / "sweep"
    assert run_job.main(args(qfile, out, "local", "--sweep_rounds", "1,2", "--num_samples", "2",
                             "--method", METHODS, "--plot", "--no_format_retry")) == 0
    assert len(glob.glob(f"{out}/R1/results_*.json")) == len(glob.glob(f"{out}/R2/results_*.json")) == 1
    points = sorted((r["method"], r["rounds"]) for r in seen)
    assert points == [(m, r) for m in sorted(METHODS.split(",")) for r in (1, 2)]
    assert not any(s["retry_used"] for s in samples(out / "R1"))


def test_failed_run_exits_1_pointing_to_resume(qfile, tmp_path, monkeypatch, capsys):
    import recmas_ray.eval.run as ev

    def boom(*a, **k):
        raise RuntimeError("evaluation stream of recursive_mas failed (ActorDiedError); rerun with --resume")

    monkeypatch.setattr(ev, "evaluate", boom)
    assert run_job.main(args(qfile, tmp_path, "ray")) == 1
    assert "--resume" in capsys.readouterr().err
