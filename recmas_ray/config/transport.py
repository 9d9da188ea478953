"""How latent messages move between agent actors: one `Transport` object per way, with the checks each needs.

    object_store  messages go producer -> consumer through Ray's object store (CPU tensors); agents may restart
    rdt:gloo      Ray Direct Transport over gloo: CPU tensors stay in the producing agent and move point to point
    rdt:nccl      Ray Direct Transport over NCCL: CUDA tensors stay on the producer's GPU and move GPU to GPU
                  (a whole GPU per agent, cupy on every node)

`TRANSPORTS` is the one registry: `register_transport(Transport(name, strategy=...))` adds a way, and every
`--transport` choice, check and strategy lookup reads it (`transport_names()`; `get_transport(name)` fails on an
unknown name with one line naming the choices). Code asks the object (`transport.check_placement(...)`) and never
compares names. No Ray import here: what each way does on Ray (keep, send, fetch, receive, release messages) is its
strategy class (`Transport.strategy`, a `distributed.transports.LatentTransport`), named here by its import path
for the package's own ways so that checking a flag never loads Ray; it reads `direct`, `on_gpu`,
`collective_backend` and `tensor_transport`, and nothing else tests them. Adding a transport is one file that
defines its strategy class and registers it (docs/architecture.md, "Adding a transport";
tests/extensions/toy_transport.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from recmas_ray.config.extensions import note_extension


@dataclass(frozen=True)
class Transport:
    """One way latents move between agents."""

    name: str
    """The flag value (`--transport`)."""
    direct: bool = False
    """Messages stay in the producing agent until the consumer fetches them point to point (Ray Direct
    Transport): the orchestrator never sees them, and an agent cannot restart without losing them."""
    collective_backend: str | None = None
    """Backend of the collective group the agents of a replica join (direct transports)."""
    tensor_transport: str | None = None
    """Ray's `tensor_transport` option of the call that fetches a kept message (direct transports)."""
    on_gpu: bool = False
    """Messages stay on the producer's CUDA device; each agent needs a whole GPU of its own."""
    needs_module: str | None = None
    """A Python module every node must have for this transport."""
    strategy: str | type = "recmas_ray.distributed.transports:ObjectStoreTransport"
    """What this way does on Ray: its `LatentTransport` class, or that class's `module:Class` path (loaded where
    the agents are built, so that the config layer never imports Ray). A class travels to Ray workers by
    reference: its module is imported there, and registers it there too."""

    def __str__(self) -> str:
        return self.name

    def actor_restarts(self, max_restarts: int) -> int:
        """Restarts (and retries of idempotent calls) an agent actor may have: none where it holds messages."""
        return 0 if self.direct else max_restarts

    def check_backend(self, backend: str) -> None:
        """A direct transport moves messages between Ray actors: the in-process backend has none."""
        if self.direct and backend == "local":
            raise ValueError(f"--transport {self.name} needs --backend ray")

    def check_ablation(self, latent_ablation: str) -> None:
        """Refuse `--latent_ablation` where the orchestrator cannot read the messages (before any model loads):
        the ablation rewrites received latents there, and a direct transport keeps them inside the agents."""
        if latent_ablation != "none" and self.direct:
            raise ValueError(f"--latent_ablation {latent_ablation} needs --transport {OBJECT_STORE.name} (the "
                             f"orchestrator rewrites the latents, and --transport {self.name} keeps them inside "
                             "the agents)")

    def check_adaptive_rounds(self, adaptive_threshold: float | None) -> None:
        """Refuse adaptive rounds on a direct transport (before any model loads): the stop check reads each
        message a second time and cuts rows out of it, and a direct transport hands a message out once."""
        if adaptive_threshold is not None and self.direct:
            raise ValueError(f"adaptive_threshold {adaptive_threshold:g} needs --transport {OBJECT_STORE.name} (the "
                             f"stop check reads each message twice; --transport {self.name} hands it out once)")

    def check_placement(self, placement, roles, *, device: str = "auto") -> None:
        """Refuse placements this transport cannot carry (before any model loads). A GPU transport moves CUDA
        tensors between distinct GPUs: every agent needs at least one whole GPU of its own (NCCL cannot have
        two ranks on one device)."""
        if not self.on_gpu:
            return
        flag = f"--transport {self.name}"
        if device == "cpu":
            raise ValueError(f"{flag} moves CUDA tensors between GPUs; it cannot work with --device cpu")
        if placement.preset == "cpu":
            raise ValueError(f"{flag} moves CUDA tensors between GPUs; it cannot work with --placement cpu")
        if placement.preset == "colocated" and len(roles) > 1:
            raise ValueError(f"{flag} needs one GPU per agent, but --placement colocated puts {len(roles)} agents "
                             "on one GPU (two NCCL ranks cannot share a device); use --placement "
                             f"one_gpu_per_agent or spread, or --transport {OBJECT_STORE.name}")
        shared = {r: g for r, g in placement.role_gpus.items() if r in roles and g < 1}
        if shared:
            raise ValueError(f"{flag} needs a whole GPU per agent, but --role_gpus gives "
                             f"{' '.join(f'{r}={g:g}' for r, g in shared.items())} (NCCL cannot put two ranks "
                             f"on one GPU); use --transport {OBJECT_STORE.name}")

    def check_installed(self) -> None:
        """The module this transport needs is importable here (checked where the agents are built)."""
        if self.needs_module and importlib.util.find_spec(self.needs_module) is None:
            raise ValueError(f"--transport {self.name} needs {self.needs_module} (pip install 'ray[cgraph]' or "
                             f"cupy-cuda12x) on every node; use --transport {OBJECT_STORE.name}")


TRANSPORTS: dict[str, Transport] = {}
"""Flag value -> its `Transport`, in registration order (the package's own first)."""


def register_transport(transport: Transport) -> Transport:
    """Add a way latents move: its name becomes a `--transport` choice, its checks run on every config naming it,
    and its strategy carries the messages on Ray. Registering the same declaration again is a no-op (a module
    imported twice, or in a Ray worker); another declaration under a taken name raises ValueError."""
    other = TRANSPORTS.get(transport.name)
    if other is not None and other != transport:
        raise ValueError(f"transport {transport.name!r} is already registered")
    TRANSPORTS[transport.name] = transport
    note_extension()
    return transport


_DIRECT = "recmas_ray.distributed.transports:DirectTransport"
OBJECT_STORE = register_transport(Transport("object_store"))
RDT_GLOO = register_transport(Transport("rdt:gloo", direct=True, collective_backend="torch_gloo",
                                        tensor_transport="gloo", strategy=_DIRECT))
RDT_NCCL = register_transport(Transport("rdt:nccl", direct=True, collective_backend="nccl", tensor_transport="nccl",
                                        on_gpu=True, needs_module="cupy", strategy=_DIRECT))
TRANSPORT_NAMES = tuple(TRANSPORTS)
"""The package's own transports (`transport_names()` adds the registered ones)."""


def transport_names() -> tuple[str, ...]:
    """Every registered transport's name: the `--transport` choices."""
    return tuple(TRANSPORTS)


def get_transport(transport: str | Transport) -> Transport:
    """The transport of a flag value (a `Transport` passes through)."""
    if isinstance(transport, Transport):
        return transport
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; expected one of {transport_names()}")
    return TRANSPORTS[transport]
