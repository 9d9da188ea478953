"""Offline checks of the cluster files in cluster/: they validate, and typos in them do not.

No Ray cluster, kubectl or network is needed. The launcher configs go through Ray's own schema
(`ray up` validation); the KubeRay manifests through tests.cluster.cluster_schema's field schema.
"""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import ray
import yaml

from tests.cluster.cluster_schema import (
    check_image_tag,
    validate_kuberay_manifest,
    validate_launcher_config,
    validate_runtime_env,
)

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "cluster"
LAUNCHER_CONFIGS = ["aws.yaml", "gcp.yaml"]
KUBERAY_MANIFESTS = ["kuberay/raycluster.yaml", "kuberay/rayjob.yaml"]


def _load(rel: str) -> dict:
    return yaml.safe_load((CLUSTER / rel).read_text())


def _write(tmp_path: Path, doc: dict, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _cluster_spec(doc: dict) -> dict:
    """The RayCluster spec inside a RayCluster or a RayJob."""
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


# ------------------------------------------------------------------------------------------
# Launcher configs (ray up)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rel", LAUNCHER_CONFIGS)
def test_shipped_launcher_config_validates(rel):
    cfg = validate_launcher_config(CLUSTER / rel)
    # fillout_defaults ran: the field validate_config insists on is present.
    assert "cluster_synced_files" in cfg
    assert cfg["docker"]["image"] == f"rayproject/ray:{ray.__version__}-py311-gpu"
    assert cfg["available_node_types"][cfg["head_node_type"]]["resources"] == {"CPU": 0}
    gpu_types = [t for t in cfg["available_node_types"].values() if t["resources"].get("GPU", 0) > 0]
    assert gpu_types and all(t["max_workers"] >= t["min_workers"] >= 1 for t in gpu_types)
    assert any("--num-cpus=0" in c for c in cfg["head_start_ray_commands"])
    assert any("--ulimit nofile=65536:65536" in o for o in cfg["docker"]["run_options"])


@pytest.mark.parametrize("rel", LAUNCHER_CONFIGS)
def test_launcher_top_level_typo_fails(tmp_path, rel):
    cfg = _load(rel)
    cfg["max_wrkers"] = cfg.pop("max_workers")
    path = _write(tmp_path, cfg)
    with pytest.raises(ValueError, match="max_wrkers") as err:
        validate_launcher_config(path)
    assert str(path) in str(err.value)


def test_launcher_node_type_typo_fails(tmp_path):
    cfg = _load("aws.yaml")
    worker = cfg["available_node_types"]["gpu_worker"]
    worker["max_wrkers"] = worker.pop("max_workers")
    with pytest.raises(ValueError, match=r"available_node_types/gpu_worker.*max_wrkers"):
        validate_launcher_config(_write(tmp_path, cfg))


def test_launcher_min_workers_above_global_max_fails(tmp_path):
    cfg = _load("gcp.yaml")
    cfg["max_workers"] = 1  # gpu_worker keeps min_workers 3
    with pytest.raises(ValueError, match="max_workers"):
        validate_launcher_config(_write(tmp_path, cfg))


@pytest.mark.parametrize("image", ["rayproject/ray:2.59.0-py311-gpu", "rayproject/ray:latest", "rayproject/ray"])
def test_launcher_docker_tag_must_match_ray(tmp_path, image):
    cfg = _load("aws.yaml")
    cfg["docker"]["image"] = image
    with pytest.raises(ValueError, match=ray.__version__.replace(".", r"\.")):
        validate_launcher_config(_write(tmp_path, cfg))


def test_launcher_worker_image_tag_checked(tmp_path):
    cfg = _load("gcp.yaml")
    cfg["available_node_types"]["gpu_worker"]["docker"] = {"worker_image": "rayproject/ray:2.52.0-gpu"}
    with pytest.raises(ValueError, match="2.52.0"):
        validate_launcher_config(_write(tmp_path, cfg))


def test_launcher_needs_shm_size_and_zero_cpu_head(tmp_path):
    cfg = _load("aws.yaml")
    cfg["docker"]["run_options"] = ["--ulimit nofile=65536:65536"]
    with pytest.raises(ValueError, match="--shm-size"):
        validate_launcher_config(_write(tmp_path, cfg, "a.yaml"))
    cfg = _load("aws.yaml")
    cfg["available_node_types"]["head"]["resources"] = {"CPU": 8}
    with pytest.raises(ValueError, match="CPU: 0"):
        validate_launcher_config(_write(tmp_path, cfg, "b.yaml"))


def test_check_image_tag_forms():
    v = ray.__version__
    check_image_tag(f"rayproject/ray:{v}")
    check_image_tag(f"rayproject/ray:{v}-py311-cu128")
    check_image_tag(f"registry.example:5000/team/recmas-ray:{v}-py311-gpu")  # port is not a tag
    with pytest.raises(ValueError, match="none"):
        check_image_tag("registry.example:5000/team/recmas-ray")
    with pytest.raises(ValueError):
        check_image_tag(f"rayproject/ray:{v}1-gpu")  # 2.60.01 is another version


# ------------------------------------------------------------------------------------------
# KubeRay manifests
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rel", KUBERAY_MANIFESTS)
def test_shipped_kuberay_manifest_validates(rel):
    doc = validate_kuberay_manifest(CLUSTER / rel)
    spec = _cluster_spec(doc)
    assert spec["rayVersion"] == ray.__version__
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    limits = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) >= 1


