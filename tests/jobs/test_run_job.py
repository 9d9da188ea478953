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
    import recmas_ray.eval.run as ev

    monkeypatch.setattr(ev, "BatchRunner", lambda *a, **k: pytest.fail("models loaded despite bad data"))
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


def test_resume_with_another_batch_size_is_refused_before_anything_runs(tmp_path, tiny_cache, question_file, capsys):
    out = tmp_path / "out"
    assert run_job.main(base_args(question_file, out, "--num_samples", "2")) == 0
    before = sorted((p.name, p.stat().st_size) for p in out.iterdir())
    capsys.readouterr()
    assert run_job.main(base_args(question_file, out, "--resume", "--batch_size", "4")) == 2
    err = capsys.readouterr().err
    assert "differing fields: batch_size: 8 -> 4" in err and len(err.strip().splitlines()) == 1, err
    assert sorted((p.name, p.stat().st_size) for p in out.iterdir()) == before
    fp = json.load(open(glob.glob(f"{out}/samples_*.fingerprint.json")[0]))
    assert {"batch_size", "resolved_dtype", "resolved_device", "model_revisions"} <= set(fp)
    assert fp["resolved_dtype"] == "float32" and fp["model_revisions"]["planner"] == "tiny:qwen3"


def test_full_disk_is_one_line_and_resume_completes(tmp_path, tiny_cache, question_file, capsys, monkeypatch):
    """The disk fills half-way through the third sample's line: one line, exit 1, the samples file holds two
    whole lines; --resume (disk freed) runs the other two and ends with four samples, one per question."""
    import errno
    import os

    from recmas_ray.eval import samples as sample_io

    real, calls = sample_io.write_whole, {"n": 0}

    def fill_disk(fd, data):
        calls["n"] += 1
        if calls["n"] == 3:
            os.write(fd, data[:10])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(sample_io, "write_whole", fill_disk)
    out = tmp_path / "out"
    assert run_job.main(base_args(question_file, out, "--batch_size", "1")) == 1
    err = capsys.readouterr().err.strip().splitlines()  # the phase lines (stderr), then the one error line
    errors = [ln for ln in err if ln.startswith("error: ")]
    assert errors == [err[-1]] and "no space left on the device" in err[-1] and "--resume" in err[-1], err
    files = glob.glob(f"{out}/samples_*.jsonl")
    assert [len(open(f).read().splitlines()) for f in files] == [2]
    assert all(json.loads(line) for line in open(files[0]))
    monkeypatch.setattr(sample_io, "write_whole", real)
    assert run_job.main(base_args(question_file, out, "--batch_size", "1", "--resume")) == 0
    samples, _ = read(out)
    assert sorted(s["doc_id"] for s in samples) == ["0", "1", "2", "3"]
