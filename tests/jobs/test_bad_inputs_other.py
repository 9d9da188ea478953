"""Bad input to the other jobs (benchmarks, serving, demo): one line, exit 2, nothing started or written.

`jobs/run.py` and the training jobs have their own, larger tables (test_bad_inputs_run.py,
test_bad_inputs_train.py); these rows check that every other job goes through the same mechanism.
"""

import importlib

import pytest

ROWS = [
    ("bench.speed", ["--latent_steps", "-1"], "--latent_steps -1"),
    ("bench.speed", ["--rounds", "0"], "--rounds 0"),
    ("bench.speed", ["--preset", "huge"], "--preset 'huge'"),
    ("bench.speed", ["--repeats", "x"], "expected an integer, got 'x'"),
    ("bench.scale", ["--replicas", "0"], "--replicas 0"),
    ("bench.scale", ["--ms_per_gparam", "-5"], "--ms_per_gparam -5.0"),
    ("bench.scale", ["--system", "chain"], "--system 'chain'"),
    ("bench.scale", ["--gpus", "2"], "--gpus 2"),
    ("bench.scale", ["--gpus", "40"], "--gpus 40: the simulated cluster has 2 x 15 fake GPUs"),
    ("bench.control", ["--capacity_in_flight", "16", "0"], "--capacity_in_flight 0"),
    ("bench.control", ["--capacity_batches_per_slot", "0"], "--capacity_batches_per_slot 0"),
    ("bench.hop", ["--sizes_mib", "0"], "--sizes_mib 0.0"),
    ("bench.hop", ["--transports", "rdt:nccl"], "--transports 'rdt:nccl': expected one of object_store, rdt:gloo"),
    ("bench.hop", ["--pairs", "far"], "--pairs 'far'"),
    ("bench.hop", ["--sizes_mib", "0.001"], "--sizes_mib 0.001: below one latent step"),
    ("bench.backend", ["--placement", "x"], "--placement 'x'"),
    ("bench.backend", ["--rounds", "100"], "--num_recursive_rounds 100"),
    ("bench.backend", ["--role_model", "planner"], "item 'planner' is not KEY=VALUE"),
    ("bench.outer", ["--num_microbatches", "3"], "--num_microbatches 3 exceeds --batch_size 2"),
    ("bench.outer", ["--steps", "0"], "--max_steps 0"),
    ("serve", ["--style", "sequential_light", "--port", "70000"], "--port 70000"),
    ("serve", ["--style", "nope"], "--style 'nope'"),
    ("demo", ["--preset", "huge"], "'huge'"),
    ("demo", ["--bogus"], "unrecognized arguments: --bogus"),
    ("demo", ["--role_model", "judge=pkg:smollm2-135m-instruct"], "--role_model names ['judge']; expected roles"),
    ("demo", ["--role_model", "critic="], "--role_model critic=: empty value"),
    ("demo", ["--facts.two_hop.role_models", "expert=pkg:gemma3-270m"], "--facts.two_hop.role_models names ['expert']"),
    ("bench.speed", ["--role_model", "judge=tiny:qwen3"], "--role_model names ['judge']"),
    ("bench.outer", ["--role_model", "boss=tiny:qwen3"], "--role_model names ['boss']"),
]


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail the test if a row gets past validation and starts Ray or loads a model."""
    import ray

    import recmas_ray.models.loader as loader

    def boom(*a, **k):
        raise AssertionError("bad input got past validation")

    monkeypatch.setattr(ray, "init", boom)
    monkeypatch.setattr(loader, "load_frozen_model", boom)


@pytest.mark.parametrize("job,argv,fragment", ROWS, ids=[f"{j}:{' '.join(a)}" for j, a, _ in ROWS])
def test_bad_input_is_one_line_exit_2(job, argv, fragment, tmp_path, capsys, nothing_starts):
    main = importlib.import_module(f"jobs.{job}").main
    out = tmp_path / "out"
    rc = main(argv + ["--output_path", str(out)] if job != "serve" else argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert fragment in err, err
    assert not out.exists()
