"""lm-evaluation-harness backend: a RecursiveMAS system as lm-eval model `recmas_ray`.

    lm_eval --model recmas_ray --tasks gsm8k --output_path results --log_samples \
        --model_args style=sequential_light,role_models=planner:tiny:qwen3|critic:tiny:llama,backend=local

lm-eval 0.4.13 discovers no plug-in entry points; the installed startup hook (`recmas_ray/_lmeval_hook.py`)
registers this class under `recmas_ray` lazily, so lm-eval's own `lm_eval` command and
`lm_eval.simple_evaluate(model="recmas_ray")` find it. `python -m recmas_ray.lmeval` (or `recmas-lm-eval`)
is the same command line with this module imported explicitly (for environments with the hook off).

model_args (comma-separated KEY=VALUE, lm-eval's format; `python -m recmas_ray.lmeval --help` lists them with
their defaults; they are checked before lm-eval loads its tasks or any model loads): style (required),
pretrained (trained links: a system folder or Hub id; lm-eval names its output folder after it), links,
role_models, ckpt_override, preset, backend (ray|local), dtype, seed, task (unset: the one the links were trained
on), allow_task_mismatch, method, num_recursive_rounds, latent_steps, max_new_tokens. lm-eval's own --device (cuda, cuda:N, cpu; cpu with a warning when torch sees
no GPU) and --batch_size (questions per agent call; "auto" means 8) apply as well.

Requests:
  generate_until         each context is a question to the whole system; the final agent's text is cut at
                         the first `until` string
  loglikelihood          log p(continuation | the final agent's prompt with its incoming latents or texts),
                         after the other agents ran the usual rounds on the context (either backend)
  loglikelihood_rolling  NotImplementedError: a latent-augmented prompt has no rolling document likelihood
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import Annotated

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from recmas_ray.api import System
from recmas_ray.config.checks import ConfigError, OneOf, Range, check_tree, field_hints, split_annotated
from recmas_ray.config.choices import BACKENDS, DTYPES, MODEL_PRESETS
from recmas_ray.config.cli import field_docs, parse_text
from recmas_ray.config.recursion import (MAX_LATENT_STEPS, MAX_NEW_TOKENS, MAX_ROUNDS, METHODS, DecodeConfig,
                                         RecursionConfig)
from recmas_ray.styles import check_role_models, style_names
from recmas_ray.tasks import TASK_TYPES

MODEL_NAME = "recmas_ray"
LM_EVAL_SETTINGS = ("batch_size", "max_batch_size", "device", "trust_remote_code")
"""Settings lm-eval itself passes to every model (from its own flags), next to the user's model_args."""
log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ModelArgs:
    """The `--model_args` of `lm_eval --model recmas_ray` (torch-free, so they are checked in milliseconds)."""

    style: Annotated[str, OneOf(style_names)]
    """Collaboration style."""
    pretrained: str | None = None
    """Trained links: a system folder (planner/, critic/, ..., outer/) or a Hub id ORG/NAME[@REV]; lm-eval names
    its output folder after this value. `fresh` (like leaving it out) keeps seeded fresh links."""
    links: str | None = None
    """The same as pretrained (the Python API's name); give one of the two."""
    role_models: str | None = None
    """ROLE:MODEL items joined by `|`, split at the first `:` (planner:tiny:qwen3|solver:org/model)."""
    ckpt_override: str | None = None
    """ROLE:DIR items joined by `|` (DIR may be a Hub id), over the folders found in pretrained."""
    preset: Annotated[str, OneOf(MODEL_PRESETS)] = "tiny"
    """Models of the roles that role_models does not name."""
    backend: Annotated[str, OneOf(BACKENDS)] = "ray"
    """ray (agents as Ray actors) or local (in this process)."""
    dtype: Annotated[str, OneOf(DTYPES)] = "auto"
    """Model dtype (auto: bf16 on CUDA, fp32 on CPU)."""
    seed: Annotated[int, Range(0, 2**63 - 1)] = 42
    """Seed of fresh links and of sampling."""
    task: Annotated[str | None, OneOf(TASK_TYPES)] = None
    """Task type of the prompts: math, choice, code or qa; unset: the task the links were trained on (their
    manifests), else math."""
    allow_task_mismatch: bool = False
    """Run links under another task or prompt set than their manifests record (refused otherwise)."""
    method: Annotated[str, OneOf(METHODS)] = "recursive_mas"
    """recursive_mas, recursive_textmas, textmas, single_agent, text_relay or rollout_as_text
    (recmas_ray/engine/relay.py)."""
    num_recursive_rounds: Annotated[int, Range(1, MAX_ROUNDS)] = 3
    """R, rounds of the agent loop."""
    latent_steps: Annotated[int, Range(0, MAX_LATENT_STEPS)] = 32
    """m, latent steps per agent and round."""
    max_new_tokens: Annotated[int, Range(1, MAX_NEW_TOKENS)] = 256
    """Decoding budget when a request names no max_gen_toks."""

    def validate(self) -> None:
        """Per-role tables name roles of the style; pretrained and links are one setting."""
        if self.pretrained is not None and self.links is not None:
            raise ValueError("model_args pretrained and links are the same setting; give one of them")
        check_role_models("model_args role_models", parse_pairs(self.role_models, what="role_models"), self.style)
        check_role_models("model_args ckpt_override", parse_pairs(self.ckpt_override, what="ckpt_override"),
                          self.style, extra=("outer",))

    def links_source(self) -> str | None:
        """The links to load (None: fresh)."""
        value = self.pretrained if self.pretrained is not None else self.links
        return None if value in (None, "", "fresh") else str(value)


