"""Every job's parser builds, and the CLI's short-flag rule holds.

A nested field has a plain flag only where its class declares it (`SHORT_FLAGS`); two declarations of the
same short flag in one tree, an alias that names an existing flag, or a declaration naming no field are
errors when the parser is built. Building every job's parser here is what catches such a clash.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import pytest

import recmas_ray.config.cli as cli

JOBS = ["run", "train_inner", "train_outer", "serve", "demo", "bench.speed", "bench.backend", "bench.outer",
        "bench.scale", "bench.scale_fit", "bench.scale_real", "bench.hop", "bench.serve", "push_links",
        "experiments.sweep_recipe", "experiments.continuous_hops", "inspect_links", "compare"]

# Short flags of nested fields that README commands, cluster job specs and users rely on.
EXPECTED_SHORT = {
    "run": ["latent_steps", "num_recursive_rounds", "max_new_tokens", "temperature", "top_p", "cpus_per_agent",
            "num_replicas", "num_clients", "python_timeout_s", "tracking", "latent_length", "placement"],
    "serve": ["latent_steps", "method", "max_new_tokens", "role_gpus", "placement"],
    "train_inner": ["tracking", "tracking_uri", "experiment_name"],
    "train_outer": ["tracking", "tracking_uri", "experiment_name"],
}


@pytest.fixture
def built(monkeypatch):
    """Records the flags of every parser built while the fixture is active."""
    seen: list[dict[str, list[str]]] = []
    real = cli.assign_flags

    def recording(cls, hidden=()):
        out = real(cls, hidden)
        seen.append({leaf.path: list(leaf.flags) for leaf in out})
        return out

    monkeypatch.setattr(cli, "assign_flags", recording)
    return seen


@pytest.mark.parametrize("job", JOBS)
def test_every_job_parser_builds(job, built, capsys):
    mod = importlib.import_module(f"jobs.{job}")
    rc = mod.main(["--help"])
    assert rc == 0 and "usage:" in capsys.readouterr().out
    assert built, f"jobs.{job} built no parser"
    flags = {f for leaf_flags in built[-1].values() for f in leaf_flags}
    missing = [f for f in EXPECTED_SHORT.get(job, []) if f not in flags]
    assert not missing, f"jobs.{job} lost flags {missing}"
    names = [f for leaf_flags in built[-1].values() for f in leaf_flags]
    assert len(names) == len(set(names)), f"jobs.{job}: a flag names two fields"


@dataclass(kw_only=True)
class A:
    SHORT_FLAGS = ("steps",)

    steps: int = 1
    """Declared: --steps."""
    width: int = 2
    """Undeclared: only --a.width."""


@dataclass(kw_only=True)
class B:
    SHORT_FLAGS = ("steps",)

    steps: int = 3
    """Also declares --steps."""


@dataclass(kw_only=True)
class One:
    a: A = field(default_factory=A)
    """Section a."""


@dataclass(kw_only=True)
class Both:
    a: A = field(default_factory=A)
    """Section a."""
    b: B = field(default_factory=B)
    """Section b."""


def test_short_flags_only_where_declared():
    flags = {leaf.path: leaf.flags for leaf in cli.assign_flags(One)}
    assert flags == {"a.steps": ["steps", "a.steps"], "a.width": ["a.width"]}


def test_two_declarations_of_one_short_flag_are_an_error():
    with pytest.raises(AssertionError, match="--steps is declared .* for both --a.steps and --b.steps"):
        cli.assign_flags(Both)
    # The job decides: hiding one section's field (or aliasing the name) resolves the clash.
    assert {leaf.path: leaf.flags for leaf in cli.assign_flags(Both, hidden=("b.steps",))}["a.steps"] == \
        ["steps", "a.steps"]


@dataclass(kw_only=True)
class Clash(One):
    FLAG_ALIASES = {"a.width": "a.steps"}


def test_an_alias_naming_an_existing_flag_is_an_error():
    with pytest.raises(AssertionError, match="alias --a.width of Clash is already the flag of --a.width"):
        cli.assign_flags(Clash)


@dataclass(kw_only=True)
class Bad:
    SHORT_FLAGS = ("nope",)

    x: int = 0
    """A field."""


@dataclass(kw_only=True)
class WithBad:
    bad: Bad = field(default_factory=Bad)
    """Section."""


def test_short_flags_must_name_fields():
    with pytest.raises(AssertionError, match=r"Bad.SHORT_FLAGS names no field: \['nope'\]"):
        cli.assign_flags(WithBad)


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])


def test_every_job_keeps_its_flags(built, capsys):
    """Nesting a section (e.g. `system`) keeps every flag a job accepted (job_flags.json, recorded
    before the change) and adds dotted names only."""
    import json
    from pathlib import Path

    recorded = json.loads((Path(__file__).with_name("job_flags.json")).read_text())
    for job, flags in recorded.items():
        real = cli.build_parser
        parsers = []

        def recording(*a, **k):
            p, lv = real(*a, **k)
            parsers.append(p)
            return p, lv

        cli.build_parser = recording
        try:
            assert importlib.import_module(f"jobs.{job}").main(["--help"]) == 0
        finally:
            cli.build_parser = real
        capsys.readouterr()
        now = {s for a in parsers[-1]._actions for s in a.option_strings}
        assert not set(flags) - now, f"jobs.{job} lost flags {sorted(set(flags) - now)}"
        assert all("." in f for f in now - set(flags)), f"jobs.{job} gained flags {sorted(now - set(flags))}"
