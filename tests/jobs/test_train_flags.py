"""The training jobs' command lines: the release's flag names parse to the same config as ours, the new
fields reach the config, and --help answers without heavy imports."""

import subprocess
import sys
from pathlib import Path

import pytest

from recmas_ray.config.cli import parse_config
from recmas_ray.system.config import SystemConfig
from recmas_ray.train.config import InnerTrainConfig, OuterTrainConfig

VALUES = {"style": "mixture", "task": "code", "lr": "3e-4", "w_cos": "0.5", "w_mse": "0.25", "save_every": "7"}


def _parse(cls, *argv):
    return parse_config(cls, list(argv))[0]


def _release_names(cls) -> list:
    """The release's flag names the class accepts (its aliases of plain fields)."""
    return sorted((a, f) for a, f in cls.FLAG_ALIASES.items() if f in VALUES)


def _field(cfg, name):
    """A setting by its flag's name (the system's fields live in cfg.system)."""
    return getattr(cfg.system if name in SystemConfig.__dataclass_fields__ else cfg, name)


@pytest.mark.parametrize("alias,field", _release_names(InnerTrainConfig))
def test_every_inner_alias_parses_like_its_field(alias, field):
    value = VALUES[field]
    extra = ["--mas_role", "math"] if field == "style" else []
    got = _parse(InnerTrainConfig, f"--{alias}", value, *extra)
    assert got == _parse(InnerTrainConfig, f"--{field}", value, *extra)
    assert str(_field(got, field)) == str(type(_field(got, field))(value))


@pytest.mark.parametrize("alias,field", _release_names(OuterTrainConfig))
def test_every_outer_alias_parses_like_its_field(alias, field):
    value = VALUES[field]
    assert _parse(OuterTrainConfig, f"--{alias}", value) == \
        _parse(OuterTrainConfig, f"--{field}", value)


def test_release_fields_of_their_own(tmp_path):
    cfg = _parse(InnerTrainConfig, "--num_train_epochs", "2.5", "--lr_scheduler_type", "linear",
                 "--grad_accum_steps", "4", "--load_dir", str(tmp_path), "--role_model", "critic=tiny:llama",
                 "--ckpt_override", f"solver={tmp_path}")
    assert (cfg.num_train_epochs, cfg.lr_scheduler_type, cfg.grad_accum_steps) == (2.5, "linear", 4)
    assert cfg.load_dir == str(tmp_path) and cfg.system.role_models == {"critic": "tiny:llama"}
    assert cfg.system.ckpt_override == {"solver": str(tmp_path)}
    # one mechanism: the shared fields are the same fields in both jobs
    shared = {"max_steps", "batch_size", "lr", "save_every", "system", "storage_path"}
    assert shared <= set(InnerTrainConfig.__dataclass_fields__) & set(OuterTrainConfig.__dataclass_fields__)
    # test hooks never reach the user-facing configs
    for cls in (InnerTrainConfig, OuterTrainConfig):
        assert not [f for f in cls.__dataclass_fields__ if "fault" in f or "fail_at" in f]


@pytest.mark.parametrize("job", ["train_inner", "train_outer"])
def test_help_does_not_import_torch_or_ray(job):
    code = (f"import sys; from jobs import {job} as j\n"
            "try:\n    j.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert not {'torch', 'ray', 'transformers'} & set(sys.modules), sorted(sys.modules)")
    # from the checkout's root, as README runs the jobs (pip installs only recmas_ray)
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--adapter_lr" in out.stdout or job == "train_outer"
