"""lm-evaluation-harness backend: a RecursiveMAS system as lm-eval model `recmas_ray`.

    lm_eval --model recmas_ray --tasks gsm8k --output_path results --log_samples \
        --model_args style=sequential_light,role_models=planner:tiny:qwen3|critic:tiny:llama,backend=local

lm-eval 0.4.13 discovers no plug-in entry points; the installed startup hook (`recmas_ray/_lmeval_hook.py`)
registers this class under `recmas_ray` lazily, so lm-eval's own `lm_eval` command and
`lm_eval.simple_evaluate(model="recmas_ray")` find it. `python -m recmas_ray.lmeval` (or `recmas-lm-eval`)
is the same command line with this module imported explicitly (for environments with the hook off).

model_args (comma-separated KEY=VALUE, lm-eval's format):
  style           collaboration style (required)
  role_models     ROLE:MODEL items joined by `|`, split at the first `:` (planner:tiny:qwen3|solver:org/model)
  links           a folder of per-role link folders or a Hub id ORG/NAME[@REV][:SUB]
  ckpt_override   ROLE:DIR items joined by `|` (DIR may be a Hub id)
  preset, backend (ray|local), dtype, seed, task (task type of the prompts: math, choice, code, qa),
  method, num_recursive_rounds, latent_steps, max_new_tokens (when a request names no max_gen_toks)
  lm-eval's own --device (cuda, cuda:N, cpu; cpu with a warning when torch sees no GPU) and --batch_size
  (questions per agent call; "auto" means 8) apply as well.

Requests:
  generate_until         each context is a question to the whole system; the final agent's text is cut at
                         the first `until` string
  loglikelihood          log p(continuation | the final agent's prompt with its incoming latents or texts),
                         after the other agents ran the usual rounds on the context (backend local)
  loglikelihood_rolling  NotImplementedError: a latent-augmented prompt has no rolling document likelihood
"""

from __future__ import annotations

import logging
import sys
import time

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from recmas_ray.agent import Decoded, left_pad
from recmas_ray.api import System
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.runner import LocalPool, run_batch
from recmas_ray.styles import build_schedule

MODEL_NAME = "recmas_ray"
log = logging.getLogger(__name__)


def parse_pairs(text: str | None, *, what: str) -> dict[str, str]:
    """`ROLE:VALUE|ROLE:VALUE` -> {ROLE: VALUE}, split at the first ':' of each item."""
    out = {}
    for item in (t.strip() for t in str(text or "").split("|") if t.strip()):
        key, sep, value = item.partition(":")
        if not sep or not key.isidentifier() or not value:
            raise ValueError(f"model_args {what}: item {item!r} is not ROLE:VALUE (items joined by '|')")
        out[key] = value
    return out