def parse_pairs(text: str | None, *, what: str) -> dict[str, str]:
    """`ROLE:VALUE|ROLE:VALUE` -> {ROLE: VALUE}, split at the first ':' of each item."""
    out = {}
    for item in (t.strip() for t in str(text or "").split("|") if t.strip()):
        key, sep, value = item.partition(":")
        if not sep or not key.isidentifier() or not value:
            raise ValueError(f"model_args {what}: item {item!r} is not ROLE:VALUE (items joined by '|')")
        out[key] = value
    return out


def check_model_args(values: dict) -> ModelArgs:
    """lm-eval's parsed model_args (values typed by lm-eval, or strings) as a checked `ModelArgs`.

    Raises ValueError naming the argument and what was expected (lm-eval's own settings pass through).
    """
    hints = field_hints(ModelArgs)
    names = [f.name for f in dataclasses.fields(ModelArgs)]
    unknown = sorted(set(values) - set(names) - set(LM_EVAL_SETTINGS))
    if unknown:
        raise ConfigError(f"recmas_ray model_args: unknown {unknown}; expected some of {names} "
                          f"(`python -m recmas_ray.lmeval --help` lists them)")
    if "style" not in values:
        raise ConfigError("recmas_ray model_args: style is required (e.g. style=sequential_light)")
    typed = {}
    for name in names:
        if name not in values:
            continue
        base, _ = split_annotated(hints[name])
        value = values[name]
        if isinstance(value, str):
            try:
                value = parse_text(base, value)
            except Exception as e:  # noqa: BLE001 - argparse's type error: one line naming the argument
                raise ConfigError(f"model_args {name}={values[name]!r}: {e}") from None
        elif base is int and isinstance(value, float) and value.is_integer():
            value = int(value)  # lm-eval reads "-3" as -3.0
        elif base is not int and not isinstance(value, bool) and isinstance(value, (int, float)):
            value = str(value)  # lm-eval typed a text setting that looks like a number (a Hub revision, say)
        typed[name] = value
    args = ModelArgs(**typed)
    check_tree(args, lambda path: f"model_args {path}")
    return args


def model_args_help() -> str:
    """One line per model argument: name, docstring and default (for `--help`)."""
    docs, lines = field_docs(ModelArgs), ["recmas_ray model_args (--model_args KEY=VALUE,KEY=VALUE):"]
    for f in dataclasses.fields(ModelArgs):
        default = "required" if f.default is dataclasses.MISSING else f"default: {f.default}"
        lines.append(f"  {f.name:<22} {' '.join(docs.get(f.name, '').split())} ({default})")
    return "\n".join(lines)


