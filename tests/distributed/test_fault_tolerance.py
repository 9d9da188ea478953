"""Evaluation that survives failures: batch retries, error records, resume of errored samples, the
samples-file fingerprint, and (integration) agent actors that crash, restart and reload their model.

The light tests use the in-process backend (the retry logic is shared by both backends); the Ray
ones are marked integration.
"""

import glob
import json

import pytest


from jobs import run as run_job
from tests.conftest import EVERY_ATTEMPT


def args(qfile, out, *extra, backend="local"):
    return ["--style", "sequential_light", "--preset", "tiny", "--dataset", str(qfile), "--backend", backend,
            "--num_recursive_rounds", "1", "--latent_steps", "2", "--max_new_tokens", "4", "--batch_size", "2",
            "--output_path", str(out), "--no_progress", *extra]


def lines(out):
    (path,) = glob.glob(f"{out}/samples_*.jsonl")
    return [json.loads(line) for line in open(path)]


def latest_results(out):
    return json.loads(open(sorted(glob.glob(f"{out}/results_*.json"))[-1]).read())["results"]


def test_failed_batch_is_retried_then_skipped_then_resumed(question_file, tmp_path, inject_faults, tiny_cache):
    ok = tmp_path / "ok"
    inject_faults(fail_docs={"1": 2})  # the batch with doc 1 fails twice, the third try works
    assert run_job.main(args(question_file, ok)) == 0
    assert not any(r.get("error") for r in lines(ok)) and len(lines(ok)) == 4

    out = tmp_path / "skip"
    inject_faults(fail_docs={"1": EVERY_ATTEMPT})  # fails every time: 1 + 2 retries
    assert run_job.main(args(question_file, out)) == 1  # the run went on, but samples are missing
    rows = lines(out)
    errored = sorted(r["doc_id"] for r in rows if r.get("error"))
    assert errored == ["0", "1"] and all(r["attempts"] == 3 for r in rows if r.get("error"))
    assert "injected failure" in rows[0]["error"] or "injected failure" in rows[1]["error"]
    assert sorted(r["doc_id"] for r in rows if not r.get("error")) == ["2", "3"]
    (res,) = latest_results(out).values()
    assert res["n_errored"] == 2 and res["n_samples"] == 2  # accuracy over the graded samples only

    inject_faults()
    assert run_job.main(args(question_file, out, "--resume")) == 0
    final = {r["doc_id"]: r for r in lines(out)}  # the last line per sample wins
    assert sorted(final) == ["0", "1", "2", "3"] and not any(r.get("error") for r in final.values())
    (res,) = latest_results(out).values()
    assert res["n_errored"] == 0 and res["n_samples"] == 4
    # same predictions as the run that never failed
    assert {d: r["prediction"] for d, r in final.items()} == {r["doc_id"]: r["prediction"] for r in lines(ok)}


def test_resume_with_a_different_fingerprint_is_refused(question_file, tmp_path, capsys, tiny_cache):
    out = tmp_path / "fp"
    assert run_job.main(args(question_file, out, "--num_samples", "2")) == 0
    (side,) = glob.glob(f"{out}/samples_*.fingerprint.json")
    fp = json.loads(open(side).read())
    assert fp["recursion"]["num_recursive_rounds"] == 1 and fp["models"]["planner"].startswith("tiny:")
    assert set(fp["link_sha256"]) == {"inner:planner", "inner:critic", "inner:solver", "outer:planner->critic",
                                      "outer:critic->solver", "outer:solver->planner"}
    capsys.readouterr()
    before = open(glob.glob(f"{out}/samples_*.jsonl")[0]).read()
    rc = run_job.main(args(question_file, out, "--num_samples", "2", "--resume", "--num_recursive_rounds", "3",
                           "--style", "mixture"))
    err = capsys.readouterr().err
    assert rc == 2 and "recursion.num_recursive_rounds: 1 -> 3" in err and "style" in err, err
    assert open(glob.glob(f"{out}/samples_*.jsonl")[0]).read() == before  # nothing was mixed in
    assert run_job.main(args(question_file, out, "--num_samples", "2", "--resume", "--seed", "7")) == 2
    assert "link_sha256" in capsys.readouterr().err  # other seed, other fresh links
    assert run_job.main(args(question_file, out, "--num_samples", "2", "--resume")) == 0  # same run: fine


# ----------------------------------------------------------------------------- Ray: crashes and restarts

@pytest.mark.integration
@pytest.mark.timeout(600)
def test_crashed_agent_restarts_reloads_and_its_calls_are_retried(ray_cluster, inject_faults):
    import ray

    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
    from recmas_ray.distributed.replicas import build_ray_system
    from recmas_ray.config.placement import PlacementConfig
    from recmas_ray.engine.runner import run_batch
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system

    questions, cfg = ["What is 2 + 3?", "What is 6 * 7?"], RecursionConfig(
        method="recursive_mas", num_recursive_rounds=2, latent_steps=4, decode=DecodeConfig(max_new_tokens=6))
    plan = plan_system("sequential_light", preset="tiny", seed=5)
    local = run_batch(local_pool(plan), plan.style,
                      questions, ["math"] * 2, cfg)
    inject_faults(agent_exit_after={"critic": 1})  # the critic dies at its 2nd call (round 2), once
    system = build_ray_system(plan, PlacementConfig(preset="cpu", cpus_per_agent=0.25, agent_max_restarts=2),
                              timeout_s=180)
    try:
        pid_before = system.infos["critic"]["pid"]
        remote = ray.get(system.solve(questions, ["math"] * 2, cfg, batch_id="crash"), timeout=300)
        assert [r.prediction for r in remote] == [r.prediction for r in local]
        assert ray.get(system.handles["critic"].ready.remote(), timeout=60)["pid"] != pid_before  # restarted
    finally:
        system.shutdown()


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_ray_backend_retries_skips_and_resumes(question_file, tmp_path, inject_faults, ray_cluster):
    out = tmp_path / "ray"
    inject_faults(fail_docs={"2": EVERY_ATTEMPT})
    assert run_job.main(args(question_file, out, "--num_replicas", "2", backend="ray")) == 1
    rows = lines(out)
    assert sorted(r["doc_id"] for r in rows if r.get("error")) == ["2", "3"]
    assert {r["replica"] for r in rows if not r.get("error")} <= {0, 1}
    inject_faults()
    assert run_job.main(args(question_file, out, "--num_replicas", "2", "--resume", backend="ray")) == 0
    final = {r["doc_id"]: r for r in lines(out)}
    assert not any(r.get("error") for r in final.values())


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-x", "-m", "integration or not integration"]))
