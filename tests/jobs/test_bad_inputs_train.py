"""Bad input to the training jobs: exit status 2, exactly one stderr line `error: ...`, no traceback, no model
loaded, no Ray started. The jobs run in-process (`jobs.train_inner.main(argv)`), as a user would call them."""

import json

import pytest
import torch

from jobs import train_inner, train_outer
from recmas_ray.system.checkpoints import MANIFEST, WEIGHTS
from recmas_ray.train.synthetic import make_arithmetic_dataset, write_jsonl


class Opaque:
    """Pickled by a .pt file that weights_only loading must refuse."""


@pytest.fixture
def files(tmp_path):
    rows = make_arithmetic_dataset(8, seed=0)
    data = write_jsonl(rows, tmp_path / "train.jsonl")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / WEIGHTS).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"inner.p")  # header cut short
    (torn / MANIFEST).write_text(json.dumps({"kind": "inner"}))
    pickle_dir = tmp_path / "pickle"
    pickle_dir.mkdir()
    torch.save({"proj1.weight": Opaque()}, pickle_dir / "adapter.pt")
    outer_pickle = tmp_path / "outer_pickle"
    outer_pickle.mkdir()
    torch.save({"proj.weight": Opaque()}, outer_pickle / "outer_12.pt")
    bad_json = tmp_path / "badjson"
    bad_json.mkdir()
    (bad_json / WEIGHTS).write_bytes(b"")
    (bad_json / MANIFEST).write_text("{not json")
    return {"data": str(data), "unwritable": str(blocker / "out"), "torn": str(torn), "pickle": str(pickle_dir), "outer_pickle": str(outer_pickle),
            "badjson": str(bad_json), "missing": str(tmp_path / "missing.jsonl"), "out": str(tmp_path / "out")}


@pytest.fixture(autouse=True)
def nothing_heavy(monkeypatch):
    """Any model load or Ray start fails the test (pytest's failure is not caught by run_job)."""
    import ray
    import ray.train.torch

    import recmas_ray.models.loader

    def boom(*a, **k):
        pytest.fail("a model loaded or Ray started before the input was rejected")

    monkeypatch.setattr(recmas_ray.models.loader, "load_frozen_model", boom)
    monkeypatch.setattr(ray.train.torch, "TorchTrainer", boom)
    monkeypatch.setattr(ray, "init", boom)


INNER = [
    (["--lr", "-1"], "--lr"),
    (["--adapter_lr", "0"], "--lr"),
    (["--max_steps", "0"], "--max_steps"),
    (["--max_steps", "ten"], "--max_steps"),
    (["--save_dir", "{unwritable}"], "--save_dir"),
    (["--dataset_name", "{missing}"], "--dataset_name"),
    (["--dataset_name", "synthetic:zero"], "--dataset_name"),
    (["--mas_role", "judge"], "unknown role 'judge'"),
    (["--style", "pipeline"], "--style"),
    (["--lr_scheduler_type", "wavy"], "--lr_scheduler_type"),
    (["--grad_accum_steps", "0"], "--grad_accum_steps"),
    (["--num_train_epochs", "-2"], "--num_train_epochs"),
    (["--role_model", "judge=tiny:qwen3"], "--role_model"),
    (["--ckpt_override", "planner={missing}"], "--ckpt_override"),
    (["--ckpt_override", "planner={torn}"], "not a readable safetensors file"),
    (["--ckpt_override", "planner={badjson}"], "not a readable JSON file"),
    (["--load_dir", "{pickle}"], "weights_only"),
    (["--load_dir", "{missing}"], "--load_dir"),
    (["--storage_path", "ftp://host/x"], "--storage_path"),
    (["--storage_path", "{unwritable}"], "--storage_path"),
    (["--mas_role", "all", "--model_name_or_path", "tiny:qwen3"], "--mas_role all"),
    (["--no_such_flag", "1"], "unrecognized"),
    (["--dataset_name", "nobody/no-such-dataset"], "could not be loaded"),
]

OUTER = [
    (["--lr", "-1"], "--lr"),
    (["--max_steps", "0"], "--max_steps"),
    (["--batch_size", "2", "--num_microbatches", "3"], "--num_microbatches 3 exceeds --batch_size 2"),
    (["--save_dir", "{unwritable}"], "--save_dir"),
    (["--dataset_name", "{missing}"], "--dataset_name"),
    (["--max_length", "0"], "--max_length"),
    (["--num_recursive_rounds", "0"], "--num_recursive_rounds"),
    (["--eval_every", "2"], "--eval_every needs --eval_dataset"),
    (["--eval_dataset", "{missing}"], "--eval_dataset"),
    (["--ckpt_override", "planner={torn}"], "not a readable safetensors file"),
    (["--ckpt_override", "planner={pickle}"], "weights_only"),
    (["--ckpt_override", "outer={outer_pickle}"], "weights_only"),
    (["--ckpt_override", "judge={torn}"], "--ckpt_override"),
    (["--role_model", "planner=tiny:nope"], "tiny"),
    (["--style", "sequential", "--mas_design", "nope"], "--style"),
    (["--outer_init", "rollout"], "--outer_init"),
    (["--outer_init", "state_bridge"], "--outer_init state_bridge: needs --rollout_latent_steps"),
]


def _run(main, argv, files, capsys):
    # the last occurrence of a flag wins, so each case overrides these valid defaults
    base = ["--dataset_name", files["data"], "--save_dir", files["out"], "--max_steps", "2"]
    rc = main(base + [a.format(**files) for a in argv])
    return rc, capsys.readouterr().err


CASES = [(train_inner, ["--num_workers", "0", *a], m) for a, m in INNER] + [(train_outer, a, m) for a, m in OUTER]


@pytest.mark.parametrize("job,argv,match", CASES,
                         ids=[f"{j.__name__.split('.')[-1]}:{' '.join(a)}" for j, a, _ in CASES])
def test_training_jobs_reject(job, argv, match, files, capsys, tiny_cache):
    rc, err = _run(job.main, argv, files, capsys)
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    assert "Traceback" not in err
