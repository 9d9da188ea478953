"""The evaluation run behind `jobs/run.py`: questions, system, methods, backend and outputs.

`EvalConfig` holds the shared `RecursionConfig` (method, R, m, decoding) rather than a copy of its
fields, and the shared `SystemConfig` as `system`; the driver sets `recursion.method` per method and
`recursion.decode.seed` from `system.seed`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.choices import BACKENDS, GRADERS
from recmas_ray.config.inputs import check_cuda, check_data_path, check_file, read_data_file
from recmas_ray.models.registry import check_model_names
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import MAX_ROUNDS, METHODS, RecursionConfig, ToolLoopConfig
from recmas_ray.config.tracking import TrackingConfig
from recmas_ray.config.transport import OBJECT_STORE, get_transport, transport_names
from recmas_ray.styles import get_style, tool_styles
from recmas_ray.styles.prompts import load_prompt_set
from recmas_ray.system.config import SystemConfig
from recmas_ray.tasks import task_names
from recmas_ray.tasks.benchmarks import BENCHMARKS, canonical_name

PROTOCOLS = ("greedy", "reference")  # what each one sets: recmas_ray.eval.protocol
OUTER_INITS = ("trained", "untrained")
"""--outer_init of an evaluation: trained (the loaded weights) or untrained (each kind's initial state,
`eval/rows.py`)."""


@dataclass(kw_only=True)
class StreamConfig:
    """How the Ray backend streams batches through client actors (Ray Data)."""

    SHORT_FLAGS = ("client_cpus", "client_max_restarts", "num_clients", "batches_per_client")
    """Fields with a plain flag (`--name`) wherever this section is nested (config/cli.py)."""

    num_clients: Annotated[int, Range(0, 1024)] = 0
    """Batches in flight per system replica, so agents overlap; 0 (auto): two per agent actor of a
    replica, enough to keep every stage busy, capped by the object store's memory for the batches'
    messages and by the client processes' CPUs and memory (eval/stream.py `batches_in_flight`)."""
    batches_per_client: Annotated[int, Range(1, 64)] = 4
    """Batches one client actor keeps in flight at once, each on its own thread (a client mostly waits on
    the agents): the in-flight batches take ceil(depth / this) client processes of ~400 MB each, not
    one each. 1: a process per batch."""
    client_cpus: Annotated[float, Range(0, 64)] = 0.25
    """Logical CPUs per client actor (fractions keep CPUs free for Ray Data's own tasks; no GPUs)."""
    client_max_restarts: Annotated[int, Range(-1, 10_000)] = -1
    """Restarts of a dead client, its batch rerun (-1: no limit; 0: a dead client ends the run)."""


