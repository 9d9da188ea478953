"""The training core shared by the inner and outer loops: LR schedule, data order, run storage, checkpoint files,
resume, fault-injection hooks and the Ray Train launch.

    run folder   <storage_path>/<kind>-<style>[-<role>]-<tag of save_dir>/     storage: a local path or any URI
                 checkpoint_<step:06d>/                                         Ray Train accepts (file://, s3://, gs://)
    checkpoint   link weights (*.safetensors) + optim-<role>.pt + train_state.json, then COMPLETE written LAST:
                 {file: size} of every file, so a torn checkpoint (no marker, or a file of the wrong size) is
                 never resumed; `RunStorage.latest_complete` falls back to the newest complete one
    data order   step s -> rows of a permutation seeded by (seed, epoch): resumed runs see the same batches

Fault injection (tests only) is not a config field: tests pass a private `_faults` dict, which the drivers
put into train_loop_config; `Faults` reads it in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs
import ray
import ray.train
import ray.train.torch
import torch
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

from recmas_ray.config.tree import from_dict
from recmas_ray.styles import get_style
from recmas_ray.train.config import TrainConfig, storage_scheme
from recmas_ray.system.link_init import stable_seed

TRAIN_STATE = "train_state.json"
COMPLETE = "COMPLETE"
CHECKPOINT_PREFIX = "checkpoint_"


# ----------------------------------------------------------------------------- schedule and data order
def role_worker_setup(config: dict, config_cls):
    """A per-role Ray Train worker's start, shared by both outer schedules: its config (`config["cfg"]`, torch
    threads set), its style, the role of its world rank and its device. Returns (cfg, style, role, device)."""
    cfg = config_from_dict(config_cls, config["cfg"])
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    style = get_style(cfg.system.style)
    role = style.roles[ray.train.get_context().get_world_rank()]
    device = ray.train.torch.get_device() if cfg.use_gpu else torch.device("cpu")
    return cfg, style, role, device


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, kind: str = "cosine",
              warmup_from_zero: bool = False) -> float:
    """Multiplier of the peak LR at 0-based `step`: linear warmup, then HF's cosine (num_cycles 0.5), linear
    or constant schedule (`get_{cosine,linear,constant}_schedule_with_warmup`).

    HF's warmup (`warmup_from_zero`, the reference) runs step 0 at LR 0, a wasted step that matters in short
    runs (a 16-step run with warmup 1 loses a sixteenth of its budget); by default the ramp is shifted by
    one, (step + 1) / (warmup_steps + 1), so every step moves the links.
    """
    if step < warmup_steps:
        return step / max(1, warmup_steps) if warmup_from_zero else (step + 1) / (warmup_steps + 1)
    if kind == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    if kind == "linear":
        return max(0.0, 1.0 - progress)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def make_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The run's LR schedule over `cfg.max_steps` optimizer steps."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps, kind=cfg.lr_scheduler_type,
                           warmup_from_zero=cfg.warmup_from_zero))


def step_indices(num_rows: int, step: int, rows_per_step: int, seed: int) -> list[int]:
    """Row indices of 0-based step `step`: a fresh permutation per epoch seeded by (seed, epoch), drop_last.

    A pure function of (seed, step), so a resumed run sees the same batches as an uninterrupted one.
    """
    steps_per_epoch = num_rows // rows_per_step
    if steps_per_epoch < 1:
        raise ValueError(f"{num_rows} rows cannot fill one step of {rows_per_step} rows")
    epoch, pos = divmod(step, steps_per_epoch)
    gen = torch.Generator().manual_seed(stable_seed(seed, f"epoch:{epoch}"))
    return torch.randperm(num_rows, generator=gen)[pos * rows_per_step:(pos + 1) * rows_per_step].tolist()


def resolve_steps(cfg: TrainConfig, num_rows: int, rows_per_step: int):
    """`cfg` with max_steps derived from num_train_epochs (when > 0); checks the rows fill one step."""
    if num_rows < rows_per_step:
        raise ValueError(f"{num_rows} rows cannot fill one step of {rows_per_step} rows (--batch_size "
                         f"{cfg.batch_size}{' x workers x accumulation' if rows_per_step != cfg.batch_size else ''})")
    if cfg.num_train_epochs > 0:
        return dataclasses.replace(cfg, max_steps=max(1, math.ceil(cfg.num_train_epochs * num_rows / rows_per_step)))
    return cfg


# ----------------------------------------------------------------------------- storage
class RunStorage:
    """One run's folder in Ray Train storage: a local path or a URI, read and written through pyarrow.fs."""

    def __init__(self, storage_path: str, name: str):
        if storage_scheme(storage_path):
            self.fs, base = pyarrow.fs.FileSystem.from_uri(storage_path)
            self.uri = storage_path
        else:
            self.uri = base = str(Path(storage_path).expanduser().resolve())
            self.fs = pyarrow.fs.LocalFileSystem()
        self.name, self.root = name, f"{base.rstrip('/')}/{name}"

    def path(self, *parts: str) -> str:
        """A path inside the run folder, on `self.fs`."""
        return "/".join([self.root, *parts])

    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type != pyarrow.fs.FileType.NotFound

    def clear(self) -> None:
        """Remove the run folder (a fresh run; else Ray Train would silently restore the old one)."""
        if self.exists():
            self.fs.delete_dir(self.root)

    def write_text(self, name: str, text: str) -> None:
        self.fs.create_dir(self.root, recursive=True)
        with self.fs.open_output_stream(self.path(name)) as f:
            f.write(text.encode())

    def read_text(self, name: str) -> str:
        with self.fs.open_input_stream(self.path(name)) as f:
            return f.read().decode()

    def checkpoint_names(self) -> list[str]:
        """checkpoint_* folders, oldest step first."""
        if not self.exists():
            return []
        infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self.root))
        return sorted(i.base_name for i in infos
                      if i.type == pyarrow.fs.FileType.Directory and i.base_name.startswith(CHECKPOINT_PREFIX))

    def is_complete(self, name: str) -> bool:
        """The checkpoint's COMPLETE marker exists and every file it lists has its recorded size."""
        return is_sealed(self.path(name), self.fs)

    def checkpoint(self, name: str):
        """A Ray Train `Checkpoint` of one checkpoint folder."""
        return Checkpoint(self.path(name), filesystem=self.fs)

    def latest_complete(self):
        """The newest complete checkpoint as a Ray Train `Checkpoint` (torn newer ones are skipped), or None."""
        for name in reversed(self.checkpoint_names()):
            if self.is_complete(name):
                return self.checkpoint(name)
            print(f"[train] skipping torn checkpoint {self.path(name)} (no {COMPLETE} marker or a short file)",
                  flush=True)
        return None

    def persist(self, local: Path, name: str, num_to_keep: int):
        """Copy a sealed local checkpoint folder into the run folder, the marker last; prune old ones.

        Ray Train's local mode (no workers) keeps no storage of its own, so the loops call this there.
        """
        dest = self.path(name)
        if self.exists(name):
            self.fs.delete_dir(dest)
        self.fs.create_dir(dest, recursive=True)
        files = sorted(local.iterdir(), key=lambda p: p.name == COMPLETE)  # the marker goes last
        for f in files:
            pyarrow.fs.copy_files(str(f), f"{dest}/{f.name}", source_filesystem=pyarrow.fs.LocalFileSystem(),
                                  destination_filesystem=self.fs)
        for old in self.checkpoint_names()[:-num_to_keep]:
            self.fs.delete_dir(self.path(old))
        return self.checkpoint(name)