def test_rayjob_fields():
    spec = _load("kuberay/rayjob.yaml")["spec"]
    assert spec["entrypoint"].startswith("python -m jobs.run ")
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0 and spec["activeDeadlineSeconds"] > 0
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert {"checkpoints/", "outputs/"} <= set(env["excludes"])
    assert "pip" not in env and env["env_vars"]["HF_HUB_OFFLINE"] == "1"


def _mutations():
    """(name, mutate(doc), expected message regex) for both kinds of manifest."""

    def rename(d, old, new):
        d[new] = d.pop(old)

    return [
        ("spec typo", lambda d: rename(_cluster_spec(d), "workerGroupSpecs", "workerGroupSpec"),
         r"unknown field 'workerGroupSpec'.*did you mean 'workerGroupSpecs'"),
        ("worker group typo", lambda d: rename(_cluster_spec(d)["workerGroupSpecs"][0], "replicas", "replcas"),
         r"workerGroupSpecs\[0\]: unknown field 'replcas'"),
        ("wrong rayVersion", lambda d: _cluster_spec(d).update(rayVersion="2.59.0"),
         r"rayVersion: got '2.59.0'"),
        ("rayVersion not a string", lambda d: _cluster_spec(d).update(rayVersion=2.6),
         r"rayVersion"),
        ("head typo", lambda d: rename(_cluster_spec(d)["headGroupSpec"], "rayStartParams", "rayStartParam"),
         r"headGroupSpec: unknown field 'rayStartParam'"),
        ("unquoted start param", lambda d: _cluster_spec(d)["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}),
         r"num-cpus: expected a quoted string"),
        ("container typo", lambda d: rename(_cluster_spec(d)["headGroupSpec"]["template"]["spec"]["containers"][0],
                                            "image", "imag"),
         r"containers\[0\]: unknown field 'imag'"),
        ("pod spec typo", lambda d: rename(_cluster_spec(d)["workerGroupSpecs"][0]["template"]["spec"],
                                           "tolerations", "toleration"),
         r"unknown field 'toleration'"),
        ("image tag", lambda d: _cluster_spec(d)["headGroupSpec"]["template"]["spec"]["containers"][0]
         .update(image="rayproject/ray:2.59.0-gpu"), r"image.*2\.59\.0"),
        ("no shm mount", lambda d: _cluster_spec(d)["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
         .update(volumeMounts=[]), r"no volumeMount at /dev/shm"),
        ("shm on disk", lambda d: _cluster_spec(d)["headGroupSpec"]["template"]["spec"]["volumes"][0]
         .update(emptyDir={}), r"medium: expected 'Memory'"),
        ("no GPU", lambda d: [r.pop("nvidia.com/gpu") for r in _cluster_spec(d)["workerGroupSpecs"][0]["template"]
                              ["spec"]["containers"][0]["resources"].values()],
         r"no worker group has a nvidia.com/gpu limit"),
        ("GPU request differs", lambda d: _cluster_spec(d)["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
         ["resources"]["requests"].update({"nvidia.com/gpu": "2"}), r"request '2' differs from limit '4'"),
        ("replicas above max", lambda d: _cluster_spec(d)["workerGroupSpecs"][0].update(replicas=9),
         r"minReplicas <= replicas <= maxReplicas"),
        ("metadata typo", lambda d: rename(d["metadata"], "name", "nmae"), r"metadata: unknown field 'nmae'"),
        ("apiVersion", lambda d: d.update(apiVersion="ray.io/v1alpha1"), r"apiVersion"),
    ]


@pytest.mark.parametrize("rel", KUBERAY_MANIFESTS)
@pytest.mark.parametrize("name,mutate,message", _mutations(), ids=[m[0] for m in _mutations()])
def test_kuberay_broken_copy_fails(tmp_path, rel, name, mutate, message):
    doc = copy.deepcopy(_load(rel))
    mutate(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(ValueError, match=message) as err:
        validate_kuberay_manifest(path)
    assert str(err.value).startswith(str(path))


def test_rayjob_cluster_choice_and_spec_fields(tmp_path):
    doc = _load("kuberay/rayjob.yaml")
    selector = copy.deepcopy(doc)
    selector["spec"].pop("rayClusterSpec")
    selector["spec"]["clusterSelector"] = {"ray.io/cluster": "recmas"}
    validate_kuberay_manifest(_write(tmp_path, selector, "selector.yaml"))  # reusing a cluster is fine

    neither = copy.deepcopy(selector)
    neither["spec"].pop("clusterSelector")
    with pytest.raises(ValueError, match="exactly one of rayClusterSpec"):
        validate_kuberay_manifest(_write(tmp_path, neither, "neither.yaml"))

    for key, value, message in [
        ("shutdownAfterJobFinsihes", True, "unknown field 'shutdownAfterJobFinsihes'"),
        ("submissionMode", "K8sMode", "submissionMode"),
        ("runtimeEnvYAML", "env_vars: {HF_HUB_OFFLINE: 1}", "HF_HUB_OFFLINE: expected a quoted string"),
    ]:
        bad = copy.deepcopy(doc)
        bad["spec"][key] = value
        with pytest.raises(ValueError, match=message):
            validate_kuberay_manifest(_write(tmp_path, bad, "bad.yaml"))

    missing = copy.deepcopy(doc)
    missing["spec"].pop("shutdownAfterJobFinishes")
    with pytest.raises(ValueError, match="shutdownAfterJobFinishes"):
        validate_kuberay_manifest(_write(tmp_path, missing, "missing.yaml"))


# ------------------------------------------------------------------------------------------
# Working-dir upload: runtime_env.yaml and .rayignore, applied by Ray's own packager
# ------------------------------------------------------------------------------------------


def _fixture_tree(root: Path) -> None:
    files = [
        "jobs/run.py", "recmas_ray/__init__.py", "cluster/runtime_env.yaml",
        "checkpoints/inner/planner/adapter.pt", "outputs/run1/results.json", "results/samples.jsonl",
        "model.safetensors", "recmas_ray/weights.pt", ".git/HEAD", ".cache/hf/blob", ".venv/bin/python",
    ]
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")


def _zipped_names(root: Path, excludes: list, out: Path) -> set:
    from ray._private.runtime_env.packaging import _zip_files

    # include_gitignore=False: only the file under test (excludes or .rayignore) filters.
    _zip_files(str(root), excludes, str(out), include_gitignore=False)
    with zipfile.ZipFile(out) as z:
        return {n.rstrip("/") for n in z.namelist()}


def _assert_upload_filtered(names: set) -> None:
    assert {"jobs/run.py", "recmas_ray/__init__.py", "cluster/runtime_env.yaml"} <= names
    leaked = [n for n in names if n.startswith(("checkpoints/", "outputs/", "results/", ".git/", ".cache/", ".venv/"))
              or n.endswith((".pt", ".safetensors"))]
    assert not leaked, leaked


def test_runtime_env_validates_and_typos_fail(tmp_path):
    env = validate_runtime_env(CLUSTER / "runtime_env.yaml")
    bad = dict(env, excldues=env.pop("excludes"))
    with pytest.raises(ValueError, match=r"unknown runtime_env field.*'excldues'.*did you mean 'excludes'"):
        validate_runtime_env(_write(tmp_path, bad, "typo.yaml"))
    bad = dict(env, excludes="outputs/")
    with pytest.raises(ValueError, match="excludes"):
        validate_runtime_env(_write(tmp_path, bad, "type.yaml"))
    job = _load("kuberay/rayjob.yaml")
    job["spec"]["runtimeEnvYAML"] = job["spec"]["runtimeEnvYAML"].replace("env_vars:", "env_var:")
    with pytest.raises(ValueError, match=r"runtimeEnvYAML: unknown runtime_env field.*'env_var'"):
        validate_kuberay_manifest(_write(tmp_path, job, "job.yaml"))


def test_runtime_env_excludes_outputs_and_checkpoints(tmp_path):
    env = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    assert env["working_dir"] == "."
    assert not {"pip", "conda", "uv"} & set(env), "dependencies belong in the image"
    assert env["env_vars"] == {k: str(v) for k, v in env["env_vars"].items()}  # Ray wants strings
    assert env["env_vars"]["TOKENIZERS_PARALLELISM"] == "false"
    assert env["env_vars"]["HF_HUB_OFFLINE"] == "1"
    assert {"NCCL_DEBUG", "RAY_DEDUP_LOGS"} <= set(env["env_vars"])
    root = tmp_path / "repo"
    _fixture_tree(root)
    _assert_upload_filtered(_zipped_names(root, env["excludes"], tmp_path / "pkg.zip"))


def test_rayignore_excludes_outputs_and_checkpoints(tmp_path):
    root = tmp_path / "repo"
    _fixture_tree(root)
    (root / ".rayignore").write_text((REPO / ".rayignore").read_text())
    _assert_upload_filtered(_zipped_names(root, [], tmp_path / "pkg.zip"))


def test_without_excludes_the_fixture_would_leak(tmp_path):
    # Guards the two tests above: the fixture really contains what they filter out.
    root = tmp_path / "repo"
    _fixture_tree(root)
    with pytest.raises(AssertionError):
        _assert_upload_filtered(_zipped_names(root, [], tmp_path / "pkg.zip"))


# ------------------------------------------------------------------------------------------
# Scripts and README
# ------------------------------------------------------------------------------------------


def test_submit_sh_passes_arguments_through(tmp_path):
    repo = tmp_path / "repo"
    (repo / "cluster").mkdir(parents=True)
    (repo / "jobs").mkdir()
    (repo / "jobs" / "train_inner.py").write_text("")
    script = repo / "cluster" / "submit.sh"
    script.write_text((CLUSTER / "submit.sh").read_text())
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "argv.json"
    fake_ray = bindir / "ray"
    fake_ray.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        f"json.dump({{'argv': sys.argv[1:], 'cwd': os.getcwd()}}, open({str(record)!r}, 'w'))\n")
    fake_ray.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "RAY_ADDRESS": "http://10.0.0.1:8265", "SUBMIT_FLAGS": "--no-wait --submission-id inner-planner"}
    subprocess.run([str(script), "train_inner", "--mas_role", "all", "--save_dir", "a b"],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=30)
    got = json.loads(record.read_text())
    assert got["cwd"] == str(repo)
    assert got["argv"] == [
        "job", "submit", "--address", "http://10.0.0.1:8265", "--working-dir", ".",
        "--runtime-env", "cluster/runtime_env.yaml", "--no-wait", "--submission-id", "inner-planner",
        "--", "python", "-m", "jobs.train_inner", "--mas_role", "all", "--save_dir", "a b",
    ]
    bad = subprocess.run([str(script), "nosuch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "jobs/nosuch.py" in bad.stderr


@pytest.mark.parametrize("rel", ["submit.sh", "slurm/ray.sbatch"])
def test_shell_scripts_parse(rel):
    subprocess.run(["bash", "-n", str(CLUSTER / rel)], check=True, timeout=30)


def test_readme_shows_the_three_paths_and_job_commands():
    text = (CLUSTER / "README.md").read_text()
    for needle in [
        "ray up cluster/aws.yaml", "kubectl apply -f cluster/kuberay/rayjob.yaml", "ray start --head",
        "python -m jobs.run --style sequential_scaled",
        "python -m jobs.train_inner --mas_design sequential --mas_role all",
        "python -m jobs.train_outer --style sequential_light", "--num_replicas",
        "--ckpt_override planner=", "--storage_path", "RAY_AUTH_MODE", "/dev/shm",
        "--placement one_gpu_per_agent --role_gpus science=1",
    ]:
        assert needle in text, needle
    assert all(ord(ch) < 128 for ch in text)
