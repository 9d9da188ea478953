"""`ServeConfig`: the system a Serve deployment drives, how it is exposed, and the defaults of requests.

The same tree feeds `python -m jobs.serve` flags (through `config/cli.py`), a `--config FILE`, and the
`args:` of an application in a Ray Serve config file (`cluster/serve.yaml`, via `app.app_builder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import NonEmpty, OneOf, Range
from recmas_ray.config.evaluation import BACKENDS, DEVICES, DTYPES, MODEL_PRESETS, style_names
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.distributed.placement import PlacementConfig
from recmas_ray.styles.base import TASK_TYPES


@dataclass(kw_only=True)
class ServeConfig:
    """One served system: `POST /v1/chat/completions` and `GET /v1/models` on Ray Serve."""

    style: Annotated[str, OneOf(style_names)]
    """Collaboration style of the served system."""
    model_name: str | None = None
    """Name clients pass as `model` (default: the style name)."""
    preset: Annotated[str, OneOf(MODEL_PRESETS)] = "tiny"
    """Base models of the roles not named in models: tiny (random weights), demo or paper."""
    models: dict[str, str] = field(default_factory=dict)
    """ROLE=MODEL base model of a role (tiny:<family>, pkg:<name>, a HF id or a local path); also
    --role_model."""
    allow_base_model_mismatch: bool = False
    """Run the model given in --models even where the role's checkpoint names another one."""
    links: str | None = None
    """Folder of per-role link folders (planner/, ..., outer/) or a Hub id ORG/NAME[@REVISION][:SUBFOLDER]."""
    ckpt_override: dict[str, str] = field(default_factory=dict)
    """ROLE=DIR link folders (or Hub ids) over the ones found in links."""
    backend: Annotated[str, OneOf(BACKENDS)] = "ray"
    """ray: every agent is its own actor, driven from the replica; local: the agents load inside the replica."""
    device: Annotated[str, OneOf(DEVICES)] = "auto"
    """Where agents run: auto, cpu or cuda."""
    dtype: Annotated[str, OneOf(DTYPES)] = "auto"
    """Model dtype."""
    seed: Annotated[int, Range(0, 2**32 - 1)] = 42
    """Seed of fresh links and the default sampling seed."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Ray placement of each replica's agent actors."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 600.0
    """Timeout of one request's batch on Ray, in seconds."""
    torch_threads: Annotated[int, Range(0, 1024)] = 0
    """Torch threads per agent (0: the library default)."""
    task: Annotated[str, OneOf(TASK_TYPES)] = "math"
    """Task type of requests that name none (the extra body field `task`)."""
    recursion: RecursionConfig = field(default_factory=RecursionConfig)
    """Defaults of requests: method, R, m and decoding (a request's extra body fields override them)."""
    max_input_chars: Annotated[int, Range(1, 10_000_000)] = 16_000
    """Longest question accepted (characters of the last user message); longer ones get a 400."""
    host: str = "127.0.0.1"
    """HTTP host of the Serve proxy (0.0.0.0 to listen on every interface)."""
    port: Annotated[int, Range(1, 65535)] = 8000
    """HTTP port of the Serve proxy."""
    app_name: Annotated[str, NonEmpty()] = "recmas"
    """Name of the Serve application."""
    route_prefix: str = "/"
    """URL prefix of the application (the OpenAI routes live under <prefix>/v1)."""
    num_replicas: Annotated[int, Range(1, 1024)] = 1
    """Serve replicas; each drives its own system."""
    replica_cpus: Annotated[float, Range(0, 1024)] = 0.25
    """Logical CPUs of a replica (with backend local it also runs the models)."""
    max_ongoing_requests: Annotated[int, Range(1, 100_000)] = 32
    """Requests a replica works on at once (the Ray backend overlaps their batches across agents)."""

    @property
    def served_name(self) -> str:
        """The `model` name of the system."""
        return self.model_name or self.style

    def validate(self) -> None:
        """Roles named in models / ckpt_override must be roles of the style."""
        from recmas_ray.styles import get_style

        roles = get_style(self.style).roles
        for flag, table, extra in (("models", self.models, ()), ("ckpt_override", self.ckpt_override,
                                                                         ("outer",))):
            bad = sorted(set(table) - set(roles) - set(extra))
            if bad:
                raise ValueError(f"--{flag} names {bad}; expected roles of {self.style} {list(roles)}")
        if not self.route_prefix.startswith("/"):
            raise ValueError(f"--route_prefix {self.route_prefix!r} must start with '/'")
        self.placement.check_roles(roles)