@dataclass(kw_only=True)
class EvalConfig:
    """One evaluation run (saved, resolved, next to its results)."""

    SYSTEM_FIELDS = ("style", "preset", "role_models", "ckpt_override", "links",
                     "allow_base_model_mismatch", "allow_style_mismatch", "allow_task_mismatch", "prompt_set",
                     "device", "dtype",
                     "message_dtype", "seed", "continuous_batching")
    """System fields an evaluation reads (the others get no flag and are refused when set)."""
    FLAG_ALIASES = {"models": "system.role_models", "role_model": "system.role_models", "method": "methods",
                    "placement": "placement.preset", "latent_length": "latent_steps",
                    "max_inflight_batches": "stream.num_clients", "python_timeout": "tools.python_timeout_s"}
    """Other spellings of jobs.run's flags: the release's names and this project's earlier ones."""

    system: SystemConfig
    """Which system runs: style, base models, links, prompt set, device, dtypes, seed (of fresh links and of
    sampling: rollout r decodes with seed + r)."""
    dataset: Annotated[str, NonEmpty()]
    """Benchmark name (math500, gsm8k, ...) or a local .jsonl/.json question file."""
    task: Annotated[str | None, OneOf(task_names)] = None
    """Task type (answer instruction and grader) of a local file's rows that carry no `task` field; unset: the
    task the links were trained on (their manifests), else math. Named benchmarks bring their own."""
    dataset_path: str | None = None
    """Local copy of a named benchmark (else its RECMAS_<NAME>_PATH variable, else the Hub)."""
    dataset_json_field: str | None = None
    """Field holding the rows of a JSON file wrapped as {"data": [...]}."""
    methods: Annotated[list[str], OneOf(METHODS), NonEmpty()] = field(default_factory=lambda: ["recursive_mas"])
    """Methods run on the same questions."""
    recursion: RecursionConfig = field(default_factory=RecursionConfig)
    """Rounds, latent steps and decoding, shared by every method."""
    sweep_rounds: Annotated[list[int], Range(1, MAX_ROUNDS)] = field(default_factory=list)
    """Run once per R in this list (sub-directories R<r> of output_path, one plot across them);
    empty: one run at num_recursive_rounds."""
    num_samples: Annotated[int | None, Range(1, 10_000_000)] = None
    """Evaluate the first N questions (all when unset)."""
    num_rollouts: Annotated[int, Range(1, 1024)] = 1
    """Rollouts per question (pass@k); rollout r decodes with seed + r."""
    batch_size: Annotated[int, Range(1, 4096)] = 8
    """Questions per agent call."""
    stream: StreamConfig = field(default_factory=StreamConfig)
    """Ray backend: client actors that keep batches in flight."""
    format_retry: bool = True
    """The answer-format retry (recorded per sample as retry_used): a reply without the answer format is
    continued once after "Final Answer: \\boxed{" from the prompt the decoder read, latents included."""
    format_help: bool = False
    """The decoder's prompt (every method's, the single agent's too) ends with the answer-format instruction and one
    worked example (`eval/rows.py`); no other role's prompt changes. Recorded in the fingerprint and results."""
    outer_init: Annotated[str, OneOf(OUTER_INITS)] = "trained"
    """trained: the loaded outer links; untrained: each loaded outer link in its kind's untrained initial state
    (a token link's pure translation, a release OuterLink's init as its training started, bridge fit included;
    `eval/rows.py`), so a "fresh" row compares like with like. Needs outer links (--links or
    --ckpt_override outer=DIR)."""
    allow_unknown_links: bool = False
    """Use --ckpt_override link folders without a provenance.json matching their files (made outside this
    project's training jobs, or changed since); they are recorded as of unknown origin in the results."""
    backend: Annotated[str, OneOf(BACKENDS)] = "ray"
    """ray (agents as Ray actors) or local (in-process, no Ray)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Ray placement preset and per-role resources."""
    grader: Annotated[str, OneOf(GRADERS)] = "strict"
    """Headline grader: strict (math-verify) or reference (the release's lenient rules); both are recorded."""
    protocol: Annotated[str, OneOf(PROTOCOLS)] = "greedy"
    """greedy: every setting as configured (greedy decoding by default); reference: start from the release's
    sampling, token budgets, m and R per style and benchmark, 3 runs (AIME: 10, pass@10) and the reference
    grader (`eval.protocol.reference`), flags and --config win; results record where each came from."""
    output_path: Annotated[str, WritableDir()] = "out"
    """Directory for samples_*.jsonl, results_*.json and config.json."""
    track: TrackingConfig = field(default_factory=TrackingConfig)
    """Experiment tracking of the results (--tracking mlflow: a local store in output_path/mlruns by default)."""
    resume: bool = False
    """Skip samples already in the latest samples file of this benchmark in output_path (errored
    samples run again); refused when that file's fingerprint differs from this run's."""
    max_batch_retries: Annotated[int, Range(0, 100)] = 2
    """Retries of a failed batch; after the last its samples are written with an `error` field,
    the run goes on and the job exits 1."""
    plot: bool = False
    """Write accuracy, tokens and seconds vs rounds as a PNG."""
    dry_run: bool = False
    """Print the memory plan (per GPU: which roles and copies go there, their weight and KV bytes at this batch
    size and these lengths, from the models' configs) and exit without loading a model or writing a file; a plan
    that does not fit the GPUs is refused (exit status 2), as every GPU run does before its agents load."""
    timeout_s: Annotated[float, Range(0, 7 * 86400, lo_open=True)] = 900.0
    """Timeout of every wait on Ray, in seconds."""
    torch_threads: Annotated[int, Range(0, 1024)] = 0
    """Torch threads per agent (0: the library default)."""
    transport: Annotated[str, OneOf(transport_names)] = OBJECT_STORE.name
    """How latents move between agent actors: object_store, rdt:gloo (CPU) or rdt:nccl (GPU)."""
    tools: ToolLoopConfig = field(default_factory=ToolLoopConfig)
    """Deliberation style only: the toolcaller's Python and search tools."""
    progress: bool = True
    """Progress bars on the console."""
    verbose: bool = False
    """Show Ray, Ray Data, HF and grader output on the console (else it goes to output_path/logs/run.log)."""

    def tool_loop(self) -> ToolLoopConfig | None:
        """The tool settings when the style uses tools (its decoder runs the tool loop), else None."""
        return self.tools if get_style(self.system.style).uses_tools else None

    def check_tools(self, style) -> None:
        """Tool settings given for a style without tools are refused (they would be ignored)."""
        if style.uses_tools:
            return
        default = ToolLoopConfig()
        changed = [f.name for f in dataclasses.fields(ToolLoopConfig)
                   if getattr(self.tools, f.name) != getattr(default, f.name)]
        if changed:
            raise ValueError(f"{', '.join('--' + c for c in changed)}: tool settings apply to a style with tools "
                             f"({', '.join(tool_styles())}) only; style {self.system.style} has no tools, so drop them")

    def check_section(self, name: str) -> None:
        """Run by `check_tree` before section `name` is checked: tool settings for a style without tools are
        refused as such before the tools section's own checks (a keys file's mode) could hide that."""
        if name == "tools":
            try:
                style = get_style(self.system.style)
            except ValueError:
                return  # the system section's check names the style
            self.check_tools(style)

    def validate(self) -> None:
        """Rules across fields and files (run before any model loads)."""
        system = self.system
        style = get_style(system.style)
        local = os.path.splitext(self.dataset)[1].lower() in (".json", ".jsonl", ".csv", ".parquet")
        if local:
            check_file("--dataset", self.dataset, non_empty=True)
        if self.dataset_path is not None:
            if local:
                raise ValueError(f"--dataset_path is for a named benchmark, but --dataset {self.dataset!r} is a "
                                 "file already; drop --dataset_path")
            if canonical_name(self.dataset) not in BENCHMARKS:
                raise ValueError(f"--dataset {self.dataset!r} is no known benchmark, so --dataset_path has "
                                 f"nothing to be a copy of; expected one of {sorted(BENCHMARKS)}")
            check_data_path("--dataset_path", self.dataset_path)
        named = BENCHMARKS.get(canonical_name(self.dataset))
        if self.task is not None and named is not None and named.task_type != self.task:
            raise ValueError(f"--task {self.task}: benchmark {self.dataset} is graded as {named.task_type}; --task sets "
                             "the task of a local file's rows, drop it here")
        self.check_tools(style)
        if self.backend == "local" and self.placement.num_replicas != 1:
            raise ValueError(f"--num_replicas {self.placement.num_replicas} needs --backend ray (the local "
                             "backend runs one in-process system)")
        if system.device == "cuda" and not (self.dry_run and self.placement.plan_node_gpus):
            check_cuda("--device cuda", on_cluster=self.backend == "ray", plan_hint=self.dry_run)
        system.check_tables("--models", ckpt_extra=("outer",))
        check_model_names("--models", system.role_models)
        system.check_link_folders()
        self.placement.check_roles(style.roles)
        if system.prompt_set:
            read_data_file(system.prompt_set, "--prompt_set")  # kind, size, encoding, no YAML aliases
            load_prompt_set(system.prompt_set, style)  # a bad file fails here, before any model loads
        transport = get_transport(self.transport)
        transport.check_placement(self.placement, style.roles, device=system.device)
        transport.check_backend(self.backend)
        transport.check_ablation(self.recursion.latent_ablation)
        transport.check_adaptive_rounds(self.recursion.adaptive_threshold)
        # what this machine has comes after what the configuration says of itself: a GPU plan that is wrong
        # anywhere is reported as such, not as a missing GPU
        self.placement.check_gpus_visible(self.backend, dry_run=self.dry_run)
