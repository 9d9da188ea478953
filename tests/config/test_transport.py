"""Transports are objects: each says what it needs, and the checks refuse what it cannot carry."""

import pytest

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.transport import OBJECT_STORE, RDT_GLOO, RDT_NCCL, TRANSPORT_NAMES, get_transport


def test_lookup_by_flag_value_and_unknown_names_refused():
    assert [get_transport(n) for n in TRANSPORT_NAMES] == [OBJECT_STORE, RDT_GLOO, RDT_NCCL]
    assert get_transport(RDT_GLOO) is RDT_GLOO
    with pytest.raises(ValueError, match=r"unknown transport 'rdt:mpi'; expected one of") as e:
        get_transport("rdt:mpi")
    assert "\n" not in str(e.value)


def test_direct_transports_keep_messages_in_agents():
    assert OBJECT_STORE.actor_restarts(3) == 3 and RDT_GLOO.actor_restarts(3) == 0
    OBJECT_STORE.check_backend("local")
    OBJECT_STORE.check_ablation("zero")
    with pytest.raises(ValueError, match="needs --backend ray"):
        RDT_GLOO.check_backend("local")
    with pytest.raises(ValueError, match="--latent_ablation zero needs --transport object_store"):
        RDT_GLOO.check_ablation("zero")


def test_gpu_transport_needs_a_whole_gpu_per_agent():
    roles = ("planner", "solver")
    RDT_GLOO.check_placement(PlacementConfig(preset="cpu"), roles, device="cpu")
    RDT_NCCL.check_placement(PlacementConfig(preset="one_gpu_per_agent"), roles)
    for placement, device, expected in ((PlacementConfig(preset="cpu"), "auto", "--placement cpu"),
                                        (PlacementConfig(preset="one_gpu_per_agent"), "cpu", "--device cpu"),
                                        (PlacementConfig(preset="colocated"), "auto", "colocated puts 2 agents"),
                                        (PlacementConfig(preset="spread", role_gpus={"solver": 0.5}), "auto",
                                         "solver=0.5")):
        with pytest.raises(ValueError, match=expected):
            RDT_NCCL.check_placement(placement, roles, device=device)
