"""Placement presets as plans (pure) and the resource check that replaces a silent PENDING."""

import pytest

from recmas_ray.distributed.placement import PlacementConfig, check_resources, plan_placement

ROLES = ["math", "code", "science", "summarizer"]


def test_one_gpu_per_agent_has_one_bundle_per_role():
    plan = plan_placement(PlacementConfig(preset="one_gpu_per_agent", role_gpus={"science": 2}), ROLES)
    assert plan.strategy == "PACK" and plan.bundle_of == {r: i for i, r in enumerate(ROLES)}
    assert plan.bundles[2] == {"CPU": 0.25, "GPU": 2} and plan.gpus["math"] == 1.0


def test_colocated_shares_one_gpu_by_fractions():
    plan = plan_placement(PlacementConfig(preset="colocated"), ROLES[:3])
    assert plan.bundles == [{"CPU": 0.75, "GPU": 1.0}] and set(plan.bundle_of.values()) == {0}
    assert abs(sum(plan.gpus.values()) - 1.0) < 1e-9
    mixed = plan_placement(PlacementConfig(preset="colocated", role_gpus={"science": 1, "math": 0.5, "code": 0.25,
                                                                          "summarizer": 0.25}), ROLES)
    assert mixed.bundles[0]["GPU"] == 2.0


def test_spread_and_cpu():
    assert plan_placement(PlacementConfig(preset="spread"), ROLES).strategy == "SPREAD"
    cpu = plan_placement(PlacementConfig(preset="cpu", cpus_per_agent=0.25), ROLES)
    assert all(b == {"CPU": 0.25} for b in cpu.bundles) and set(cpu.gpus.values()) == {0.0}


def test_impossible_placement_lists_what_is_missing():
    plan = plan_placement(PlacementConfig(preset="one_gpu_per_agent"), ROLES)
    with pytest.raises(ValueError, match=r"GPU: needs 4 \(math 1, code 1, science 1, summarizer 1\), cluster has 2"):
        check_resources(plan, {"CPU": 8, "GPU": 2}, [{"CPU": 8, "GPU": 2}], preset="one_gpu_per_agent")
    big = plan_placement(PlacementConfig(preset="one_gpu_per_agent", role_gpus={"science": 3}), ROLES)
    with pytest.raises(ValueError, match="fits on no single node"):
        check_resources(big, {"CPU": 8, "GPU": 8}, [{"CPU": 4, "GPU": 2}] * 4, preset="one_gpu_per_agent")


def test_bad_placement_config():
    from recmas_ray.config.checks import check_tree

    with pytest.raises(ValueError, match="preset 'everywhere': expected one of"):
        check_tree(PlacementConfig(preset="everywhere"))
    with pytest.raises(ValueError, match=r"role_gpus names \['judge'\]"):
        plan_placement(PlacementConfig(preset="one_gpu_per_agent", role_gpus={"judge": 1}), ROLES)
