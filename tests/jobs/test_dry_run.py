"""`--dry_run` prints the memory plan per GPU and loads nothing; a plan that does not fit is refused with one
line (exit 2), by the dry run and by a real run before its agents start. GPUs are simulated (node tables)."""

import pytest

import jobs.run as run_job
import jobs.serve as serve_job

TINY = ["--style", "sequential_light", "--preset", "tiny", "--dataset", "jobs/examples/questions.jsonl"]


@pytest.fixture
def gpu_cluster(monkeypatch, tiny_cache):
    """One simulated node with 4 GPUs; Ray, agents and model loads fail the test if reached."""
    import recmas_ray.config.inputs as inputs
    import recmas_ray.distributed.cluster as cluster
    import recmas_ray.distributed.memory as memory
    import recmas_ray.eval.batch_runner as driver
    import recmas_ray.models.loader as loader

    def boom(*a, **k):
        raise AssertionError("a model loaded or agents started during a memory plan")

    monkeypatch.setattr(inputs, "cuda_available", lambda: True)  # as on the GPU machine the plan is for
    monkeypatch.setattr(cluster, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr(memory, "cluster_nodes", lambda: [{"CPU": 16.0, "GPU": 4.0}])
    for mod, name in ((loader, "load_frozen_model"), (driver, "start_agents")):
        monkeypatch.setattr(mod, name, boom)


def test_dry_run_prints_each_gpu_and_writes_nothing(gpu_cluster, tmp_path, capsys):
    out = tmp_path / "out"
    rc = run_job.main([*TINY, "--placement", "one_gpu_per_agent", "--role_replicas", "critic=2",
                       "--placement.gpu_memory_gib", "80", "--dry_run", "--output_path", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "memory plan: 4 GPUs used" in text
    for gpu, role in ((0, "planner#0"), (1, "critic#0"), (2, "critic#1"), (3, "solver#0")):
        assert f"node 0 GPU {gpu}: " in text and f"{role} r0 (weights" in text
    # batch 8 x 8 batches at once (continuous batching, the default); 1024 + 32 latents + 256 decoded tokens
    assert "of 80.0 GiB" in text and "(64 rows x 1312 tokens)" in text
    assert not out.exists()


def test_a_plan_that_does_not_fit_is_refused_in_one_line(gpu_cluster, tmp_path, capsys):
    args = [*TINY, "--placement", "colocated", "--placement.gpu_memory_gib", "2", "--output_path", str(tmp_path)]
    assert run_job.main([*args, "--dry_run"]) == 2
    captured = capsys.readouterr()
    assert "node 0 GPU 0: 2.3" in captured.out and "DOES NOT FIT" in captured.out  # 48-row caches (batching on)
    assert captured.err.count("\n") == 1 and "memory plan: node 0 GPU 0 needs 2.3" in captured.err
    assert "but a GPU holds 2.00 GiB" in captured.err
    # the real run stops at the same check, before any agent starts (start_agents would fail the test)
    assert run_job.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memory plan: node 0 GPU 0 needs" in err, err


def test_serve_dry_run_counts_every_serve_replica(gpu_cluster, capsys):
    rc = serve_job.main(["--style", "sequential_light", "--preset", "tiny", "--placement", "one_gpu_per_agent",
                         "--num_replicas", "1", "--placement.gpu_memory_gib", "24", "--dry_run"])
    text = capsys.readouterr().out
    assert rc == 0 and "memory plan: 3 GPUs used" in text and "(16 rows x" in text, text


@pytest.fixture
def cpu_machine(monkeypatch, tiny_cache):
    """This machine as it is (no GPU), with Ray, agents and model loads failing the test if reached."""
    import recmas_ray.config.inputs as inputs
    import recmas_ray.distributed.cluster as cluster
    import recmas_ray.eval.batch_runner as driver
    import recmas_ray.models.loader as loader

    def boom(*a, **k):
        raise AssertionError("Ray started, a model loaded or agents started during a plan for other machines")

    monkeypatch.setattr(inputs, "cuda_available", lambda: False)  # a CPU laptop, even where a GPU is present
    for mod, name in ((cluster, "init_ray"), (cluster, "start_ray"), (loader, "load_frozen_model"),
                      (driver, "start_agents")):
        monkeypatch.setattr(mod, name, boom)


PLAN = ["--placement.plan_node_gpus", "4", "--placement.gpu_memory_gib", "24", "--dry_run"]


@pytest.mark.parametrize("dataset", ["jobs/examples/questions.jsonl", "math500"])  # math500: no local copy needed
def test_a_gpu_plan_prints_on_a_cpu_machine_given_the_target_gpus(dataset, cpu_machine, tmp_path, capsys):
    out = tmp_path / "out"
    rc = run_job.main(["--style", "sequential_light", "--preset", "tiny", "--dataset", dataset, "--placement",
                       "one_gpu_per_agent", "--role_replicas", "critic=2", "--output_path", str(out), *PLAN])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "memory plan: 4 GPUs used, on 1 planned node(s) with 4 GPUs (--placement.plan_node_gpus)" in captured.out
    assert "node 0 GPU 3: " in captured.out and "of 24.0 GiB" in captured.out and not out.exists()
    rc = serve_job.main(["--style", "sequential_light", "--preset", "tiny", "--placement", "colocated", *PLAN])
    assert rc == 0 and "memory plan: 1 GPUs used, on 1 planned node(s)" in capsys.readouterr().out


@pytest.mark.parametrize("args,flags", [
    (["--placement", "colocated", "--dry_run"], ["--placement cpu", "--placement.plan_node_gpus", "--placement.gpu_memory_gib"]),
    (["--placement", "colocated", "--placement.plan_node_gpus", "8", "--dry_run"], ["--placement.gpu_memory_gib"]),
    (["--placement", "colocated", *PLAN[:4]], ["--placement.plan_node_gpus", "--dry_run"]),  # a real run
    (["--placement", "one_gpu_per_agent", "--placement.plan_node_gpus", "2", "--placement.gpu_memory_gib", "24",
      "--dry_run"], ["--placement.plan_node_gpus", "--num_replicas", "--role_gpus"]),  # 3 agents, 2 GPUs
    (["--placement", "colocated", "--placement.plan_node_gpus", "1", "--placement.gpu_memory_gib", "0.5",
      "--dry_run"], ["--role_gpus", "--batch_size"]),  # does not fit
])
def test_every_refusal_of_a_plan_names_the_flag_that_changes_it(args, flags, cpu_machine, tmp_path, capsys):
    rc = run_job.main(["--style", "sequential_light", "--preset", "tiny", "--dataset", "jobs/examples/questions.jsonl",
                       "--output_path", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    for flag in flags:
        assert flag in err[0], (flag, err[0])
