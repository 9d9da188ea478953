"""How latent messages move between agent actors: one `Transport` object per way, with the checks each needs.

    object_store  messages go producer -> consumer through Ray's object store (CPU tensors); agents may restart
    rdt:gloo      Ray Direct Transport over gloo: CPU tensors stay in the producing agent and move point to point
    rdt:nccl      Ray Direct Transport over NCCL: CUDA tensors stay on the producer's GPU and move GPU to GPU
                  (a whole GPU per agent, cupy on every node)

`get_transport(name)` is the one lookup (an unknown name fails with one line naming the choices). Code asks the
object (`transport.check_placement(...)`) and never compares names; `TRANSPORT_NAMES` are the CLI's choices. No
Ray import here: what each way does on Ray (keep, send, fetch, release messages) is its strategy object in
`distributed/transports.py`, which reads `direct`, `on_gpu`, `collective_backend` and `tensor_transport`; nothing
else tests them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


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


OBJECT_STORE = Transport("object_store")
RDT_GLOO = Transport("rdt:gloo", direct=True, collective_backend="torch_gloo", tensor_transport="gloo")
RDT_NCCL = Transport("rdt:nccl", direct=True, collective_backend="nccl", tensor_transport="nccl", on_gpu=True,
                     needs_module="cupy")
TRANSPORTS: dict[str, Transport] = {t.name: t for t in (OBJECT_STORE, RDT_GLOO, RDT_NCCL)}
TRANSPORT_NAMES = tuple(TRANSPORTS)
"""The `--transport` choices."""


def get_transport(transport: str | Transport) -> Transport:
    """The transport of a flag value (a `Transport` passes through)."""
    if isinstance(transport, Transport):
        return transport
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; expected one of {TRANSPORT_NAMES}")
    return TRANSPORTS[transport]
