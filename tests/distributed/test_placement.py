"""Placement presets as plans (pure) and the resource check that replaces a silent PENDING."""

import pytest

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.distributed.placement import check_resources, plan_placement

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


# ----------------------------------------------------------------------------- replicas (pure)

def test_replicas_that_fit_counts_whole_systems_with_their_orchestrator():
    from recmas_ray.distributed.placement import replicas_that_fit

    plan = plan_placement(PlacementConfig(preset="one_gpu_per_agent"), ROLES[:3])  # 3 x {CPU .25, GPU 1}
    nodes = [{"CPU": 8, "GPU": 4}, {"CPU": 8, "GPU": 4}]
    assert replicas_that_fit(plan, nodes) == 2  # one per 4-GPU node; the 4th GPUs cannot hold a system
    assert replicas_that_fit(plan, [{"CPU": 8, "GPU": 6}]) == 2
    assert replicas_that_fit(plan, [{"CPU": 1.5, "GPU": 6}]) == 0  # 0.75 + 1 orchestrator CPU > 1.5
    cpu = plan_placement(PlacementConfig(preset="cpu", cpus_per_agent=0.25), ROLES[:3])
    assert replicas_that_fit(cpu, [{"CPU": 8}]) == 4  # 1.75 CPUs each
    assert replicas_that_fit(cpu, [{"CPU": 8}], extra_cpus_per_replica=0.5, reserve_cpus=1) == 3


def test_a_replica_that_fits_one_node_is_strictly_packed():
    from recmas_ray.distributed.placement import replica_strategy

    plan = plan_placement(PlacementConfig(preset="one_gpu_per_agent"), ROLES[:3])
    assert replica_strategy(plan, [{"CPU": 4, "GPU": 3}]) == "STRICT_PACK"
    assert replica_strategy(plan, [{"CPU": 4, "GPU": 2}] * 2) == "PACK"  # must span nodes
    assert replica_strategy(plan_placement(PlacementConfig(preset="spread"), ROLES[:3]), [{"CPU": 4, "GPU": 3}]) \
        == "SPREAD"


def test_resource_check_covers_every_replica():
    plan = plan_placement(PlacementConfig(preset="one_gpu_per_agent"), ROLES[:3])
    check_resources(plan, {"CPU": 8, "GPU": 6}, [{"CPU": 4, "GPU": 3}] * 2, preset="p", num_replicas=2)
    with pytest.raises(ValueError, match=r"GPU: needs 9 \(3 replicas x math 1"):
        check_resources(plan, {"CPU": 8, "GPU": 6}, [{"CPU": 4, "GPU": 3}] * 2, preset="p", num_replicas=3)


def test_more_than_one_gpu_must_be_whole():
    with pytest.raises(ValueError, match=r"--role_gpus science=1.5: above one GPU"):
        PlacementConfig(preset="one_gpu_per_agent", role_gpus={"science": 1.5}).validate()
    from recmas_ray.distributed.placement import gpu_count

    assert [gpu_count(g) for g in (0, 0.5, 1, 2, 4)] == [1, 1, 1, 2, 4]


# ----------------------------------------------------------------------------- NCCL refused before models load

def _run_cli(argv, capsys):
    from jobs import run as run_job

    rc = run_job.main(["--style", "sequential_light", "--dataset", "gsm8k", "--print_config", *argv])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--placement", "cpu"], "--placement cpu"),
    (["--placement", "one_gpu_per_agent", "--device", "cpu"], "--device cpu"),
    (["--placement", "colocated"], "--placement colocated puts 3 agents on one GPU"),
    (["--placement", "one_gpu_per_agent", "--role_gpus", "planner=0.5"], "--role_gpus gives planner=0.5"),
])
def test_nccl_misconfiguration_is_refused_naming_the_setting(argv, needle, capsys, monkeypatch):
    rc, err = _run_cli(["--transport", "rdt:nccl", *argv], capsys)
    assert rc == 2 and needle in err and err.count("\n") == 1, err
    import recmas_ray.config.inputs as inputs

    monkeypatch.setattr(inputs, "cuda_available", lambda: True)  # as on a GPU machine, where it would run
    rc, _ = _run_cli(["--transport", "rdt:nccl", "--placement", "one_gpu_per_agent", "--role_gpus", "solver=2"],
                     capsys)
    assert rc == 0  # whole GPUs per agent: accepted


# ----------------------------------------------------------------------------- autoscaling: wait, then report

def test_autoscaling_request_waits_with_progress_instead_of_failing_fast(ray_cluster, caplog):
    import logging
    import time

    from recmas_ray.distributed.placement import create_placement

    plan = plan_placement(PlacementConfig(preset="one_gpu_per_agent"), ROLES[:2])  # GPUs the cluster lacks
    with pytest.raises(ValueError, match="GPU: needs 2"):  # cannot grow: at once, shortfall named
        create_placement(plan, preset="one_gpu_per_agent", timeout_s=30, autoscaling=False)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="recmas_ray.distributed.placement"):
        with pytest.raises(RuntimeError, match="not ready after 5s.*autoscaler did not add the nodes"):
            create_placement(plan, preset="one_gpu_per_agent", timeout_s=30, autoscaling=True,
                             placement_timeout_s=5, progress_every_s=0.5, name="autoscale-test")
    assert time.monotonic() - t0 >= 5
    assert any("waiting" in r.getMessage() for r in caplog.records)
    pending = [pg for pg in ray_cluster.util.placement_group_table().values()
               if pg["name"] == "autoscale-test" and pg["state"] != "REMOVED"]
    assert not pending  # the waiting group was removed on timeout


