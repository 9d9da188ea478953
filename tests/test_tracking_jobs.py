"""`--tracking mlflow` in the jobs: evaluation metrics, inner and outer training losses land in a local MLflow
store that MLflow's own client reads back (per-step histories, artifacts, status)."""

import pytest

mlflow = pytest.importorskip("mlflow")


def _runs(store, monkeypatch=None):
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in for reading a file store
    client = mlflow.tracking.MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("recmas_ray")
    return client, client.search_runs([experiment.experiment_id]) if experiment else []


def test_run_job_tracks_its_metrics_and_files(tmp_path, tiny_cache, question_file):
    from jobs import run as run_job

    out = tmp_path / "out"
    assert run_job.main(["--style", "sequential_light", "--preset", "tiny", "--dataset", str(question_file),
                         "--backend", "local", "--num_recursive_rounds", "1", "--latent_steps", "2",
                         "--max_new_tokens", "4", "--method", "recursive_mas,single_agent", "--output_path", str(out),
                         "--no_progress", "--tracking", "mlflow"]) == 0
    client, (run,) = _runs(out / "mlruns")
    assert run.info.status == "FINISHED" and run.data.params["system.style"] == "sequential_light"
    assert 0 <= run.data.metrics["questions/recursive_mas/accuracy/strict"] <= 1
    assert "questions/single_agent/tokens_per_sample" in run.data.metrics
    assert not [m for m in run.data.metrics if m.endswith("/none")]
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert any(n.startswith("results_") for n in names) and any(n.startswith("samples_") for n in names)
    import json

    config = json.loads(open(client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))).read())
    assert config["system"]["style"] == "sequential_light" and config["methods"] == ["recursive_mas", "single_agent"]


@pytest.mark.integration  # Ray Train: three inner runs and one outer run on tiny models (~2 min here)
@pytest.mark.timeout(1200)  # a hang guard only: four Ray Train start-ups overran 300 s on a loaded 2-core machine
def test_training_jobs_track_losses_per_step(tmp_path, tiny_cache, ray_cluster):
    from jobs import train_inner, train_outer

    inner, outer = tmp_path / "inner", tmp_path / "outer"
    assert train_inner.main(["--mas_design", "sequential", "--mas_role", "all", "--preset", "tiny",
                             "--dataset_name", "synthetic:16", "--save_dir", str(inner), "--max_steps", "3",
                             "--save_every", "3", "--num_workers", "0", "--tracking", "mlflow"]) == 0
    client, runs = _runs(inner / "mlruns")
    assert sorted(r.info.run_name for r in runs) == ["inner-critic", "inner-planner", "inner-solver"]
    for run in runs:
        history = client.get_metric_history(run.info.run_id, "loss")
        assert history and max(m.step for m in history) == 3
        assert "loss_curve.png" in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert (inner / "planner" / "loss_curve.png").is_file()

    assert train_outer.main(["--style", "sequential_light", "--preset", "tiny", "--dataset_name", "synthetic:16",
                             "--save_dir", str(outer), "--num_recursive_rounds", "1", "--max_latent_tokens", "4",
                             "--max_steps", "3", "--eval_every", "3", "--eval_dataset", "synthetic:4",
                             "--tracking", "mlflow"]) == 0
    client, (run,) = _runs(outer / "mlruns")
    assert run.info.run_name == "outer-sequential_light" and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")][-1] == 3
    assert client.get_metric_history(run.info.run_id, "eval_loss")


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