@register_model(MODEL_NAME)
class RecMASLM(LM):
    """A RecursiveMAS system behind lm-eval's `LM` interface (see the module docstring for model_args).

    Example:
        >>> import lm_eval, recmas_ray.lmeval  # doctest: +SKIP
        >>> lm_eval.simple_evaluate(model="recmas_ray", tasks=["gsm8k"],
        ...                         model_args="style=sequential_light,backend=local")  # doctest: +SKIP
    """

    def __init__(self, *, batch_size: int | str | None = None, device: str | None = "auto", system=None,
                 max_batch_size=None, trust_remote_code=None, **model_args):
        super().__init__()
        args = check_model_args(model_args)
        self.args = args
        self.task, self.method = args.task, args.method
        self.rounds, self.latent_steps, self.max_new_tokens = args.num_recursive_rounds, args.latent_steps, \
            args.max_new_tokens
        self.batch_size = int(batch_size) if str(batch_size or "").isdigit() else 8
        device = str(device or "auto")
        if device.startswith("cuda") and not torch.cuda.is_available():  # lm-eval's default --device is cuda:0
            log.warning("recmas_ray: device %s requested but torch sees no CUDA device; using cpu", device)
            device = "cpu"
        device = "cuda" if device.startswith("cuda") else device
        self.system = system or System.build(
            args.style, role_models=parse_pairs(args.role_models, what="role_models"), links=args.links_source(),
            ckpt_override=parse_pairs(args.ckpt_override, what="ckpt_override"), preset=args.preset,
            backend=args.backend, device=device, dtype=args.dtype, seed=args.seed, task=self.task,
            allow_task_mismatch=args.allow_task_mismatch)
        self.task = self.system.task  # the one given, else the links' recorded task

    def get_model_info(self) -> dict:
        """Recorded by lm-eval in its results' `config`: the system's roles, base models and link sources."""
        return {"recmas_ray_system": self.system.manifest(), "recmas_ray_method": self.method,
                "recmas_ray_rounds": self.rounds, "recmas_ray_latent_steps": self.latent_steps}

    # ------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each context goes to the whole system; the final agent's text, cut at the first `until` string."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted((req.args[1] or {}).items())), []).append(i)
        for idx in groups.values():
            kwargs = dict(requests[idx[0]].args[1] or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            temperature = float(kwargs.get("temperature", 0.0) or 0.0)
            results = self.system.generate(
                [requests[i].args[0] for i in idx], task=self.task, method=self.method,
                num_recursive_rounds=self.rounds, latent_steps=self.latent_steps,
                max_new_tokens=int(kwargs.get("max_gen_toks", self.max_new_tokens)),
                do_sample=bool(kwargs.get("do_sample", False)) and temperature > 0,
                temperature=temperature if temperature > 0 else 0.6, top_p=float(kwargs.get("top_p", 0.95) or 0.95),
                top_k=int(kwargs.get("top_k", 0) or 0), batch_size=self.batch_size, progress=not disable_tqdm)
            for i, answers in zip(idx, results):
                text = answers[0].prediction
                for stop in until:
                    if stop and stop in text:
                        text = text[:text.index(stop)]
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    # ------------------------------------------------------------------ likelihoods
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """log p(continuation) under the final agent, given its prompt after the system's rounds on the context
        (both backends: the decoder scores where its latents are, through the runner's scoring step)."""
        rc = RecursionConfig(method=self.method, num_recursive_rounds=self.rounds, latent_steps=self.latent_steps,
                             decode=DecodeConfig(max_new_tokens=1))
        out: list[tuple[float, bool]] = []
        for k in range(0, len(requests), self.batch_size):
            batch = requests[k:k + self.batch_size]
            results = self.system.run([r.args[0] for r in batch], [self.task] * len(batch), rc,
                                      targets=[r.args[1] for r in batch], score_continuation=True)
            for req, res in zip(batch, results):
                score = (res.target_logprob, res.target_greedy)
                out.append(score)
                self.cache_hook.add_partial("loglikelihood", req.args, score)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Not defined for a multi-agent system."""
        raise NotImplementedError("recmas_ray: loglikelihood_rolling (perplexity tasks) is not defined for a "
                                  "multi-agent system: the final agent's prompt carries latents from the other "
                                  "agents, so a document has no rolling likelihood; use generate_until or "
                                  "loglikelihood tasks")


def check_cli_model_args(argv: list[str]) -> None:
    """When `argv` is an lm-eval command line for `--model recmas_ray`, check its --model_args now (before
    lm-eval indexes its tasks, which takes tens of seconds); a bad one exits 2 with one line on stderr."""
    model, raw = None, []
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            model = argv[i + 1]
        elif arg.startswith("--model="):
            model = arg.split("=", 1)[1]
        elif arg in ("--model_args", "-a"):
            raw += [a for a in _values_after(argv, i)]
        elif arg.startswith("--model_args="):
            raw.append(arg.split("=", 1)[1])
    if model != MODEL_NAME:
        return
    from lm_eval.utils import simple_parse_args_string  # lazy: optional dependency

    values: dict = {}
    for chunk in raw:
        values |= simple_parse_args_string(chunk)
    try:
        check_model_args(values)
    except ValueError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None


def _values_after(argv: list[str], i: int) -> list[str]:
    out = []
    for arg in argv[i + 1:]:
        if arg.startswith("-"):
            break
        out.append(arg)
    return out


def main(argv=None) -> None:
    """lm-eval's own command line, with `--model recmas_ray` registered and its model_args checked first."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(model_args_help() + "\n")
    else:
        check_cli_model_args(argv)
    from lm_eval.__main__ import cli_evaluate  # lazy: optional dependency

    sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
