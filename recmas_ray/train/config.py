"""The training runs behind `jobs/train_inner.py` and `jobs/train_outer.py`: one shared `TrainConfig` and the
fields each loop adds.

`TrainConfig` holds everything both loops mean the same way (the system trained, as the shared
`SystemConfig` section `system`; data, outputs and storage, the optimiser and its schedule, checkpoints, Ray
Train resources); `InnerTrainConfig` (warm-start one role's inner link) and
`OuterTrainConfig` (backprop through R rounds into the outer links) add their own fields. Light imports
only (no torch), so `--help` is instant; every rule here runs before any model loads.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import ExistingPath, NonEmpty, OneOf, Range, WritableDir, writable_dir_problem
from recmas_ray.config.choices import LATENT_NORMS
from recmas_ray.config.inputs import check_cuda, check_file
from recmas_ray.models.registry import check_model_names
from recmas_ray.config.recursion import MAX_ROUNDS
from recmas_ray.config.resume import check_training_resume
from recmas_ray.config.tracking import TrackingConfig
from recmas_ray.styles import build_schedule, canonical_role, get_style
from recmas_ray.system.config import SystemConfig
from recmas_ray.system.hub import links_overrides
from recmas_ray.tasks import TASK_TYPES

SCHEDULES = ("cosine", "linear", "constant")
STORAGE_SCHEMES = ("s3", "gs", "file")
ADAPTER_DTYPES = ("base", "float32")
SYNTHETIC = "synthetic"
MAX_STEPS = 10**9
"""How spliced latents are scaled (`Agent.set_latent_norm`): none (the release) or embedding (each latent row
rescaled to the receiving model's mean token-embedding norm, as LatentMAS does; non-reference)."""
OUTER_INITS = ("default", "bridge", "state_bridge")
ROLLOUT_STAGES = ("first", "all")
"""--rollout_stages: which stages send their latent rollout instead of hidden states over their gold turn."""
OUTER_SCHEDULES = ("end_to_end", "hop_by_hop")
"""--schedule: how the outer links train (OuterTrainConfig.schedule)."""
ROLLOUT_FEEDBACK = ("graph", "detached")
"""--rollout_feedback: whether a rollout's fed-back inner(h) keeps its graph (exact) or is detached."""


SYNTHETIC_NAMES = (SYNTHETIC, "synthetic_short", "synthetic_hidden")
"""Generated dataset names (= recmas_ray.train.data.SYNTHETIC_DATASETS): synthetic[:N] (arithmetic word problems),
synthetic_short[:N] (the same, short answer targets; non-reference), synthetic_hidden[:N] (hidden operand)."""


def is_synthetic(name: str) -> bool:
    """A synthetic[:N] or synthetic_hidden[:N] dataset name (generated, not a file)."""
    return name.partition(":")[0] in SYNTHETIC_NAMES


def storage_scheme(path: str) -> str:
    """The URI scheme of a storage path ('' for a plain local path)."""
    scheme, sep, _ = path.partition("://")
    return scheme if sep else ""


@dataclass(kw_only=True)
class TrainConfig:
    """What inner and outer training share: data, outputs, optimiser and schedule, checkpoints, resources."""

    SYSTEM_FIELDS = ("style", "preset", "role_models", "ckpt_override", "dtype", "seed")
    """System fields training reads (the others get no flag and are refused when set); GPUs come from --use_gpu."""
    FLAG_ALIASES = {"role_model": "system.role_models", "models": "system.role_models"}
    """The training jobs' spelling of the per-role base models (config/cli.py)."""

    system: SystemConfig = field(default_factory=lambda: SystemConfig(style="sequential"))
    """The system whose links train: style, base models (preset, role_models, recorded in the saved
    manifests), ckpt_override (ROLE=DIR inner links; outer training also outer=DIR), dtype, and seed (of the
    link init and of the data order)."""

    task: Annotated[str, OneOf(TASK_TYPES)] = "math"
    """Task type of the prompts (math, code, choice, qa)."""
    dataset_name: Annotated[str, NonEmpty()] = "synthetic:256"
    """Local .json/.jsonl, a HF dataset id, synthetic[:N] (the offline arithmetic set), synthetic_short[:N] (the
    same with short answer targets "3 + 4 = 7. \\boxed{7}", non-reference) or synthetic_hidden[:N] (the
    hidden-operand set: only the planner is told the fact, the answer must come through the latents)."""
    dataset_json_field: str | None = None
    """Field holding the rows in a {"data": [...]} JSON file."""
    dataset_split: str = "train"
    """Split of a Hugging Face dataset."""
    storage_path: str | None = None
    """Ray Train storage for checkpoints: a local or shared-disk path, or a file://, s3:// or gs:// URI
    (default <save_dir>/_ray_runs)."""
    max_steps: Annotated[int, Range(1, MAX_STEPS)] = 20000
    """Optimizer steps (the LR schedule spans exactly these); see num_train_epochs."""
    num_train_epochs: Annotated[float, Range(0, 1e6)] = 0.0
    """> 0: train this many passes over the rows instead, i.e. max_steps = ceil(epochs * rows / rows per step)."""
    batch_size: Annotated[int, Range(1, 65536)] = 2
    """Rows per step (inner: per worker and accumulation step; outer: the whole batch, split in microbatches)."""
    lr: Annotated[float, Range(0, 10, lo_open=True)] = 5e-4
    """Peak learning rate (the reference value; lower it if the loss spikes: a third-party re-run of the outer loop
    found 1e-4 more stable)."""
    lr_scheduler_type: Annotated[str, OneOf(SCHEDULES)] = "cosine"
    """LR after the linear warmup: cosine (to 0 at max_steps, the reference), linear (to 0) or constant."""
    warmup_steps: Annotated[int, Range(0, MAX_STEPS)] = 10
    """Linear warmup steps up to lr."""
    warmup_from_zero: bool = False
    """Reference schedule (HF's warmup: the first step runs at lr 0). Default (non-reference): the warmup ramp
    is shifted by one step, (step + 1) / (warmup_steps + 1), so no step is wasted in a short run."""
    max_grad_norm: Annotated[float, Range(0, 1e9)] = 1.0
    """Gradient-norm clip over all trained links (0 disables)."""
    resume: bool = False
    """Continue from the newest complete checkpoint of this run in the storage path (same flags and save_dir)."""
    use_gpu: bool = False
    """One GPU (gpus_per_worker) per Ray Train worker."""
    cpus_per_worker: Annotated[float, Range(0, 1024)] = 1.0
    """Logical CPUs reserved per worker."""
    gpus_per_worker: Annotated[float, Range(0, 64)] = 1.0
    """GPUs reserved per worker with --use_gpu."""
    save_every: Annotated[int, Range(0, MAX_STEPS)] = 100
    """Checkpoint every this many steps (and always at the end); 0: only at the end."""
    stop_at_step: Annotated[int, Range(0, MAX_STEPS)] = 0
    """Stop at this step after saving, keeping the max_steps schedule (continue later with --resume); 0 runs on."""
    log_every: Annotated[int, Range(1, MAX_STEPS)] = 10
    """Log a line (and report metrics) every this many steps."""
    max_failures: Annotated[int, Range(-1, 10_000)] = 2
    """Worker-group restarts Ray Train may do, each from the newest checkpoint (-1: no limit)."""
    num_to_keep: Annotated[int, Range(1, 10_000)] = 2
    """Checkpoints kept in storage."""
    progress: bool = True
    """Per-step progress bar on the console."""
    verbose: bool = False
    """Show Ray, Ray Train, HF and the workers' own output on the console (else it goes to
    save_dir/logs/<job>.log)."""
    track: TrackingConfig = field(default_factory=TrackingConfig)
    """Experiment tracking of the losses (--tracking mlflow: a local store in save_dir/mlruns by default)."""

    def roles(self) -> tuple[str, ...]:
        """The roles of the style."""
        return tuple(get_style(self.system.style).roles)

    def checkpoint_keys(self) -> tuple[str, ...]:
        """Keys --ckpt_override accepts."""
        return self.roles()

    def validate(self) -> None:
        """Rules across fields and files (run before any model loads)."""
        system = self.system
        _check_dataset("--dataset_name", self.dataset_name)
        system.check_tables("--role_model", ckpt_extra=self.checkpoint_keys())
        check_model_names("--role_model", system.role_models)
        if self.use_gpu:  # inner num_workers=0 trains in this process; otherwise Ray workers, maybe elsewhere
            check_cuda("--use_gpu", on_cluster=getattr(self, "num_workers", 1) != 0)
        bad = sorted(set(system.ckpt_override) - set(self.checkpoint_keys()))
        if bad:
            raise ValueError(f"--ckpt_override names {bad}; expected some of {list(self.checkpoint_keys())}")
        missing = {k: p for k, p in system.ckpt_override.items() if not os.path.isdir(p)}
        if missing:
            raise ValueError(f"--ckpt_override {' '.join(f'{k}={p}' for k, p in missing.items())}: no such directory")
        if self.storage_path:
            scheme = storage_scheme(self.storage_path)
            if scheme and scheme not in STORAGE_SCHEMES:
                raise ValueError(f"--storage_path {self.storage_path!r}: expected a local path or a "
                                 f"{', '.join(s + '://' for s in STORAGE_SCHEMES)} URI")
            local = self.storage_path[len("file://"):] if scheme == "file" else self.storage_path
            problem = writable_dir_problem(local) if scheme in ("", "file") else None
            if problem:
                raise ValueError(f"--storage_path {self.storage_path!r} {problem}")
        if self.resume:
            self.check_resume()

    def check_resume(self) -> None:
        """--resume refuses a save_dir whose earlier run had other settings (field by field)."""
        check_training_resume(self, self.save_dir)


def _check_dataset(flag: str, name: str) -> None:
    if os.path.splitext(name)[1].lower() in (".json", ".jsonl"):
        check_file(flag, name, non_empty=True)
    prefix, sep, count = name.partition(":")
    if is_synthetic(name) and sep and not (count.isdigit() and int(count) >= 1):
        raise ValueError(f"{flag} {name!r}: expected {prefix} or {prefix}:N with N >= 1")


@dataclass(kw_only=True)
class InnerTrainConfig(TrainConfig):
    """One role's inner-loop run: inner(h_t) should match the embedding of token t+1."""

    FLAG_ALIASES = {**TrainConfig.FLAG_ALIASES, "mas_design": "style", "mas_task": "task", "adapter_lr": "lr",
                    "adapter_cos_weight": "w_cos", "adapter_mse_weight": "w_mse", "save_steps": "save_every"}
    """The release's flag names -> ours (--num_train_epochs, --lr_scheduler_type, --grad_accum_steps and
    --load_dir are fields of their own)."""

    mas_role: Annotated[str, NonEmpty()] = "planner"
    """Role of the style, an alias of the release tool (refiner, hie_math_expert, ...), or all (every role at
    once, one Ray Train run each, writing <save_dir>/<role>/)."""
    model_name_or_path: str | None = None
    """Base model of --mas_role (same as --role_model ROLE=NAME for that role); default: from the preset."""
    load_dir: Annotated[str | None, ExistingPath()] = None
    """Inner link folder to start from: a training checkpoint resumes (step and optimizer), a link folder
    (ours or the release's) initialises the link weights of --mas_role."""
    save_dir: Annotated[str, WritableDir()] = "checkpoints/inner"
    """Output folder: the final inner link (links.safetensors + manifest.json, for --ckpt_override), config.json."""
    max_length: Annotated[int, Range(1, 1 << 20)] = 2048
    """Longest prompt + assistant turn in tokens; longer rows lose the end of the turn (right truncation)."""
    w_cos: Annotated[float, Range(0, 1e6)] = 1.0
    """Weight of mean(1 - cos(pred, target))."""
    w_mse: Annotated[float, Range(0, 1e6)] = 0.0
    """Weight of mean MSE(pred, target) (the reference default is 0)."""
    grad_accum_steps: Annotated[int, Range(1, 65536)] = 1
    """Gradient accumulation: batches of batch_size per worker summed into one optimizer step."""
    adapter_dtype: Annotated[str, OneOf(ADAPTER_DTYPES)] = "base"
    """Inner link dtype: base (the reference: the base model's dtype) or float32 (fp32 weights, non-reference)."""
    num_workers: Annotated[int, Range(0, 4096)] = 1
    """Ray Train workers (data parallel); 0 runs Ray Train's local mode in the calling process."""
    fit_timeout_s: Annotated[float | None, Range(0, 1e9, lo_open=True)] = None
    """--mas_role all: timeout of each concurrent role run in seconds (default: wait)."""

    def validate(self) -> None:
        """Role, per-role model and start folder rules, after the shared ones."""
        super().validate()
        if self.mas_role != "all":
            role = canonical_role(get_style(self.system.style), self.mas_role)
            if self.model_name_or_path is not None:
                check_model_names("--model_name_or_path", {role: self.model_name_or_path})
            if self.model_name_or_path and role in self.system.role_models:
                raise ValueError(f"--model_name_or_path and --role_model {role}=... both name the base model of {role}")
        elif self.model_name_or_path or self.load_dir:
            raise ValueError("--mas_role all trains every role: give per-role --role_model / --ckpt_override "
                             "instead of --model_name_or_path / --load_dir")
        if self.load_dir and not os.path.isdir(self.load_dir):
            raise ValueError(f"--load_dir {self.load_dir!r} is not a directory")

    def check_resume(self) -> None:
        """--mas_role all keeps one run per role in save_dir/<role>: each is compared."""
        if self.mas_role != "all":
            return super().check_resume()
        for role in self.roles():
            check_training_resume(self, os.path.join(self.save_dir, role))


@dataclass(kw_only=True)
class OuterTrainConfig(TrainConfig):
    """One outer-loop run: frozen agents unrolled for R rounds, only the outer links train."""

    FLAG_ALIASES = {**TrainConfig.FLAG_ALIASES, "mas_design": "style", "mas_task": "task"}
    """The release's flag names -> ours."""
    SYSTEM_FIELDS = (*TrainConfig.SYSTEM_FIELDS, "links")
    """Outer training also reads --links DIR: the system folder `train_inner --mas_role all --save_dir DIR` wrote
    (its role folders are the inner links; the outer links go to DIR/outer unless --save_dir is given)."""

    save_dir: Annotated[str, WritableDir()] = "checkpoints/outer"
    """Output folder: the final outer links (links.safetensors + manifest.json; jobs/run.py --ckpt_override
    outer=DIR), config.json and, with --eval_every, eval_curve.jsonl and eval_curve.png."""
    num_recursive_rounds: Annotated[int, Range(1, MAX_ROUNDS)] = 3
    """R: rounds unrolled in every training step."""
    max_latent_tokens: Annotated[int, Range(1, 65536)] = 80
    """K: the latents passed between agents are the first K assistant positions."""
    max_length: Annotated[int, Range(8, 1 << 20)] = 4096
    """Longest prompt + assistant turn of one stage in tokens; longer ones lose the START of the prompt (left
    truncation, so the gold turn survives); truncated samples are counted in the log."""
    num_microbatches: Annotated[int, Range(1, 65536)] = 1
    """Microbatches per step, pipelined GPipe-style across the role workers (<= batch_size)."""
    weight_decay: Annotated[float, Range(0, 10)] = 0.0
    """AdamW weight decay (reference 0)."""
    non_last_loss_weight: Annotated[float, Range(0, 1e6)] = 0.0
    """0 supervises the final round only (reference default); w adds w * mean(loss of rounds 1..R-1)."""
    recompute: bool = False
    """Keep only each stage's inputs in forward and re-run the stage during backward (flat activation memory)."""
    verify_frozen: bool = False
    """Hash every base model and inner link at start and end and report whether they stayed bit-identical."""
    profile_memory: bool = False
    """Measure the peak memory held for backward per worker (saved activations; CUDA peak on GPU)."""
    eval_every: Annotated[int, Range(0, MAX_STEPS)] = 0
    """Held-out loss on --eval_dataset every this many steps and at the end (no grad, the training loss); 0: off."""
    eval_dataset: Annotated[str | None, ExistingPath(allow=is_synthetic)] = None
    """Held-out rows (.json/.jsonl with the training fields, or synthetic:N); uses --dataset_json_field."""
    keep_best: bool = False
    """With --eval_every: the run's links are those of the evaluation with the lowest held-out loss (early
    stopping chosen on the held-out rows, e.g. a validation split), not the last step's; the chosen step and
    every evaluation are recorded in manifest.json (`chosen`) and eval_curve.jsonl. After a resume the choice
    is among the evaluations from the resumed step on."""
    # Non-reference recipe options (to make the latent channel carry content; docs/training.md). Each is off by default.
    latent_norm: Annotated[str, OneOf(LATENT_NORMS)] = "none"
    """Non-reference: "embedding" rescales every spliced latent row to the receiving model's mean token-
    embedding norm (as LatentMAS does; the outer link's final LayerNorm gives ~sqrt(d), 8.5x SmolLM2's
    embeddings). Recorded in the checkpoint's manifest, so inference with these links does the same."""
    outer_init: Annotated[str, OneOf(OUTER_INITS)] = "default"
    """default (the reference: PyTorch init) or bridge (non-reference, a third-party re-run's): residual_proj starts as
    the ridge regression from the source's to the target's token embeddings over their shared vocabulary
    strings, the MLP branch ~0, and ln_target's gain at the target embeddings' scale; or state_bridge (non-
    reference, needs --rollout_latent_steps m): the links of stages that receive no latents (round 1's first
    stage) are fitted instead on that stage's m-step rollout latents of the training questions -> the target's
    embedding of the source's own next-token argmax at each rollout state (`train.bridge`; the other links get
    the token bridge). Ignored with --ckpt_override outer=DIR or --resume (the links come from there)."""
    bridge_ridge: Annotated[float, Range(0, 1e6)] = 1e-2
    """--outer_init bridge: ridge strength (times the number of paired tokens) of the least-squares fit."""
    rollout_latent_steps: Annotated[int, Range(0, 4096)] = 0
    """0 (the reference): every stage passes the first K hidden states over its gold turn. m > 0 (non-reference):
    a stage with no incoming latents (round 1's first stage: planner, expert, the mixture experts) passes its
    m-step latent rollout from the prompt instead, the very latents inference sends (no gold text read), so the
    links train on what they will receive; stages with incoming latents stay teacher-forced."""
    rollout_stages: Annotated[str, OneOf(ROLLOUT_STAGES)] = "first"
    """With --rollout_latent_steps m > 0: first (only stages without incoming latents send their rollout; the
    others stay teacher-forced on their gold turn) or all (non-reference: every stage sends what inference
    sends, its m-step rollout from its prompt with the received latents spliced in, the graph kept so the loss
    reaches every upstream outer link; the decoder's feedback in rounds < R is its rollout too, so no latent
    holds hidden states over a gold turn; the decoder's loss stays teacher-forced on the gold answer).
    --recompute re-runs each stage, rollout included, in the backward sweep where memory needs it."""
    rollout_feedback: Annotated[str, OneOf(ROLLOUT_FEEDBACK)] = "graph"
    """With --rollout_stages all: graph (the exact gradient of the rollout) or detached (non-reference): each
    rollout step's fed-back inner(h) is cut from the graph, so the loss reaches the latents a stage received only
    through every step's attention to them, not through the m-step recursion (whose gradient grew to 1e5-1e11
    through a middle agent's 16-step rollout, docs/learning_runs.md); the forward values are unchanged."""
    value_token_weight: Annotated[float, Range(0, 1e6, lo_open=True)] = 1.0
    """Weight of the decoder's answer tokens that hold a digit (the answer's value) in the loss, against 1 for
    the fixed wording; each sample's CE is the weighted mean. 1 is the reference (uniform); > 1 is non-
    reference and counters a loss dominated by the answer's template. Logged losses stay unweighted."""

    schedule: Annotated[str, OneOf(OUTER_SCHEDULES)] = "end_to_end"
    """end_to_end (the reference: every outer link trains through R unrolled rounds, one pipeline worker per
    role) or hop_by_hop (non-reference, `train/hop_by_hop.py`: R = 1 with the decoder last; every edge a token
    link, only the edges into the decoder trained, on the earlier stages' m-step rollouts (m =
    --rollout_latent_steps) as inference sends them, computed once per question and memoised; a Ray Train
    worker per role, stage-parallel). Writes <save_dir>/links.pt and log.json, saved once at the end."""
    torch_threads: Annotated[int, Range(0, 1024)] = 0
    """Torch intra-op threads of each role worker (0: Ray's default, from the worker's CPU share). With
    --schedule hop_by_hop only the decoder's worker computes once every question has been rolled out, so it can
    use the node's cores; equal thread counts also keep CPU float results equal to a run in one process."""
    token_tau: Annotated[float, Range(0, 100, lo_open=True)] = 0.02
    """--schedule hop_by_hop: temperature of the token links' softmax over cosine similarity to the source's
    shared-token embeddings (run F's 0.02, docs/learning_runs.md: near one-hot, so each latent step is relayed
    as its nearest token plus the trained residual)."""

    def checkpoint_keys(self) -> tuple[str, ...]:
        """Roles, plus outer=DIR: start from trained outer links instead of the seeded init."""
        return self.roles() + ("outer",)

    def with_links_folded(self) -> "OuterTrainConfig":
        """This config with --links DIR folded in: DIR's role folders as --ckpt_override (given ones win), and
        --save_dir DIR/outer where --save_dir kept its default; the config itself when --links is unset."""
        if not self.system.links:
            return self

        links = self.system.links
        found = {r: p for r, p in links_overrides(links, self.roles()).items() if r != "outer"}
        save_dir = self.save_dir
        if save_dir == OuterTrainConfig.save_dir:
            if not os.path.isdir(links):
                raise ValueError(f"--links {links}: a Hub id; give --save_dir for the outer links")
            save_dir = os.path.join(links, "outer")
        system = dataclasses.replace(self.system, links=None, ckpt_override={**found, **self.system.ckpt_override})
        return dataclasses.replace(self, system=system, save_dir=save_dir)

    def validate(self) -> None:
        """Microbatch and evaluation rules, after the shared ones."""
        if self.system.links:
            self.system.check_link_folders()
            return self.with_links_folded().validate()
        super().validate()
        if self.num_microbatches > self.batch_size:
            raise ValueError(f"--num_microbatches {self.num_microbatches} exceeds --batch_size {self.batch_size}")
        if self.rollout_stages != "first" and not self.rollout_latent_steps:
            raise ValueError(f"--rollout_stages {self.rollout_stages}: needs --rollout_latent_steps m > 0")
        if self.outer_init == "state_bridge" and not self.rollout_latent_steps:
            raise ValueError("--outer_init state_bridge: needs --rollout_latent_steps m > 0 (it is fitted on the "
                             "first stage's m-step rollouts)")
        if self.rollout_feedback != "graph" and self.rollout_stages != "all":
            raise ValueError(f"--rollout_feedback {self.rollout_feedback}: needs --rollout_stages all")
        if self.eval_every and not self.eval_dataset:
            raise ValueError("--eval_every needs --eval_dataset (held-out rows)")
        if self.keep_best and not self.eval_every:
            raise ValueError("--keep_best needs --eval_every K and --eval_dataset (it keeps the links of the "
                             "evaluation with the lowest held-out loss)")
        if self.eval_dataset:
            _check_dataset("--eval_dataset", self.eval_dataset)
        if self.schedule == "hop_by_hop":
            self._check_hop_by_hop()
        if self.use_gpu and self.gpus_per_worker != 1:
            # The role workers exchange activations over NCCL point to point: two ranks cannot share a
            # GPU, and a worker uses only one device (the pipeline does not split a model over GPUs).
            raise ValueError(f"--gpus_per_worker {self.gpus_per_worker:g}: the outer pipeline with --use_gpu needs "
                             "exactly 1 GPU per role worker (NCCL ranks cannot share a GPU, and a worker uses one)")

    def _check_hop_by_hop(self) -> None:
        """What --schedule hop_by_hop can train: one round, the decoder last reading latents, m > 0, and none of
        the end-to-end options it would otherwise ignore."""
        style = get_style(self.system.style)
        roles = [s.role for s in build_schedule(style, self.num_recursive_rounds)]
        last = build_schedule(style, 1)[-1]
        if self.num_recursive_rounds != 1 or roles[-1] != style.decoder or len(set(roles)) != len(roles) \
                or not last.inputs:
            raise ValueError(f"--schedule hop_by_hop trains one round whose decoder runs last and reads latents; "
                             f"--style {self.system.style} with --num_recursive_rounds {self.num_recursive_rounds} runs "
                             f"{' -> '.join(roles)} (decoder {style.decoder})")
        if not self.rollout_latent_steps:
            raise ValueError("--schedule hop_by_hop: needs --rollout_latent_steps m > 0 (the earlier stages' "
                             "rollout length, as at inference)")
        fixed = {"latent_norm": "none", "outer_init": "default", "rollout_stages": "first", "eval_every": 0,
                 "keep_best": False, "num_microbatches": 1, "recompute": False, "profile_memory": False,
                 "resume": False, "stop_at_step": 0}
        for name, want in fixed.items():
            if getattr(self, name) != want:
                raise ValueError(f"--{name} {getattr(self, name)}: not available with --schedule hop_by_hop "
                                 f"(expected {want})")
        if "outer" in self.system.ckpt_override:
            raise ValueError("--ckpt_override outer=DIR: --schedule hop_by_hop starts from fresh token links")
