"""The one config mechanism: flags from a dataclass tree, help from docstrings, files, recipes, checks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated

import pytest

from recmas_ray.config.checks import ConfigError, NonEmpty, OneOf, Range, WritableDir, check_tree
from recmas_ray.config.cli import assign_flags, parse_config, run_job
from recmas_ray.config.tree import save_config


@dataclass(kw_only=True)
class Inner:
    """A nested section."""

    SHORT_FLAGS = ("steps", "seed", "enabled")

    steps: Annotated[int, Range(0, 10)] = 3
    """Steps per round."""
    seed: int = 1
    """Shadowed by the top-level seed: only --inner.seed reaches it."""
    enabled: bool = True
    """On by default; --no_enabled turns it off."""


@dataclass(kw_only=True)
class Top:
    """A job."""

    FLAG_ALIASES = {"n_steps": "inner.steps"}

    name: Annotated[str, NonEmpty()]
    """Required, no default."""
    kind: Annotated[str, OneOf(("a", "b"))] = "a"
    """One of two kinds."""
    seed: int = 0
    """Top-level seed."""
    values: Annotated[list[int], Range(1, 5)] = field(default_factory=lambda: [1])
    """A list."""
    table: dict[str, float] = field(default_factory=dict)
    """KEY=VALUE items."""
    limit: int | None = None
    """Optional."""
    out: Annotated[str, WritableDir()] = "out"
    """An output directory."""
    inner: Inner = field(default_factory=Inner)
    """The nested section."""

    def validate(self) -> None:
        if self.kind == "b" and self.inner.steps == 0:
            raise ValueError("--kind b needs --steps >= 1")


def parse(argv, **kw):
    return parse_config(Top, argv, **kw)[0]


def test_flags_plain_dotted_and_shadowed():
    flags = {leaf.path: leaf.flags for leaf in assign_flags(Top)}
    assert flags["inner.steps"] == ["steps", "inner.steps", "n_steps"]
    assert flags["inner.seed"] == ["inner.seed"]  # the top-level --seed owns the plain name
    assert flags["seed"] == ["seed"]


def test_values_of_every_kind_parse():
    cfg = parse(["--name", "x", "--kind", "b", "--values", "1,2", "3", "--table", "p=1", "q=0.5,r=2",
                 "--limit", "none", "--n_steps", "4", "--inner.seed", "9", "--no_enabled", "--seed", "5"])
    assert cfg.values == [1, 2, 3] and cfg.table == {"p": 1.0, "q": 0.5, "r": 2.0} and cfg.limit is None
    assert cfg.inner == Inner(steps=4, seed=9, enabled=False) and cfg.seed == 5 and cfg.kind == "b"


@pytest.mark.parametrize("argv,message", [
    ([], "config: missing required setting(s) ['name']; give them as flags (--name)"),
    (["--name", ""], "--name is empty"),
    (["--name", "x", "--kind", "c"], "--kind 'c': expected one of a, b"),
    (["--name", "x", "--steps", "11"], "--steps 11: expected an integer in [0, 10]"),
    (["--name", "x", "--steps", "two"], "argument --steps/--inner.steps/--n_steps: expected an integer, got 'two'"),
    (["--name", "x", "--values", "1,9"], "--values 9: expected an integer in [1, 5]"),
    (["--name", "x", "--table", "p"], "item 'p' is not KEY=VALUE"),
    (["--name", "x", "--kind", "b", "--steps", "0"], "--kind b needs --steps >= 1"),
    (["--name", "x", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_values_are_one_clear_error(argv, message):
    with pytest.raises(ConfigError) as e:
        parse(argv)
    assert message in str(e.value)


def test_recipe_then_file_then_flags(tmp_path):
    def small() -> Top:
        """A small run."""
        return Top(name="recipe", seed=7, inner=Inner(steps=1))

    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"seed": 8, "inner": {"seed": 3}}))
    cfg = parse(["--small", "--config", str(path), "--steps", "2"], recipes={"small": small})
    assert (cfg.name, cfg.seed, cfg.inner.steps, cfg.inner.seed) == ("recipe", 8, 2, 3)
    yaml_path = tmp_path / "cfg.yaml"
    yaml_path.write_text("name: y\ninner:\n  steps: 5\n")
    assert parse(["--config", str(yaml_path)]).inner.steps == 5


def test_saved_config_reloads_identically(tmp_path):
    cfg = parse(["--name", "x", "--table", "a=1", "--values", "2,3"])
    assert parse(["--config", str(save_config(cfg, tmp_path))]) == cfg


def test_file_values_are_type_checked(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "x", "inner": {"steps": "many"}}))
    with pytest.raises(ConfigError, match="--steps 'many': expected an integer"):
        parse(["--config", str(path)])


def test_check_tree_on_configs_built_in_code():
    check_tree(Top(name="ok"))
    with pytest.raises(ConfigError, match="inner.steps -1"):
        check_tree(Top(name="ok", inner=Inner(steps=-1)))


def test_run_job_exit_codes(capsys):
    def main(cfg):
        if cfg.name == "fail":
            raise RuntimeError("the run failed\nsee log")
        return 0

    assert run_job(main, Top, ["--name", "ok"]) == 0
    assert run_job(main, Top, ["--name", "ok", "--steps", "99"]) == 2
    assert run_job(main, Top, ["--name", "fail"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: --steps 99: expected an integer in [0, 10]", "error: the run failed see log"]


def test_help_shows_docstrings_defaults_and_aliases(capsys):
    assert run_job(lambda cfg: 0, Top, ["--help"]) == 0
    text = capsys.readouterr().out
    assert "Steps per round. (range [0, 10]; default: 3)" in " ".join(text.split())
    assert "--no_enabled" in text and "--n_steps" in text and "required" in text


def test_help_is_each_fields_docstring_read_at_run_time():
    from recmas_ray.config.cli import leaves
    from recmas_ray.eval.config import EvalConfig

    docs = {leaf.path: leaf.doc for leaf in leaves(EvalConfig)}
    assert sum(bool(d) for d in docs.values()) >= 0.9 * len(docs)  # nearly every field has help
    assert docs["transport"].startswith("How latents move between agent actors")
