"""Offline validation of the cluster files shipped in cluster/.

`validate_launcher_config` checks a `ray up` config (cluster/aws.yaml, cluster/gcp.yaml) against
Ray's own autoscaler schema, the way `ray up` does before it provisions anything, plus the project
rules: the docker image tag equals the installed ray version, /dev/shm is sized, the head has zero
CPUs. `validate_kuberay_manifest` checks a KubeRay RayCluster or RayJob against a small hand-written
schema of the fields KubeRay reads: unknown keys at the validated levels fail, so a typo such as
`workerGroupSpec` or `replcas` is caught in CI instead of being silently dropped by the API server.
`validate_runtime_env` checks cluster/runtime_env.yaml. None needs a cluster, kubectl or network.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import yaml

PathLike = Union[str, Path]

KUBERAY_API_VERSION = "ray.io/v1"
SHM_MOUNT_PATH = "/dev/shm"
GPU_RESOURCE = "nvidia.com/gpu"
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class _Level:
    """Keys one mapping of a manifest may hold, and those it must hold."""

    allowed: frozenset
    """Every key KubeRay (or Kubernetes) accepts at this level."""
    required: frozenset = frozenset()
    """Keys that must be present."""


def _level(allowed: str, required: str = "") -> _Level:
    return _Level(frozenset(allowed.split()), frozenset(required.split()))


# Field lists follow the ray.io/v1 CRDs (KubeRay 1.5/1.6) and core/v1 PodSpec and Container.
_TOP = _level("apiVersion kind metadata spec", "apiVersion kind metadata spec")
_METADATA = _level("name namespace labels annotations", "name")
_CLUSTER_SPEC = _level(
    "rayVersion enableInTreeAutoscaling autoscalerOptions headServiceAnnotations headGroupSpec "
    "workerGroupSpecs suspend managedBy gcsFaultToleranceOptions authOptions upgradeStrategy",
    "rayVersion headGroupSpec workerGroupSpecs",
)
_HEAD_GROUP = _level(
    "rayStartParams template serviceType headService enableIngress resources labels",
    "rayStartParams template",
)
_WORKER_GROUP = _level(
    "groupName replicas minReplicas maxReplicas idleTimeoutSeconds rayStartParams template "
    "numOfHosts scaleStrategy suspend resources labels",
    "groupName replicas minReplicas maxReplicas template",
)
_TEMPLATE = _level("metadata spec", "spec")
_POD_SPEC = _level(
    "activeDeadlineSeconds affinity automountServiceAccountToken containers dnsConfig dnsPolicy "
    "enableServiceLinks ephemeralContainers hostAliases hostIPC hostNetwork hostPID hostUsers "
    "hostname imagePullSecrets initContainers nodeName nodeSelector os overhead preemptionPolicy "
    "priority priorityClassName readinessGates resourceClaims resources restartPolicy "
    "runtimeClassName schedulerName schedulingGates securityContext serviceAccount "
    "serviceAccountName setHostnameAsFQDN shareProcessNamespace subdomain "
    "terminationGracePeriodSeconds tolerations topologySpreadConstraints volumes",
    "containers",
)
_CONTAINER = _level(
    "args command env envFrom image imagePullPolicy lifecycle livenessProbe name ports "
    "readinessProbe resizePolicy resources restartPolicy securityContext startupProbe stdin "
    "stdinOnce terminationMessagePath terminationMessagePolicy tty volumeDevices volumeMounts "
    "workingDir",
    "name image resources",
)
_RESOURCES = _level("limits requests claims")
_VOLUME_MOUNT = _level(
    "name mountPath readOnly recursiveReadOnly subPath subPathExpr mountPropagation",
    "name mountPath",
)
_EMPTY_DIR = _level("medium sizeLimit")
_JOB_SPEC = _level(
    "entrypoint runtimeEnvYAML jobId submissionMode rayClusterSpec clusterSelector "
    "shutdownAfterJobFinishes ttlSecondsAfterFinished activeDeadlineSeconds backoffLimit "
    "submitterPodTemplate submitterConfig entrypointNumCpus entrypointNumGpus entrypointResources "
    "metadata suspend managedBy deletionStrategy",
    "entrypoint shutdownAfterJobFinishes",
)


def _installed_ray_version() -> str:
    import ray

    return ray.__version__


def _load_yaml(path: PathLike) -> Dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a YAML mapping at the top level, got {type(data).__name__}")
    return data


def check_image_tag(image: str, ray_version: Optional[str] = None) -> None:
    """Raise ValueError unless the tag of `image` starts with the ray version.

    Tags follow `{ray_version}[-pyXY][-cpu|-cuXXX|-gpu]` (rayproject/ray and images built on it).
    A client and a cluster on different Ray versions cannot talk to each other.
    """
    want = ray_version or _installed_ray_version()
    name = image.rsplit("/", 1)[-1]
    tag = name.split(":", 1)[1] if ":" in name else ""
    if tag.split("-", 1)[0] != want:
        raise ValueError(
            f"image {image!r} has tag {tag or '(none)'!r}; expected a tag starting with the "
            f"installed ray version {want!r}, e.g. rayproject/ray:{want}-py311-gpu"
        )


# --- Ray cluster launcher (`ray up`) configs ---

_NODE_CONFIG_KEY = {"aws": "InstanceType", "gcp": "machineType", "azure": "azure_arm_parameters"}


def validate_launcher_config(path: PathLike) -> Dict[str, Any]:
    """Validate a `ray up` config and return it filled out with the provider's defaults.

    Runs Ray's `fillout_defaults` + `validate_config` (ray/autoscaler/ray-schema.json, private API
    pinned with ray) and then the project rules. Raises ValueError naming the file and the error.
    """
    import jsonschema
    from ray.autoscaler._private.util import fillout_defaults, validate_config

    cfg = _load_yaml(path)
    provider = cfg.get("provider")
    if not isinstance(provider, dict) or "type" not in provider:
        raise ValueError(f"{path}: missing 'provider.type' (e.g. aws, gcp)")
    try:
        filled = fillout_defaults(cfg)
        validate_config(filled)
    except jsonschema.ValidationError as e:
        where = "/".join(str(k) for k in e.absolute_path) or "(top level)"
        raise ValueError(f"{path}: does not match Ray's cluster config schema at {where}: {e.message}") from None
    except (RuntimeError, ValueError, NotImplementedError, KeyError) as e:
        raise ValueError(f"{path}: rejected by Ray's cluster config validation: {e}") from None
    _check_launcher_rules(filled, str(path))
    return filled


def _check_launcher_rules(cfg: Dict[str, Any], path: str) -> None:
    docker = cfg.get("docker") or {}
    if not docker.get("image"):
        raise ValueError(f"{path}: 'docker.image' is not set; expected a rayproject/ray image "
                         f"whose tag matches the pinned ray version (dependencies come from the image)")
    images = [docker.get(k) for k in ("image", "head_image", "worker_image")]
    for node_type in cfg["available_node_types"].values():
        images.append((node_type.get("docker") or {}).get("worker_image"))
    for image in filter(None, images):
        try:
            check_image_tag(image)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    run_options = docker.get("run_options", []) + docker.get("head_run_options", [])
    if not any("--shm-size" in str(opt) for opt in run_options):
        # Without it Ray may still auto-size shm over SSH, but the size is then invisible here.
        raise ValueError(f"{path}: docker.run_options has no --shm-size; the object store lives in "
                         f"/dev/shm and Docker's default is 64 MB")
    head = cfg["available_node_types"][cfg["head_node_type"]]
    if head.get("resources", {}).get("CPU") != 0:
        raise ValueError(f"{path}: head node type {cfg['head_node_type']!r} has resources "
                         f"{head.get('resources')}; expected CPU: 0 so no work is scheduled on the head")
    key = _NODE_CONFIG_KEY.get(cfg["provider"]["type"])
    for name, node_type in cfg["available_node_types"].items():
        if key and key not in node_type["node_config"]:
            raise ValueError(f"{path}: node type {name!r} node_config has no {key!r} "
                             f"(keys: {sorted(node_type['node_config'])})")


# --- KubeRay manifests ---


def _check_keys(obj: Any, level: _Level, where: str) -> Dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(obj).__name__}")
    for key in obj:
        if key not in level.allowed:
            close = difflib.get_close_matches(str(key), sorted(level.allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}: unknown field {key!r}{hint}; allowed: {sorted(level.allowed)}")
    missing = sorted(level.required - set(obj))
    if missing:
        raise ValueError(f"{where}: missing required field(s) {missing}")
    return obj


def _check_int(value: Any, where: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _check_ray_start_params(params: Any, where: str) -> Dict[str, Any]:
    if not isinstance(params, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(params).__name__}")
    for key, value in params.items():
        # The CRD types rayStartParams as map[string]string; `num-cpus: 0` is rejected on apply.
        if not isinstance(value, str):
            raise ValueError(f"{where}.{key}: expected a quoted string, got {value!r}")
    return params


def _check_pod_template(template: Any, where: str) -> List[Dict[str, Any]]:
    """Check a pod template; return its containers."""
    _check_keys(template, _TEMPLATE, where)
    spec = _check_keys(template["spec"], _POD_SPEC, f"{where}.spec")
    containers = spec["containers"]
    if not isinstance(containers, list) or not containers:
        raise ValueError(f"{where}.spec.containers: expected a non-empty list")
    volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    for i, c in enumerate(containers):
        cw = f"{where}.spec.containers[{i}]"
        _check_keys(c, _CONTAINER, cw)
        _check_keys(c["resources"], _RESOURCES, f"{cw}.resources")
        try:
            check_image_tag(str(c["image"]))
        except ValueError as e:
            raise ValueError(f"{cw}.image: {e}") from None
        mounts = c.get("volumeMounts") or []
        for j, m in enumerate(mounts):
            _check_keys(m, _VOLUME_MOUNT, f"{cw}.volumeMounts[{j}]")
        shm = [m for m in mounts if m["mountPath"] == SHM_MOUNT_PATH]
        if not shm:
            raise ValueError(f"{cw}: no volumeMount at {SHM_MOUNT_PATH}; mount an emptyDir "
                             f"{{medium: Memory}} volume there (the container default is 64 MB)")
        vol = volumes.get(shm[0]["name"])
        if vol is None:
            raise ValueError(f"{cw}: {SHM_MOUNT_PATH} mounts volume {shm[0]['name']!r}, which "
                             f"{where}.spec.volumes does not define")
        empty_dir = vol.get("emptyDir")
        if empty_dir is None:
            raise ValueError(f"{where}.spec.volumes[{shm[0]['name']}]: expected emptyDir "
                             f"{{medium: Memory}} for {SHM_MOUNT_PATH}, got keys {sorted(vol)}")
        _check_keys(empty_dir, _EMPTY_DIR, f"{where}.spec.volumes[{shm[0]['name']}].emptyDir")
        if empty_dir.get("medium") != "Memory":
            raise ValueError(f"{where}.spec.volumes[{shm[0]['name']}].emptyDir.medium: expected "
                             f"'Memory', got {empty_dir.get('medium')!r}")
    return containers


def _gpu_count(container: Dict[str, Any], where: str) -> float:
    res = container["resources"]
    limit = (res.get("limits") or {}).get(GPU_RESOURCE)
    request = (res.get("requests") or {}).get(GPU_RESOURCE)
    if request is not None and str(request) != str(limit):
        # Kubernetes rejects extended resources whose request differs from the limit.
        raise ValueError(f"{where}.resources: {GPU_RESOURCE} request {request!r} differs from limit {limit!r}")
    try:
        return float(limit) if limit is not None else 0.0
    except (TypeError, ValueError):
        raise ValueError(f"{where}.resources.limits.{GPU_RESOURCE}: expected a number, got {limit!r}") from None


def _check_cluster_spec(spec: Any, where: str) -> None:
    _check_keys(spec, _CLUSTER_SPEC, where)
    want = _installed_ray_version()
    if str(spec["rayVersion"]) != want or not isinstance(spec["rayVersion"], str):
        raise ValueError(f"{where}.rayVersion: got {spec['rayVersion']!r}; expected the installed "
                         f"ray version {want!r} as a quoted string")
    head = _check_keys(spec["headGroupSpec"], _HEAD_GROUP, f"{where}.headGroupSpec")
    params = _check_ray_start_params(head["rayStartParams"], f"{where}.headGroupSpec.rayStartParams")
    if params.get("num-cpus") != "0":
        raise ValueError(f"{where}.headGroupSpec.rayStartParams.num-cpus: got {params.get('num-cpus')!r}; "
                         f"expected \"0\" so no work is scheduled on the head")
    if "dashboard-host" not in params:
        raise ValueError(f"{where}.headGroupSpec.rayStartParams: missing 'dashboard-host' "
                         f"(\"0.0.0.0\" lets `ray job submit` reach the dashboard)")
    _check_pod_template(head["template"], f"{where}.headGroupSpec.template")

    groups = spec["workerGroupSpecs"]
    if not isinstance(groups, list) or not groups:
        raise ValueError(f"{where}.workerGroupSpecs: expected a non-empty list of worker groups")
    names, gpus = set(), 0.0
    for i, g in enumerate(groups):
        gw = f"{where}.workerGroupSpecs[{i}]"
        _check_keys(g, _WORKER_GROUP, gw)
        if g["groupName"] in names:
            raise ValueError(f"{gw}.groupName: {g['groupName']!r} is used twice")
        names.add(g["groupName"])
        lo, n, hi = (_check_int(g[k], f"{gw}.{k}") for k in ("minReplicas", "replicas", "maxReplicas"))
        if not lo <= n <= hi:
            raise ValueError(f"{gw}: expected minReplicas <= replicas <= maxReplicas, got {lo}, {n}, {hi}")
        if "rayStartParams" in g:
            _check_ray_start_params(g["rayStartParams"], f"{gw}.rayStartParams")
        containers = _check_pod_template(g["template"], f"{gw}.template")
        gpus += _gpu_count(containers[0], f"{gw}.template.spec.containers[0]")
    if gpus <= 0:
        raise ValueError(f"{where}.workerGroupSpecs: no worker group has a {GPU_RESOURCE} limit; "
                         f"the agents need GPU workers")


def _check_job_spec(spec: Any, where: str) -> None:
    _check_keys(spec, _JOB_SPEC, where)
    if not isinstance(spec["entrypoint"], str) or not spec["entrypoint"].strip():
        raise ValueError(f"{where}.entrypoint: expected a command such as 'python jobs/run.py ...'")
    if not isinstance(spec["shutdownAfterJobFinishes"], bool):
        raise ValueError(f"{where}.shutdownAfterJobFinishes: expected true or false, "
                         f"got {spec['shutdownAfterJobFinishes']!r}")
    has_spec, has_selector = "rayClusterSpec" in spec, "clusterSelector" in spec
    if has_spec == has_selector:
        raise ValueError(f"{where}: expected exactly one of rayClusterSpec (new cluster) or "
                         f"clusterSelector (existing cluster)")
    if has_spec:
        _check_cluster_spec(spec["rayClusterSpec"], f"{where}.rayClusterSpec")
    elif not isinstance(spec["clusterSelector"], dict) or not spec["clusterSelector"]:
        raise ValueError(f"{where}.clusterSelector: expected labels such as {{ray.io/cluster: NAME}}")
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode not in SUBMISSION_MODES:
        raise ValueError(f"{where}.submissionMode: got {mode!r}; expected one of {list(SUBMISSION_MODES)}")
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds"):
        if key in spec:
            _check_int(spec[key], f"{where}.{key}")
    if "runtimeEnvYAML" in spec:
        try:
            env = yaml.safe_load(spec["runtimeEnvYAML"])
        except yaml.YAMLError as e:
            raise ValueError(f"{where}.runtimeEnvYAML: not valid YAML: {e}") from None
        _check_runtime_env(env, f"{where}.runtimeEnvYAML")


# --- Runtime environments (cluster/runtime_env.yaml, RayJob runtimeEnvYAML) ---


def _check_runtime_env(env: Any, where: str) -> Dict[str, Any]:
    from ray.runtime_env import RuntimeEnv

    if not isinstance(env, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(env).__name__}")
    # RuntimeEnv accepts unknown keys as plugin names, so a typo (`excldues`) would be ignored.
    unknown = sorted(set(env) - set(RuntimeEnv.known_fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(RuntimeEnv.known_fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{where}: unknown runtime_env field(s) {unknown}{hint}")
    for k, v in (env.get("env_vars") or {}).items():
        if not isinstance(v, str):
            raise ValueError(f"{where}.env_vars.{k}: expected a quoted string, got {v!r}")
    # Ray's own type checks; working_dir is left out because Ray resolves a local one against
    # this machine's file system (the RayJob's lives in the image).
    try:
        RuntimeEnv(**{k: v for k, v in env.items() if k != "working_dir"})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    return env


def validate_runtime_env(path: PathLike) -> Dict[str, Any]:
    """Validate a runtime env YAML file (as passed to `ray job submit --runtime-env`); return it.

    Unknown top-level fields fail (Ray would treat them as plugin names and ignore a typo), and the
    values go through Ray's own RuntimeEnv type checks. Raises ValueError naming the file.
    """
    return _check_runtime_env(_load_yaml(path), str(path))


def validate_kuberay_manifest(path: PathLike) -> Dict[str, Any]:
    """Validate a KubeRay RayCluster or RayJob manifest; return it as loaded.

    Raises ValueError naming the file, the field path (e.g. spec.workerGroupSpecs[0]) and what was
    expected. Unknown keys fail at every validated level (top, metadata, cluster and job spec, head
    and worker groups, pod template, pod spec, containers, resources, volume mounts).
    """
    doc = _load_yaml(path)
    try:
        _check_keys(doc, _TOP, "(top level)")
        if doc["apiVersion"] != KUBERAY_API_VERSION:
            raise ValueError(f"apiVersion: got {doc['apiVersion']!r}; expected {KUBERAY_API_VERSION!r}")
        meta = _check_keys(doc["metadata"], _METADATA, "metadata")
        name = meta["name"]
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
            raise ValueError(f"metadata.name: {name!r} is not a DNS label (lowercase letters, digits, '-', "
                             f"at most 63 characters)")
        if doc["kind"] == "RayCluster":
            _check_cluster_spec(doc["spec"], "spec")
        elif doc["kind"] == "RayJob":
            _check_job_spec(doc["spec"], "spec")
        else:
            raise ValueError(f"kind: got {doc['kind']!r}; expected 'RayCluster' or 'RayJob'")
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return doc