def test_autoscaler_detection_from_its_status_report():
    import json

    from recmas_ray.distributed.placement import autoscaling_from_status

    def status(mapping, **extra):
        return json.dumps({"autoscaler_report": {"active_nodes": {}, "pending_launches": {}, "pending_nodes": [],
                                                 "node_type_mapping": mapping, **extra}})

    # a local cluster's read-only monitor (measured shape): types named after the nodes
    assert not autoscaling_from_status(status({"de31": "node_de31", "aa07": "node_aa07"}))
    assert autoscaling_from_status(status({"de31": "head", "aa07": "gpu_worker"}))  # `ray up` config types
    assert autoscaling_from_status(status({}, pending_launches={"gpu_worker": 1}))
    assert not autoscaling_from_status(None) and not autoscaling_from_status("not json")


def _place_like_ray(plan, nodes: list[dict], n: int) -> int:
    """How many of `n` replicas a Ray-like scheduler places: each replica's placement group as created
    (STRICT_PACK: every bundle on one node; else bundle by bundle), then its orchestrator CPU anywhere."""
    from recmas_ray.distributed.placement import ORCHESTRATOR_CPUS, replica_strategy

    free = [dict(x) for x in nodes]
    strategy = replica_strategy(plan, nodes)

    def fits(node, need):
        return all(node.get(k, 0) + 1e-9 >= v for k, v in need.items())

    def take(node, need):
        for k, v in need.items():
            node[k] -= v

    placed = 0
    for _ in range(n):
        if strategy == "STRICT_PACK":
            need = {}
            for b in plan.bundles:
                for k, v in b.items():
                    need[k] = need.get(k, 0) + v
            node = next((x for x in free if fits(x, need)), None)
            if node is None:
                break
            take(node, need)
        else:
            for b in plan.bundles:
                node = next((x for x in free if fits(x, b)), None)
                if node is None:
                    return placed
                take(node, b)
        node = next((x for x in free if fits(x, {"CPU": ORCHESTRATOR_CPUS})), None)
        if node is None:
            break
        take(node, {"CPU": ORCHESTRATOR_CPUS})
        placed += 1
    return placed


@pytest.mark.parametrize("nodes,gpus,num_roles", [(2, 8, 3), (3, 3, 2), (4, 5, 3), (2, 7, 2), (1, 8, 3)])
def test_auto_replica_count_on_several_nodes_places_every_replica_it_plans(nodes, gpus, num_roles):
    """2 x 8 GPUs, 3 agents: 2 strictly packed replicas per node = 4 (the old count, 5, let the last one
    span both nodes, which its STRICT_PACK placement group never does)."""
    from recmas_ray.distributed.placement import replicas_that_fit

    plan = plan_placement(PlacementConfig(preset="one_gpu_per_agent"), ROLES[:num_roles])
    cluster = [{"CPU": 16, "GPU": gpus} for _ in range(nodes)]
    n = replicas_that_fit(plan, cluster)
    assert n == nodes * (gpus // num_roles)
    assert _place_like_ray(plan, cluster, n) == n
    assert _place_like_ray(plan, cluster, n + 1) == n  # and exactly what fits: one more would not place


@pytest.mark.parametrize("transport", ["rdt:gloo", "rdt:nccl"])
def test_latent_ablation_with_direct_transport_is_refused_up_front(transport, capsys):
    """The orchestrator rewrites the latents for an ablation; RDT latents never reach it (every batch failed)."""
    rc, err = _run_cli(["--transport", transport, "--placement", "one_gpu_per_agent", "--latent_ablation", "zero"],
                       capsys)
    assert rc == 2 and "--latent_ablation zero needs --transport object_store" in err and err.count("\n") == 1, err
    rc, _ = _run_cli(["--transport", "rdt:gloo", "--placement", "cpu", "--latent_ablation", "none"], capsys)
    assert rc == 0


@pytest.mark.parametrize("gpus", ["0.5", "2"])
def test_outer_pipeline_refuses_anything_but_one_gpu_per_worker(gpus, capsys, monkeypatch):
    """NCCL point to point between the outer pipeline's role workers: two ranks cannot share a GPU."""
    from jobs import train_outer
    from recmas_ray.config import inputs

    monkeypatch.setattr(inputs, "cuda_available", lambda: True)  # the GPU check passes; this rule is the point

    base = ["--style", "sequential_light", "--dataset_name", "synthetic:8", "--print_config", "--use_gpu"]
    rc = train_outer.main([*base, "--gpus_per_worker", gpus])
    err = capsys.readouterr().err
    assert rc == 2 and f"--gpus_per_worker {gpus}" in err and err.count("\n") == 1, err
    assert train_outer.main([*base, "--gpus_per_worker", "1"]) == 0


def test_message_dtype_is_a_config_field(capsys):
    rc = _run_cli(["--message_dtype", "bf16"], capsys)[0]
    assert rc == 0
    rc, err = _run_cli(["--message_dtype", "int8"], capsys)
    assert rc == 2 and "--message_dtype 'int8'" in err and err.count("\n") == 1, err
