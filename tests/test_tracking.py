"""Experiment tracking: a job's run, parameters, stepped metrics and artifacts read back from a local MLflow
store with MLflow's own client; bad tracking settings are one-line errors; secrets never become parameters."""

import json

import pytest

from recmas_ray.config.checks import ConfigError, check_tree
from recmas_ray.tracking import Tracker, TrackingConfig, flat_params, start_run

mlflow = pytest.importorskip("mlflow")


def test_mlflow_run_reads_back_with_mlflow_client(tmp_path):
    result = tmp_path / "results.json"
    result.write_text(json.dumps({"accuracy": 0.5}))
    config = {"lr": 1e-3, "recursion": {"latent_steps": 8}, "tavily_keys_file": "/secret/keys", "api_key": "x"}
    tracker = start_run(TrackingConfig(tracking="mlflow"), output_dir=tmp_path, run_name="inner-planner",
                        config=config)
    for step, loss in enumerate([1.0, 0.7, 0.5], start=1):
        tracker.log_metrics({"loss": loss, "note": "text is skipped", "bad": float("nan")}, step=step)
    tracker.log_metrics({"accuracy,strict": 0.25, "tokens_per_sample,none": 12.0})
    tracker.log_artifact(result)
    tracker.close()

    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("recmas_ray").experiment_id])
    assert run.info.run_name == "inner-planner" and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.001", "recursion.latent_steps": "8"}  # no keys file, no key
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == \
        [(1, 1.0), (2, 0.7), (3, 0.5)]
    assert run.data.metrics["accuracy/strict"] == 0.25 and "bad" not in run.data.metrics
    assert run.data.metrics["tokens_per_sample"] == 12.0  # no `/none` suffix
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["config.json", "results.json"]
    logged = json.loads(open(client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))).read())
    assert logged == {"lr": 1e-3, "recursion": {"latent_steps": 8}}  # the whole config, secrets left out


def test_no_tracking_is_a_silent_tracker(tmp_path):
    tracker = start_run(TrackingConfig(), output_dir=tmp_path, run_name="x", config={"a": 1})
    assert type(tracker) is Tracker and tracker.callback() is None
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cfg,fragment", [
    (TrackingConfig(tracking="mlflow", tracking_uri=" "), "--tracking_uri ''"),
    (TrackingConfig(tracking_uri="http://127.0.0.1:5000"), "needs --tracking mlflow or wandb"),
    (TrackingConfig(tracking="neptune"), "--tracking 'neptune': expected one of none, mlflow, wandb"),
    (TrackingConfig(tracking="mlflow", experiment_name=""), "--experiment_name"),
])
def test_bad_tracking_settings_are_one_line(cfg, fragment):
    with pytest.raises(ConfigError, match=None) as e:
        check_tree(cfg)
    assert fragment in str(e.value)


def test_flat_params_names_nested_fields_and_drops_secrets():
    got = flat_params({"a": {"b": 1, "token": "t"}, "models": {"planner": "x"}, "hf_token": "t", "c": [1, 2]})
    assert got == {"a.b": "1", "models.planner": "x", "c": "[1, 2]"}


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
