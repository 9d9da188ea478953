"""`ServeConfig`: the system a Serve deployment drives, how it is exposed, and the defaults of requests.

The same tree feeds `python -m jobs.serve` flags (through `config/cli.py`), a `--config FILE`, and the
`args:` of an application in a Ray Serve config file (`cluster/serve.yaml`, via `app.app_builder`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import NonEmpty, OneOf, Range
from recmas_ray.config.choices import BACKENDS
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.serve.security import API_KEY_ENV, key_digest
from recmas_ray.styles import get_style
from recmas_ray.system.config import SystemConfig
from recmas_ray.tasks import TASK_TYPES


@dataclass(kw_only=True)
class ServeConfig:
    """One served system: `POST /v1/chat/completions` and `GET /v1/models` on Ray Serve."""

    SYSTEM_FIELDS = ("style", "preset", "role_models", "ckpt_override", "links",
                     "allow_base_model_mismatch", "allow_style_mismatch", "allow_task_mismatch", "prompt_set",
                     "device", "dtype",
                     "seed", "continuous_batching")
    """System fields a served system reads (the others get no flag and are refused when set)."""
    FLAG_ALIASES = {"models": "system.role_models", "role_model": "system.role_models",
                    "placement": "placement.preset"}
    """jobs.serve's other spellings: of the per-role base models and of the placement preset."""

    system: SystemConfig
    """The served system: style, base models, links (a folder or Hub id, ckpt_override over it per role),
    device, dtype and seed (of fresh links and the default sampling seed)."""

    model_name: str | None = None
    """Name clients pass as `model` (default: the style name)."""
    backend: Annotated[str, OneOf(BACKENDS)] = "ray"
    """ray: every agent is its own actor, driven from the replica; local: the agents load inside the replica."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Ray placement of each replica's agent actors."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 600.0
    """Timeout of one request's batch on Ray, in seconds."""
    torch_threads: Annotated[int, Range(0, 1024)] = 0
    """Torch threads per agent (0: the library default)."""
    task: Annotated[str | None, OneOf(TASK_TYPES)] = None
    """Task type of requests that name none (the extra body field `task`); unset: the task the links were
    trained on (their manifests), else math."""
    recursion: RecursionConfig = field(default_factory=RecursionConfig)
    """Defaults of requests: method, R, m and decoding (a request's extra body fields override them)."""
    max_input_chars: Annotated[int, Range(1, 10_000_000)] = 16_000
    """Longest question accepted (characters of the last user message); longer ones get a 400."""
    host: str = "127.0.0.1"
    """HTTP host of the Serve proxy (0.0.0.0 to listen on every interface). Replicas' own gRPC servers
    listen on their Ray node's address (127.0.0.1 on the private local cluster), never on every interface."""
    address: str | None = None
    """Ray cluster to join (default: $RAY_ADDRESS, else a private local cluster on 127.0.0.1)."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer key clients must send (`Authorization: Bearer KEY`, as vLLM's --api-key) on /v1 routes;
    default $RECMAS_API_KEY (prefer it: a flag shows in `ps`). Kept only as its SHA-256 digest
    ("sha256:<hex>", which may be given instead), so the key is never logged or saved; none: no auth."""
    max_request_bytes: Annotated[int, Range(1024, 1 << 30)] = 4 << 20
    """Largest request body accepted (bytes); larger ones get HTTP 413 before they are read."""
    max_batch_size: Annotated[int, Range(1, 1024)] = 16
    """Most rows (requests x n) one batch runs through the agents (1: every request alone)."""
    batch_wait_timeout_s: Annotated[float, Range(0, 60)] = 0.02
    """How long the first request of a batch waits for compatible ones to join it."""
    max_concurrent_batches: Annotated[int, Range(1, 64)] = 1
    """Batches a replica runs at once (backend local always runs one). 1 keeps batches whole; 2 or more let Ray
    agents on separate devices work on different batches at once (on a few CPU cores it splits batches)."""
    port: Annotated[int, Range(1, 65535)] = 8000
    """HTTP port of the Serve proxy."""
    app_name: Annotated[str, NonEmpty()] = "recmas"
    """Name of the Serve application."""
    log_dir: str = "out/serve/logs"
    """Where Ray, Ray Serve and HF output goes (serve.log) unless verbose."""
    verbose: bool = False
    """Show Ray, Ray Serve and HF output on the console (else it goes to log_dir/serve.log)."""
    route_prefix: str = "/"
    """URL prefix of the application (the OpenAI routes live under <prefix>/v1)."""
    num_replicas: Annotated[int, Range(1, 1024)] = 1
    """Serve replicas; each drives its own system."""
    replica_cpus: Annotated[float, Range(0, 1024)] = 0.25
    """Logical CPUs of a replica (with backend local it also runs the models)."""
    max_ongoing_requests: Annotated[int, Range(1, 100_000)] = 128
    """Requests a replica holds at once (queued for a batch or running); more wait in Serve's queue."""
    dry_run: bool = False
    """Print the memory plan (per GPU: the roles and copies of every replica, their weight and KV bytes at
    max_batch_size, from the models' configs) and exit without starting Serve or loading a model; a plan that does
    not fit is refused (exit status 2), as serving on GPUs does before its agents load."""

    @property
    def served_name(self) -> str:
        """The `model` name of the system."""
        return self.model_name or self.system.style

    def validate(self) -> None:
        """Roles named in models / ckpt_override must be roles of the style; the API key becomes its digest."""
        if self.api_key is None and os.environ.get(API_KEY_ENV):
            self.api_key = os.environ[API_KEY_ENV]
        if self.api_key is not None:
            self.api_key = key_digest(self.api_key)

        system = self.system
        roles = get_style(system.style).roles
        for flag, table, extra in (("models", system.role_models, ()), ("ckpt_override", system.ckpt_override,
                                                                           ("outer",))):
            bad = sorted(set(table) - set(roles) - set(extra))
            if bad:
                raise ValueError(f"--{flag} names {bad}; expected roles of {system.style} {list(roles)}")
        if not self.route_prefix.startswith("/"):
            raise ValueError(f"--route_prefix {self.route_prefix!r} must start with '/'")
        system.check_link_folders()
        self.placement.check_roles(roles)
        self.placement.check_gpus_visible(self.backend, dry_run=self.dry_run)