@register_model(MODEL_NAME)
class RecMASLM(LM):
    """A RecursiveMAS system behind lm-eval's `LM` interface (see the module docstring for model_args).

    Example:
        >>> import lm_eval, recmas_ray.lmeval  # doctest: +SKIP
        >>> lm_eval.simple_evaluate(model="recmas_ray", tasks=["gsm8k"],
        ...                         model_args="style=sequential_light,backend=local")  # doctest: +SKIP
    """

    def __init__(self, style: str, *, role_models: str | None = None, links: str | None = None,
                 ckpt_override: str | None = None, preset: str = "tiny", backend: str = "ray", device: str = "auto",
                 dtype: str = "auto", seed: int = 42, task: str = "math", method: str = "recursive_mas",
                 num_recursive_rounds: int = 3, latent_steps: int = 32, max_new_tokens: int = 256,
                 batch_size: int | str | None = None, system: System | None = None, **lm_eval_extra):
        super().__init__()
        unknown = sorted(k for k in lm_eval_extra if k not in ("max_batch_size", "trust_remote_code"))
        if unknown:
            raise ValueError(f"recmas_ray model_args: unknown {unknown}; see `python -m recmas_ray.lmeval --help`")
        self.task, self.method = str(task), str(method)
        self.rounds, self.latent_steps, self.max_new_tokens = int(num_recursive_rounds), int(latent_steps), \
            int(max_new_tokens)
        self.batch_size = int(batch_size) if str(batch_size or "").isdigit() else 8
        device = str(device or "auto")
        if device.startswith("cuda") and not torch.cuda.is_available():  # lm-eval's default --device is cuda:0
            log.warning("recmas_ray: device %s requested but torch sees no CUDA device; using cpu", device)
            device = "cpu"
        device = "cuda" if device.startswith("cuda") else device
        self.system = system or System.build(
            str(style), role_models=parse_pairs(role_models, what="role_models"), links=links or None,
            ckpt_override=parse_pairs(ckpt_override, what="ckpt_override"), preset=str(preset), backend=str(backend),
            device=str(device), dtype=str(dtype), seed=int(seed), task=self.task)

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
                top_k=int(kwargs.get("top_k", 0) or 0), batch_size=self.batch_size)
            for i, res in zip(idx, results):
                text = res.prediction
                for stop in until:
                    if stop and stop in text:
                        text = text[:text.index(stop)]
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    # ------------------------------------------------------------------ likelihoods
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """log p(continuation) under the final agent, given its prompt after the system's rounds on the context."""
        pool = self.system.agents
        if not isinstance(pool, LocalPool):
            raise NotImplementedError("recmas_ray: loglikelihood scores inside the final agent, which needs "
                                      "model_args backend=local (generate_until works on both backends)")
        rc = RecursionConfig(method=self.method, num_recursive_rounds=self.rounds, latent_steps=self.latent_steps,
                             decode=DecodeConfig(max_new_tokens=1))
        out: list[tuple[float, bool]] = []
        for k in range(0, len(requests), self.batch_size):
            batch = requests[k:k + self.batch_size]
            scorer = _ScoringPool(pool, self.system.plan.style, rc, [r.args[1] for r in batch])
            run_batch(scorer, self.system.plan.style, [r.args[0] for r in batch], [self.task] * len(batch), rc)
            out += scorer.scores
            for req, score in zip(batch, scorer.scores):
                self.cache_hook.add_partial("loglikelihood", req.args, score)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Not defined for a multi-agent system."""
        raise NotImplementedError("recmas_ray: loglikelihood_rolling (perplexity tasks) is not defined for a "
                                  "multi-agent system: the final agent's prompt carries latents from the other "
                                  "agents, so a document has no rolling likelihood; use generate_until or "
                                  "loglikelihood tasks")


class _ScoringPool:
    """The local agents, except that the final decode of the decoder scores continuations instead.

    Every earlier call (rollouts, intermediate text steps of text methods) runs unchanged, so the decoder
    sees exactly the prompt, latents or texts it would decode from.
    """

    def __init__(self, pool: LocalPool, style, rc: RecursionConfig, continuations: list[str]):
        self.pool, self.decoder, self.continuations = pool, style.decoder, continuations
        if rc.method == "single_agent":
            self.remaining = 1
        else:
            rounds = 1 if rc.method == "textmas" else rc.num_recursive_rounds
            steps = [s for s in build_schedule(style, rounds, decode_every_round=rc.decode_every_round)
                     if s.role == style.decoder]
            self.remaining = len(steps) if rc.method != "recursive_mas" else \
                sum(1 for s in steps if s.decode or s.discard_decode)
        self.scores: list[tuple[float, bool]] = []

    def rollout(self, *args):
        return self.pool.rollout(*args)

    def get(self, handle, *, what):
        return handle

    def decode(self, role, users, slot_names, cfg, latents):
        if role != self.decoder:
            return self.pool.decode(role, users, slot_names, cfg, latents)
        self.remaining -= 1
        if self.remaining > 0:
            return self.pool.decode(role, users, slot_names, cfg, latents)
        t0 = time.perf_counter()
        self.scores = score_continuations(self.pool.services[role].agent, users, slot_names, latents,
                                          self.continuations)
        stats = {"role": role, "latent_steps": 0, "text_tokens": [0] * len(users),
                 "seconds": time.perf_counter() - t0}
        return [Decoded("", 0) for _ in users], stats


@torch.no_grad()
def score_continuations(agent, users, slot_names, latents, continuations) -> list[tuple[float, bool]]:
    """(sum log p, greedy?) of each continuation after its prompt (latent blocks spliced into their slots)."""
    rows, lengths = [], []
    for b, (user, cont) in enumerate(zip(users, continuations)):
        e_LD, _ = agent.embed_prompt(user, {s: lat[b] for s, lat in zip(slot_names, latents)})
        ids = agent.tokenizer(cont, add_special_tokens=False).input_ids
        if not ids:
            raise ValueError(f"loglikelihood: continuation {cont!r} has no tokens")
        rows.append(torch.cat([e_LD, agent._embed_ids(ids)], dim=0))
        lengths.append(ids)
    e_BLD, mask_BL = left_pad(rows)
    logp_BLV = torch.log_softmax(agent.logits(agent.forward_hidden(e_BLD, mask_BL)).float(), dim=-1)
    out = []
    for b, ids in enumerate(lengths):
        n = len(ids)
        lp_NV = logp_BLV[b, -n - 1:-1]  # left padded: every row ends at the right edge
        target = torch.tensor(ids, device=lp_NV.device)
        out.append((float(lp_NV.gather(1, target[:, None]).sum()), bool((lp_NV.argmax(-1) == target).all())))
    return out


def main(argv=None) -> None:
    """lm-eval's own command line, with `--model recmas_ray` registered."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