def run_storage(cfg: TrainConfig, prefix: str) -> RunStorage:
    """The run folder of a job; its name is tied to save_dir, so runs sharing a storage path never collide and
    --resume with the same save_dir finds its run."""
    storage = cfg.storage_path or str(Path(cfg.save_dir) / "_ray_runs")
    tag = hashlib.sha1(str(Path(cfg.save_dir).resolve()).encode()).hexdigest()[:8]
    return RunStorage(storage, f"{prefix}-{tag}")


def start_or_resume(cfg: TrainConfig, storage: RunStorage, what: str, load_dir: str | None = None):
    """The checkpoint to continue from (load_dir if it is one, else the newest complete one with --resume),
    after clearing the run folder of a fresh run."""
    if load_dir and is_checkpoint_dir(Path(load_dir)):
        if not cfg.resume:
            storage.clear()
        return Checkpoint.from_directory(str(Path(load_dir).resolve()))
    if not cfg.resume:
        storage.clear()
        return None
    found = storage.latest_complete()
    if found is None:
        print(f"[{what}] --resume: no complete checkpoint in {storage.root}; starting from step 0", flush=True)
    return found


# ----------------------------------------------------------------------------- checkpoint files
def is_sealed(path: str | Path, fs=None) -> bool:
    """A checkpoint folder (local, or on the pyarrow filesystem `fs`) whose COMPLETE marker exists and whose
    listed files all have their recorded sizes: anything else is torn and never resumed."""
    fs = fs or pyarrow.fs.LocalFileSystem()
    try:
        with fs.open_input_stream(f"{path}/{COMPLETE}") as f:
            sizes = json.loads(f.read().decode())["files"]
    except (OSError, ValueError, KeyError):
        return False
    infos = fs.get_file_info([f"{path}/{name}" for name in sizes])
    return all(i.type == pyarrow.fs.FileType.File and i.size == sizes[i.base_name] for i in infos)


