"""The training core shared by both loops: LR schedules (equal to Hugging Face's), the data order, epochs,
run folders on file:// storage, and resume that skips torn checkpoints."""

import json

import pytest
import torch

from recmas_ray.train.config import InnerTrainConfig
from recmas_ray.train import core


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_schedules_match_transformers(kind):
    import transformers

    make = {"cosine": transformers.get_cosine_schedule_with_warmup,
            "linear": transformers.get_linear_schedule_with_warmup,
            "constant": lambda opt, w, _: transformers.get_constant_schedule_with_warmup(opt, w)}[kind]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    hf = make(opt, 3, 20)
    for step in range(22):
        assert core.lr_factor(step, warmup_steps=3, max_steps=20, kind=kind, warmup_from_zero=True) == \
            pytest.approx(hf.lr_lambdas[0](step))


@pytest.mark.parametrize("warmup", [0, 1, 3, 10])
def test_default_schedule_never_wastes_the_first_step(warmup):
    """The default warmup ramps (step + 1) / (warmup + 1): step 0 moves the links, the ramp still rises to the
    peak, and after the warmup the schedule equals the reference one."""
    factors = [core.lr_factor(s, warmup_steps=warmup, max_steps=16) for s in range(16)]
    assert factors[0] > 0
    assert factors[:warmup + 1] == sorted(factors[:warmup + 1])
    assert factors[warmup] == pytest.approx(1.0)
    for s in range(warmup, 16):
        assert factors[s] == core.lr_factor(s, warmup_steps=warmup, max_steps=16, warmup_from_zero=True)
    assert sum(factors) > sum(core.lr_factor(s, warmup_steps=warmup, max_steps=16, warmup_from_zero=True)
                              for s in range(16)) - 1e-12


def test_data_order_is_a_function_of_seed_and_step():
    epoch = [i for s in range(5) for i in core.step_indices(10, s, 2, seed=1)]
    assert sorted(epoch) == list(range(10))  # each epoch is a permutation
    assert core.step_indices(10, 7, 2, seed=1) == core.step_indices(10, 7, 2, seed=1)
    assert core.step_indices(10, 0, 2, seed=1) != core.step_indices(10, 0, 2, seed=2)
    with pytest.raises(ValueError, match="cannot fill"):
        core.step_indices(3, 0, 4, seed=0)


def test_epochs_set_max_steps():
    cfg = InnerTrainConfig(num_train_epochs=2.5, max_steps=7)
    assert core.resolve_steps(cfg, 10, 4).max_steps == 7  # ceil(2.5 * 10 / 4)
    assert core.resolve_steps(InnerTrainConfig(max_steps=7), 10, 4).max_steps == 7
    assert core.resolve_steps(InnerTrainConfig(num_train_epochs=1, max_steps=99), 10, 3).max_steps == 4
    with pytest.raises(ValueError, match="cannot fill one step"):
        core.resolve_steps(cfg, 3, 4)


def _checkpoint(tmp_path, step):
    d = tmp_path / f"local{step}"
    d.mkdir()
    (d / "links.safetensors").write_bytes(b"w" * (100 + step))
    core.write_state(d, {"step": step})
    return core.seal(d)


def test_resume_skips_torn_checkpoints_on_file_uri(tmp_path):
    storage = core.RunStorage(f"file://{tmp_path / 'store'}", "run-x")
    for step in (2, 4, 6):
        storage.persist(_checkpoint(tmp_path, step), f"checkpoint_{step:06d}", num_to_keep=3)
    run = tmp_path / "store" / "run-x"
    assert storage.checkpoint_names() == ["checkpoint_000002", "checkpoint_000004", "checkpoint_000006"]
    assert storage.latest_complete().path.endswith("checkpoint_000006")
    # newest half-written: the weights file is shorter than the marker says
    (run / "checkpoint_000006" / "links.safetensors").write_bytes(b"w" * 10)
    assert storage.latest_complete().path.endswith("checkpoint_000004")
    # next: no marker at all (the writer died before sealing)
    (run / "checkpoint_000004" / core.COMPLETE).unlink()
    found = storage.latest_complete()
    assert found.path.endswith("checkpoint_000002")
    with found.as_directory() as d:
        assert core.read_state(d) == {"step": 2}
    # pruning keeps the newest num_to_keep
    storage.persist(_checkpoint(tmp_path, 8), "checkpoint_000008", num_to_keep=2)
    assert storage.checkpoint_names() == ["checkpoint_000006", "checkpoint_000008"]
    assert json.loads((run / "checkpoint_000008" / core.COMPLETE).read_text())["files"]["links.safetensors"] == 108
    storage.clear()
    assert not run.exists() and storage.latest_complete() is None


def test_local_paths_and_uris_name_the_same_folder(tmp_path):
    a = core.RunStorage(str(tmp_path / "s"), "r")
    b = core.RunStorage(f"file://{tmp_path / 's'}", "r")
    assert a.root == b.root == str(tmp_path / "s" / "r")
