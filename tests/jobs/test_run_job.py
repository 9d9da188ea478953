"""jobs/run.py end to end on the tiny preset (local backend), resume, and bad input before any model loads."""

import glob
import json

import pytest

from tests.conftest import write_jsonl

from jobs import run as run_job


def base_args(qfile, out, *extra):
    return ["--style", "sequential_light", "--preset", "tiny", "--dataset", str(qfile), "--backend", "local",
            "--num_recursive_rounds", "2", "--latent_steps", "8", "--output_path", str(out), "--max_new_tokens", "8",
            "--no_progress", *extra]


def read(out):
    samples = [json.loads(line) for f in glob.glob(f"{out}/samples_*.jsonl") for line in open(f)]
    results = [json.load(open(f)) for f in glob.glob(f"{out}/results_*.json")]
    return samples, results


def test_run_writes_samples_and_results(tmp_path, tiny_cache, question_file):
    out = tmp_path / "out"
    assert run_job.main(base_args(question_file, out, "--method", "recursive_mas,recursive_textmas")) == 0
    samples, results = read(out)
    assert len(samples) == 8 and len(results) == 1
    by_method = {}
    for s in samples:
        by_method.setdefault(s["method"], []).append(s)
        assert {"question", "prediction", "trace", "tokens", "latency_s", "correct"} <= set(s)
        assert all({"role", "round", "latent_steps", "text_tokens", "seconds"} <= set(t) for t in s["trace"])
    mas, text = by_method["recursive_mas"], by_method["recursive_textmas"]
    assert sum(s["tokens"] for s in text) > sum(s["tokens"] for s in mas)
    res = results[0]
    assert res["config"]["recursion"]["num_recursive_rounds"] == 2 and res["config"]["system"]["roles"]["planner"]["base_model"]
    assert set(res["results"]) == {"questions/recursive_mas", "questions/recursive_textmas"}


def test_resume_skips_finished_samples(tmp_path, tiny_cache, question_file):
    out = tmp_path / "out"
    assert run_job.main(base_args(question_file, out, "--num_samples", "2")) == 0
    assert run_job.main(base_args(question_file, out, "--resume")) == 0
    samples, _ = read(out)
    assert sorted(s["doc_id"] for s in samples) == sorted({s["doc_id"] for s in samples}) and len(samples) == 4


def test_bad_question_files_fail_before_models_load(tmp_path, capsys, monkeypatch):
    import recmas_ray.eval.driver as ev

    monkeypatch.setattr(ev, "Backend", lambda *a, **k: pytest.fail("models loaded despite bad data"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    fieldless = write_jsonl(tmp_path / "nofield.jsonl", [{"question": "q?"}, {"prompt": "x"}])
    for path in (empty, fieldless, tmp_path / "missing.jsonl"):
        assert run_job.main(base_args(path, tmp_path / "o")) == 2
    err = capsys.readouterr().err
    assert "no records" in err or "empty" in err
    assert "row" in err


def test_ckpt_override_for_unknown_role(tmp_path, question_file, capsys):
    assert run_job.main(base_args(question_file, tmp_path / "o", "--ckpt_override", f"summarizer={tmp_path}")) == 2
    assert "expected roles of sequential_light" in capsys.readouterr().err