def is_checkpoint_dir(path: Path) -> bool:
    """A sealed training checkpoint (not just a link folder) on local disk."""
    return (path / TRAIN_STATE).is_file() and is_sealed(path)


def file_sizes(path: Path) -> dict[str, int]:
    """{name: bytes} of the files of a local checkpoint folder (what a COMPLETE marker records)."""
    return {f.name: f.stat().st_size for f in Path(path).iterdir() if f.is_file() and f.name != COMPLETE}


def seal(path: Path, sizes: dict[str, int] | None = None) -> Path:
    """Write the COMPLETE marker, last: the sizes of this folder's files plus `sizes` (other workers' shards,
    which Ray Train merges into the same checkpoint folder)."""
    marker = {"files": {**file_sizes(path), **(sizes or {})}}
    tmp = Path(path) / f".{COMPLETE}.tmp"
    tmp.write_text(json.dumps(marker, sort_keys=True))
    os.replace(tmp, Path(path) / COMPLETE)
    return Path(path)


def optim_file(role: str) -> str:
    return f"optim-{role}.pt"


def save_optim(path: Path, role: str, opt, sched) -> None:
    """Optimizer and scheduler state of one role."""
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, Path(path) / optim_file(role))


def load_optim(path: Path, role: str, opt, sched, *, map_location="cpu") -> None:
    """Restore optimizer and scheduler in place (weights_only: checkpoints hold tensors and numbers only)."""
    state = torch.load(Path(path) / optim_file(role), map_location=map_location, weights_only=True)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])


def write_state(path: Path, state: dict) -> None:
    """train_state.json: step, logs and what the run was (checked on resume)."""
    (Path(path) / TRAIN_STATE).write_text(json.dumps(state))


def read_state(path: Path) -> dict:
    """The train_state.json of a checkpoint folder."""
    return json.loads((Path(path) / TRAIN_STATE).read_text())


# ----------------------------------------------------------------------------- faults (tests)
@dataclass
class Faults:
    """Test-only failures, from the private `_faults` entry of train_loop_config (never a user flag)."""

    kill_rank: int = -1
    """This worker rank exits (os._exit) once, mid-step, at kill_step."""
    kill_step: int = 0
    """1-based step at which kill_rank dies (after its forward sweep)."""
    fail_step: int = 0
    """Raise once after this 1-based step, on a run not yet restored from a checkpoint."""
    nan_step: int = 0
    """The loss becomes NaN at this 1-based step."""

    @classmethod
    def of(cls, loop_config: dict) -> Faults:
        return cls(**(loop_config.get("_faults") or {}))

    def maybe_kill(self, rank: int, step: int, storage: RunStorage) -> None:
        # A marker in the run folder makes it happen once, so the restarted worker group survives.
        marker = f".killed-rank{rank}-step{step}"
        if rank == self.kill_rank and step == self.kill_step and not storage.exists(marker):
            storage.write_text(marker, "")
            os._exit(1)

    def maybe_fail(self, step: int, restored: bool) -> None:
        if step == self.fail_step and not restored:
            raise RuntimeError(f"injected failure at step {step}")


