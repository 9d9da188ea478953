"""The Python API: build a RecursiveMAS system once, then generate, evaluate or serve with it.

    System.build(style, role_models=..., links=..., backend="local" | "ray")
        -> plan_system (models, dims, links; every check before a model loads)
        -> distributed.launch.start_agents: in-process `LocalPool` (no Ray) or `RayReplicas` (one actor per agent)
    system.generate(questions, ...)   -> per question, its n SampleResults (prediction + per-agent, per-round trace)
    system.evaluate(dataset, ...)     -> the evaluation driver's outputs, on the same running agents
    train_inner(...), train_outer(...) -> link folders that `System.build(links=...)` loads

Both backends take the same arguments and give the same greedy predictions. Settings are held in an
`EvalConfig` (the one config tree of `jobs/run.py`), so the same checks and defaults apply.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
from pathlib import Path
from typing import Sequence

from recmas_ray.api_inputs import (MAX_N, MAX_QUESTION_CHARS, check_int, check_questions, check_stop, finish,
                                   python_names, str_list)
from recmas_ray.config.checks import check_tree
from recmas_ray.config.inputs import check_text_table
from recmas_ray.console import current, default_log_dir, quiet_calls
from recmas_ray.eval.config import EvalConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.transport import OBJECT_STORE
from recmas_ray.distributed.launch import start_agents
from recmas_ray.engine.pool import LocalPool
from recmas_ray.engine.runner import SampleResult, run_batch
from recmas_ray.eval.progress import QuestionProgress
from recmas_ray.styles import get_style
from recmas_ray.styles.prompts import prompt_set_hash
from recmas_ray.system.config import SystemConfig
from recmas_ray.system.hub import links_overrides, resolve_overrides
from recmas_ray.system.plan import plan_system
from recmas_ray.system.trained import check_trained_task, trained_task
from recmas_ray.tasks import task_names
from recmas_ray.tasks.benchmarks import BENCHMARKS, canonical_name

log = logging.getLogger(__name__)

__all__ = ["System", "SampleResult"]

_NO_DATASET = "<python-api>"  # the EvalConfig held by a System has no dataset until `evaluate`


class System:
    """A running multi-agent system: frozen LLM agents of any families joined by (trained) links.

    Build it with `System.build`; use it as a context manager (or call `close`) so that its agents,
    local models or Ray actors, are released.

    Example:
        >>> import recmas_ray as rm
        >>> with rm.System.build("sequential_light", role_models={"solver": "tiny:qwen3"},
        ...                      backend="local") as system:
        ...     out = system.generate(["What is 7 * 8?"], num_recursive_rounds=2, latent_steps=8,
        ...                           max_new_tokens=16)
        >>> out[0][0].prediction, out[0][0].trace[0]["role"]  # doctest: +SKIP
        ('...', 'planner')
    """

    def __init__(self, cfg: EvalConfig, plan, agents, *, num_replicas: int = 1):
        self.cfg, self.plan, self.agents, self.num_replicas = cfg, plan, agents, num_replicas
        self._closed = False
        self.verbose = True
        """Library output shown (`System.build(verbose=...)`)."""
        self.log_path: Path | None = None
        """The log file of library output while `verbose` is off."""

    def _quiet(self):
        return quiet_calls(self.verbose, self.log_path) if self.log_path is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, style: str, *, role_models: dict[str, str] | None = None, links: str | None = None,
              preset: str = "tiny", ckpt_override: dict[str, str] | None = None, backend: str = "ray",
              num_replicas: int = 1, task: str | None = None, device: str = "auto", dtype: str = "auto", seed: int = 42,
              placement: str | PlacementConfig = "cpu", transport: str = OBJECT_STORE.name, timeout_s: float = 900.0,
              torch_threads: int = 0, allow_base_model_mismatch: bool = False,
              allow_style_mismatch: bool = False, allow_task_mismatch: bool = False, prompt_set: str | None = None,
              verbose: bool = False,
              log_dir: str | Path | None = None, progress: bool = True,
              continuous_batching: bool = True) -> System:
        """Plan the system, check it, and start its agents.

        Args:
            style: Collaboration style (sequential_light, sequential_scaled, mixture, distillation,
                deliberation, or an alias).
            role_models: Base model per role (`tiny:<family>`, `pkg:<name>`, a HF id or a local path),
                over the preset; a role whose link checkpoint names another base model is an error
                unless `allow_base_model_mismatch`.
            links: A folder holding per-role link folders (`planner/`, `critic/`, ..., `outer/`), e.g. the
                output of `train_inner` + `train_outer`, or a Hub repo id `ORG/NAME[@REVISION][:SUBFOLDER]`
                laid out the same way. Roles without a folder get fresh (seeded) links.
            preset: Base models of the roles not named in `role_models`: tiny, demo or paper.
            ckpt_override: Per-role link folders (or Hub ids), over the ones found in `links`.
            backend: "local" (in this process, no Ray) or "ray" (one actor per agent).
            num_replicas: Independent copies of the whole system (Ray backend), batches spread over them.
            task: Task type of the prompts (`generate`'s default) and of the release adapters that load
                (`adapter(<task>).pt`): math, code, choice or qa; None: the task the links were trained on
                (their manifests), else math. Another task than the links record is refused.
            device: auto (CUDA when torch sees one), cpu or cuda.
            dtype: auto, float32, bfloat16 or float16.
            seed: Seed of fresh links.
            placement: A placement preset name (cpu, one_gpu_per_agent, colocated, spread) or a
                `PlacementConfig` (Ray backend).
            transport: How latents move between agent actors (`config.transport`: the object store, or Ray
                Direct Transport over gloo or NCCL).
            timeout_s: Timeout of every wait on Ray.
            torch_threads: Torch threads per agent (0: the library default).
            allow_base_model_mismatch: Run `role_models` even where a role's checkpoint names another
                base model (link sizes are still checked).
            allow_style_mismatch: Load links whose manifest records another style (refused otherwise).
            allow_task_mismatch: Run links under another task or prompt set than they record (refused otherwise).
            prompt_set: YAML or JSON prompt set replacing the style's prompts (the one the links were trained with).
            verbose: Show what Ray, Ray Data, HF and the graders print. By default it goes to
                `system.log_path` (`log_dir`/api-<pid>.log) during this and every later call, and Ray's workers
                keep their output in Ray's session folder (named in that log), as the CLI jobs do.
            log_dir: Folder of that log (default: recmas_ray-<uid>/logs under the temp dir).
            progress: Ray backend: start the small actor through which agents report each question's end, so
                that progress bars move per question (False for a system that never shows one, e.g. a server).
            continuous_batching: Each agent merges the steps of every call in flight into shared forwards (and on
                Ray, calls of several batches to one agent leave as one Ray call); same latents and greedy text.
                False: one call at a time per agent.

        Returns:
            The running system.

        Raises:
            ValueError: On any bad argument, before a model loads.
        """
        log_path = Path(log_dir if log_dir is not None else default_log_dir()) / f"api-{os.getpid()}.log"
        with quiet_calls(verbose, log_path), python_names():
            system = cls._build(style, role_models=role_models, links=links, preset=preset,
                                ckpt_override=ckpt_override, backend=backend, num_replicas=num_replicas, task=task,
                                device=device, dtype=dtype, seed=seed, placement=placement, transport=transport,
                                timeout_s=timeout_s, torch_threads=torch_threads,
                                allow_base_model_mismatch=allow_base_model_mismatch,
                                allow_style_mismatch=allow_style_mismatch, allow_task_mismatch=allow_task_mismatch,
                                prompt_set=prompt_set, progress=progress, continuous_batching=continuous_batching)
        system.verbose, system.log_path = verbose, log_path
        return system

    @classmethod
    def _build(cls, style, *, role_models, links, preset, ckpt_override, backend, num_replicas, task, device, dtype,
               seed, placement, transport, timeout_s, torch_threads, allow_base_model_mismatch,
               allow_style_mismatch, allow_task_mismatch, prompt_set, progress, continuous_batching=True) -> System:
        role_models, ckpt_override = check_text_table("role_models", role_models), check_text_table(
            "ckpt_override", ckpt_override)  # before any of them is resolved (Hub ids, link folders)
        check_int("num_replicas", num_replicas, 1)
        if backend == "local" and num_replicas != 1:
            raise ValueError(f"num_replicas={num_replicas} needs backend='ray' (the local backend runs one copy)")
        overrides = links_overrides(links, get_style(style).roles) if links else {}
        overrides |= resolve_overrides(dict(ckpt_override or {}))
        placement = placement if isinstance(placement, PlacementConfig) else PlacementConfig(preset=placement)
        system = SystemConfig(style=style, preset=preset, ckpt_override=overrides, role_models=dict(role_models or {}),
                              allow_base_model_mismatch=allow_base_model_mismatch,
                              allow_style_mismatch=allow_style_mismatch, allow_task_mismatch=allow_task_mismatch,
                              prompt_set=prompt_set, device=device, dtype=dtype, seed=seed,
                              continuous_batching=continuous_batching)
        task = task if task is not None else trained_task(overrides) or "math"
        cfg = EvalConfig(system=system, dataset=_NO_DATASET, backend=backend, placement=placement, transport=transport,
                         timeout_s=timeout_s, torch_threads=torch_threads, progress=False, task=task)
        check_tree(cfg, lambda path: path.removeprefix("system."))  # the keyword arguments' names
        plan = plan_system(cfg.system, task=task, tools=cfg.tool_loop())
        check_trained_task(overrides, [task], prompt_set_hash(plan.style), allow=allow_task_mismatch,
                           task_flag="task=")
        agents = start_agents(plan, backend=backend, placement=placement, timeout_s=timeout_s,
                              torch_threads=torch_threads, transport=transport, num_replicas=num_replicas,
                              progress_relay=progress)
        return cls(cfg, plan, agents, num_replicas=num_replicas)

    # ------------------------------------------------------------------ use
    @property
    def style(self) -> str:
        """The style name the system was built with."""
        return self.plan.style_name

    @property
    def task(self) -> str:
        """The task type the system prompts by default (built with, or recorded by its links)."""
        return self.cfg.task or "math"

    @property
    def role_models(self) -> dict[str, str]:
        """Base model of each role."""
        return dict(self.plan.role_models)

    def manifest(self) -> dict:
        """What results and checkpoints record about this system (roles, base models, links' sources)."""
        return self.plan.manifest()

    def generate(self, questions: str | Sequence[str], *, task: str | Sequence[str] | None = None,
                 method: str = "recursive_mas", num_recursive_rounds: int = 3, latent_steps: int = 32,
                 max_new_tokens: int = 256, do_sample: bool = False, temperature: float = 0.6, top_p: float = 0.95,
                 top_k: int = 0, seed: int | None = None, batch_size: int = 8, stop: str | Sequence[str] | None = None,
                 n: int = 1, max_question_chars: int = MAX_QUESTION_CHARS,
                 progress: bool = False) -> list[list[SampleResult]]:
        """Answer questions with the system: per question, in order, a list of its `n` `SampleResult`s (the
        shape of vLLM's `RequestOutput.outputs`: `out[i][0]` is question i's first answer, also for n=1).

        Args:
            questions: A question or a list of them (the task's answer instruction is added by the style's prompts).
            task: Task type of every question, or one per question: math, choice, code or qa (None: the
                system's, `System.task`).
            method: recursive_mas, recursive_textmas, textmas, single_agent, text_relay or rollout_as_text.
            num_recursive_rounds: R, rounds of the agent loop.
            latent_steps: m, latent steps per agent and round (recursive_mas).
            max_new_tokens: Decoding budget of the final (and, for text methods, every) text step.
            do_sample: Sample instead of greedy decoding (with temperature, top_p, top_k, seed).
            temperature: Sampling temperature.
            top_p: Nucleus sampling mass.
            top_k: Top-k sampling (0 disables).
            seed: Sampling seed (default: the system's seed).
            batch_size: Questions per agent call.
            stop: Stop string(s): the final text is cut before the first one found and its
                `finish_reason` is "stop" (decoding itself runs to EOS or the budget; `num_text_tokens`
                counts every decoded token).
            n: Answers per question: sampled as rows of one batch (do_sample), or n copies of the greedy
                answer (greedy decoding gives the same answer every time, as vLLM's n does).
            max_question_chars: Longest question accepted (characters).
            progress: A tqdm bar on stderr counting answers as each one is done: when its row of the final
                decode stops (EOS; reported by the agent actors as it happens on Ray), else when its batch
                comes back (`eval.progress.QuestionProgress`).

        Returns:
            One list of n results per question (`[]` for no questions). Each result: `prediction` (the final agent's text), `finish_reason` ("stop": EOS or a stop
            string; "length": the budget), `num_text_tokens`, `num_latent_steps`, `seconds` (from its batch's
            submission to its result) and `trace`
            (per agent and round: role, round, action, latent_steps, text_tokens, prompt_tokens, seconds,
            and the text of intermediate text steps).

        Raises:
            TypeError: A question, task or stop string that is not a str.
            ValueError: Any other bad argument (before any agent runs).
        """
        self._check_open()
        questions = check_questions(questions, max_question_chars=max_question_chars, allow_empty=True)
        task = self.task if task is None else task
        tasks = [task] * len(questions) if isinstance(task, str) else str_list(task, "task")
        if len(tasks) != len(questions):
            raise ValueError(f"{len(questions)} questions but {len(tasks)} task types")

        bad = sorted({t for t in tasks if t not in task_names()})
        if bad:
            raise ValueError(f"unknown task type(s) {bad}; expected one of {list(task_names())}")
        check_int("batch_size", batch_size, 1)
        check_int("n", n, 1, MAX_N)

        check_trained_task(self.cfg.system.ckpt_override, tasks, prompt_set_hash(self.plan.style),
                           allow=self.cfg.system.allow_task_mismatch, task_flag="task=")
        stops = check_stop(stop)
        rc = RecursionConfig(method=method, num_recursive_rounds=num_recursive_rounds, latent_steps=latent_steps,
                             decode=DecodeConfig(max_new_tokens=max_new_tokens, do_sample=do_sample,
                                                 temperature=temperature, top_p=top_p, top_k=top_k,
                                                 seed=self.cfg.system.seed if seed is None else seed))
        check_tree(rc, lambda path: path)
        if not questions:
            return []
        # Sampled n > 1: n rows per question; greedy: one row, copied (every copy would be the same).
        per_question = n if do_sample else 1
        rows = [q for q in questions for _ in range(per_question)]
        row_tasks = [t for t in tasks for _ in range(per_question)]
        out: list[SampleResult] = []
        with self._quiet():
            bar = current().bar(len(rows), "generate", unit="question" if per_question == 1 else "answer",
                                enabled=progress)
            local = isinstance(self.agents, LocalPool)
            relay = None if local else getattr(self.agents, "progress_relay", None) or True
            counter = QuestionProgress(bar, relay=relay)
            try:
                for k in range(0, len(rows), batch_size):
                    names = range(k, min(k + batch_size, len(rows)))
                    # adaptive rounds decode in several calls: their questions count when results arrive
                    on_token = counter.batch(f"rows{k}", names, stream=rc.adaptive_threshold is None)
                    out += self.run(rows[k:k + batch_size], row_tasks[k:k + batch_size], rc,
                                    **({} if on_token is None else {"on_token": on_token}))
                    counter.done(names)
            finally:
                counter.close()
        for res in out:
            finish(res, rc.decode.max_new_tokens, stops)
        if do_sample:
            return [out[i * n:(i + 1) * n] for i in range(len(questions))]
        return [[res] + [copy.deepcopy(res) for _ in range(n - 1)] for res in out]

    def run(self, questions: list[str], tasks: list[str], rc: RecursionConfig, **run_options) -> list[SampleResult]:
        """One checked batch through the agents (what `generate`, the server and lm-eval call); `run_options`
        are `run_batch`'s: `on_token(ids)` is called with the token id picked per question at every step of
        the final decode (streaming), `targets` + `score_continuation` score continuations (likelihoods)."""
        self._check_open()
        if isinstance(self.agents, LocalPool):
            return run_batch(self.agents, self.plan.style, questions, tasks, rc, **run_options)
        import ray  # lazy: Ray reads env settings on import; this module loads before the console sets them

        ref = self.agents.solve(questions, tasks, rc, **run_options)
        try:
            return ray.get(ref, timeout=self.cfg.timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.agents.cancel(ref)  # its queued agent calls never run
            raise RuntimeError(f"a batch of {len(questions)} questions did not finish within {self.cfg.timeout_s} s") \
                from None

    def evaluate(self, dataset: str, *, dataset_path: str | None = None, methods: Sequence[str] = ("recursive_mas",),
                 num_samples: int | None = None, num_recursive_rounds: int = 3, latent_steps: int = 32,
                 max_new_tokens: int = 256, do_sample: bool = False, temperature: float = 0.6, batch_size: int = 8,
                 num_rollouts: int = 1, grader: str = "strict",
                 format_retry: bool = True, format_help: bool = False, output_path: str = "out",
                 resume: bool = False, progress: bool = True) -> dict:
        """Evaluate on a benchmark or a local question file with the running agents (as `jobs/run.py` does).

        Args:
            dataset: Benchmark name (math500, gsm8k, ...) or a local .jsonl/.json question file.
            dataset_path: Local copy of a named benchmark.
            methods: Methods run on the same questions.
            num_samples: Evaluate the first N questions (all when None).
            num_recursive_rounds: R.
            latent_steps: m.
            max_new_tokens: Decoding budget per text step.
            do_sample: Sample instead of greedy decoding (rollout r uses the system's seed + r).
            temperature: Sampling temperature.
            batch_size: Questions per agent call.
            num_rollouts: Rollouts per question (pass@k; sampled rollouts differ).
            grader: Headline grader: strict or reference.
            format_retry: The release's answer-format retry.
            format_help: The decoder's prompt ends with the answer-format instruction and one worked example
                (`eval/rows.py`; recorded in the fingerprint and results).
            output_path: Where samples_*.jsonl, results_*.json and config.json go.
            resume: Skip samples already in the latest samples file.
            progress: A tqdm bar per method on stderr, counting each question when its final decode stops
                (reported by the agents as it happens) or its result arrives, with the accuracy so far; its
                rate is the run's throughput (the table's and the results file's).

        Returns:
            {"results": metrics per benchmark/method, "samples_path", "results_path", "table"}: the results
            table is returned, not printed (`print(report["table"])` shows it).

        Raises:
            ValueError: A bad argument (named as here), before anything is written.
        """
        self._check_open()
        # lazy: Ray reads env settings on import; this module loads before the console sets them
        from recmas_ray.eval.run import evaluate

        cfg = dataclasses.replace(
            self.cfg, dataset=dataset, dataset_path=dataset_path, methods=list(methods), num_samples=num_samples,
            recursion=dataclasses.replace(self.cfg.recursion, num_recursive_rounds=num_recursive_rounds,
                                          latent_steps=latent_steps,
                                          decode=dataclasses.replace(self.cfg.recursion.decode,
                                                                     max_new_tokens=max_new_tokens,
                                                                     do_sample=do_sample, temperature=temperature)),
            batch_size=batch_size, num_rollouts=num_rollouts, grader=grader, format_retry=format_retry,
            format_help=format_help,
            output_path=str(output_path), resume=resume, progress=progress,
            task=None if canonical_name(dataset) in BENCHMARKS else self.cfg.task)  # a benchmark brings its own
        with self._quiet(), python_names():
            return evaluate(cfg, progress=progress, system=self.agents, echo=False)  # the caller prints the table

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this System is closed; build a new one")

    def close(self) -> None:
        """Release the agents (Ray actors and placement group, or the in-process models); idempotent."""
        if self._closed:
            return
        self._closed = True
        shutdown = getattr(self.agents, "shutdown", None)
        if shutdown is not None:
            with self._quiet():
                shutdown()
        self.agents = None

    def __enter__(self) -> System:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"System({self.style!r}, backend={self.cfg.backend!r}, role_models={self.role_models}, "
                f"{'closed' if self._closed else 'running'})")