# ----------------------------------------------------------------------------- Ray Train launch
def report_checkpoint(local: Path, metrics: dict, *, step: int, storage: RunStorage, local_mode: bool,
                      num_to_keep: int, with_files: bool = True) -> None:
    """Report metrics with this worker's sealed (or shard) checkpoint folder `local`.

    Local mode persists the folder itself (Ray Train keeps no storage there); with workers Ray Train
    uploads every worker's folder into one checkpoint_<step> folder of the run.
    """
    name = f"{CHECKPOINT_PREFIX}{step:06d}"
    if local_mode:
        ray.train.report(metrics, checkpoint=storage.persist(local, name, num_to_keep))
    elif with_files:
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(str(local)), checkpoint_dir_name=name)
    else:
        ray.train.report(metrics, checkpoint_dir_name=name)


@contextlib.contextmanager
def restored_dir(resume_from):
    """A local folder of the checkpoint to start from, or None: Ray Train's own after a worker-group restart,
    else the driver's (`resume_from`); only a sealed one is used."""
    for ckpt in (ray.train.get_checkpoint(), resume_from):
        if ckpt is None:
            continue
        with ckpt.as_directory() as d:
            if is_sealed(d):
                yield Path(d)
                return
    yield None


def fit(loop, loop_config: dict, cfg: TrainConfig, storage: RunStorage, *, num_workers: int,
        resources: dict | None = None, backend: str | None = None, env_vars: dict | None = None, tracker=None):
    """One TorchTrainer run of `loop`; returns Ray Train's Result. `tracker` (`recmas_ray.tracking`) logs each
    report live from Ray Train's controller."""

    resources = resources or {"CPU": cfg.cpus_per_worker, **({"GPU": cfg.gpus_per_worker} if cfg.use_gpu else {})}
    trainer = ray.train.torch.TorchTrainer(
        loop, train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=cfg.use_gpu, resources_per_worker=resources),
        torch_config=ray.train.torch.TorchConfig(backend=backend) if backend else None,
        run_config=RunConfig(name=storage.name, storage_path=storage.uri,
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.num_to_keep),
                             worker_runtime_env={"env_vars": env_vars} if env_vars else None,
                             callbacks=[c for c in [tracker.callback() if tracker else None] if c] or None),
    )
    return fit_interruptibly(trainer)


def fit_interruptibly(trainer):
    """`trainer.fit()`, run from the main thread in a helper thread: Ray Train installs a SIGINT handler of its
    own when fit() runs on the main thread (it aborts the run and the process exits 1 with no line), so there
    Ctrl-C reaches this thread as KeyboardInterrupt instead; the job stops with one line and exit status 130, and
    `--resume` continues from the last sealed checkpoint (a checkpoint cut short is never sealed)."""
    if threading.current_thread() is not threading.main_thread():
        return trainer.fit()
    box: dict = {}

    def run():
        try:
            box["result"] = trainer.fit()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="ray-train-fit", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.5)  # short waits: SIGINT is handled between them
    if "error" in box:
        raise box["error"]
    return box["result"]


def role_worker_resources(cfg: TrainConfig, num_roles: int, local: bool) -> dict:
    """Ray Train resources of one worker per role (outer training, either schedule)."""
    # One worker per role must fit at once. CPU asks only steer placement: shrink them to fit the cluster
    # (2-core laptops, CI). Missing GPUs fail early on a local cluster; a real one may still autoscale.
    have = ray.cluster_resources()
    cpus = cfg.cpus_per_worker
    if num_roles * cpus > have.get("CPU", 0) > 0:
        cpus = have["CPU"] / num_roles
        print(f"[outer] {num_roles} role workers x {cfg.cpus_per_worker} CPU exceed the cluster's {have['CPU']:g} "
              f"CPUs; asking {cpus:g} per worker", flush=True)
    if cfg.use_gpu and num_roles * cfg.gpus_per_worker > have.get("GPU", 0):
        msg = (f"--use_gpu needs {num_roles} role workers x {cfg.gpus_per_worker} GPU, the cluster has "
               f"{have.get('GPU', 0):g}")
        if local:
            raise ValueError(msg + " (NCCL point-to-point needs one GPU per worker)")
        print(f"[outer] {msg}; waiting for the autoscaler", flush=True)
    return {"CPU": cpus, **({"GPU": cfg.gpus_per_worker} if cfg.use_gpu else {})}


def config_from_dict(cls, data: dict):
    """A training config back from `dataclasses.asdict` (what a worker receives), nested sections included."""
    return from_dict(cls, data, where="training config")
