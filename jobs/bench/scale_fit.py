"""The scaling model's cost table, fitted from measured times of real agents (not a tabulated guess).

Measures, through the `Agent` API the agent actors run (`embed_batch`, `latent_rollout`, `decode`), each
model's call costs at several row counts B, interleaving the repetitions (every row count once per pass)
and recording the load average. On a CPU the times are the process's CPU time by default (`--clock cpu`: on a
shared host wall time counts other users' work), on a GPU wall time:

    prefill_ms(B)        embed + the prompt's forward: a 1-step rollout minus one latent step
    latent_step_ms(B)    (rollout of N+1 steps - rollout of 1 step) / N
    decoded_token_ms(B)  (decode of N+1 tokens - decode of 1 token) / N, EOS banned (timing, not text)

then fits each by least squares to a + b x B (medians over repetitions; the spread is kept) and turns the
fit into `models.sim` parameters (`sim_params`: step_ms = a + b at one row, row_share = b / (a + b), ...),
so `jobs.bench.scale_model` prices calls by measured costs. The fit, its data, the machine, the load and
the library versions go into one JSON (docs/scale_costs.json by default).

    python -m jobs.bench.scale_fit                                   # SmolLM2-135M and Gemma-3-270M here
    python -m jobs.bench.scale_fit --from_json out/gpu_check/gpu_check.json --output_path out/fit_gpu
                                                                     # fit a GPU's measurements (no models run)

`jobs/gpu_check.sh` runs `measure_agent` on random-weight models of the same shapes (`DEMO_SHAPES`) on a GPU.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Annotated

import torch

from jobs.bench.perf import _ban_eos
from recmas_ray.engine.agent import Agent
from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.config.tree import save_config
from recmas_ray.engine.links import InnerLink
from recmas_ray.models.loader import load_frozen_model
from recmas_ray.models.registry import GEMMA3_270M, SIMULATED, SMOLLM2_135M

QUANTITIES = ("prefill_ms", "latent_step_ms", "decoded_token_ms")
DEMO_MODELS = (SMOLLM2_135M, GEMMA3_270M)
# The demo models' shapes (their converted config.json, recmas_ray/models/packaged.py; offline.md section 2.1):
# a GPU machine reaches no hub and holds no packaged model, so gpu_check.sh times random weights of these shapes.
DEMO_SHAPES = {
    SMOLLM2_135M: {"family": "llama", "hidden_size": 576, "intermediate_size": 1536,
                   "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                   "vocab_size": 49152, "tie_word_embeddings": True},
    GEMMA3_270M: {"family": "gemma3", "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
                  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
                  "sliding_window": 512, "tie_word_embeddings": True},
}
PROMPT = "Question {i}: a farmer has {i} rows of 7 apple trees and sells 3 trees. How many trees are left?"


@dataclass(kw_only=True)
class FitConfig:
    """What the cost-table fit measures (see the module docstring)."""

    models: Annotated[list[str], NonEmpty()] = field(default_factory=lambda: list(DEMO_MODELS))
    """Models to time (packaged real models by default; tiny:FAMILY for a quick check)."""
    rows: Annotated[list[int], Range(1, 4096), NonEmpty()] = field(default_factory=lambda: [1, 2, 4])
    """Row counts (questions per call) to time; at least two distinct ones for a fit."""
    repeats: Annotated[int, Range(1, 100)] = 3
    """Interleaved passes over the row counts; medians and spread are reported."""
    steps: Annotated[int, Range(1, 4096)] = 16
    """N latent steps / decoded tokens per timed call (the per-step time is a difference of two calls)."""
    dtype: str = "float32"
    """The models' dtype (float32: as the demo agents run on CPU)."""
    clock: Annotated[str, OneOf(CLOCKS)] = "cpu"
    """What a time is: this process's CPU time (cpu: on a shared host, so other users' work is not counted; the
    real-agent check, jobs.bench.scale_real, counts its agents' CPU time alike) or wall time (wall: a GPU)."""
    torch_threads: Annotated[int, Range(0, 1024)] = 1
    """torch threads (1: as each agent actor runs, `start_agents(torch_threads=1)`; 0: torch's default)."""
    from_json: str | None = None
    """Fit these measurements instead of running models: a JSON of this job or of jobs/gpu_check.sh."""
    output_path: Annotated[str, WritableDir()] = "docs"
    """Where scale_costs.json and its config (scale_costs.config.json) go."""


CLOCKS = ("cpu", "wall")


def _timed(fn, clock: str = "wall") -> float:
    """ms of fn(): wall time (a GPU's, synchronised), or this process's CPU time (on a shared host the wall
    time counts other users' work; with one torch thread the CPU time is the call's compute and host work)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    t0 = now()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (now() - t0) * 1e3


def measure_agent(agent, rows_list: list[int], *, repeats: int, steps: int, clock: str = "wall", log=print) -> dict:
    """One agent's prefill / latent step / decoded token times (ms) at each row count, passes interleaved
    (each pass times every row count once, in alternating order) by `clock` (`_timed`). Returns {"points": [{rows, prompt_tokens,
    <quantity>: median, <quantity>_samples: [...]}], "loadavg_1_5_15_before"/"after"}."""
    one, many = DecodeConfig(max_new_tokens=1), DecodeConfig(max_new_tokens=steps + 1)
    inputs = {b: agent.embed_batch([PROMPT.format(i=i) for i in range(b)]) for b in rows_list}
    samples = {b: {q: [] for q in QUANTITIES} for b in rows_list}
    load0 = list(os.getloadavg())
    with torch.no_grad(), _ban_eos(agent):
        for b in rows_list:  # warm-up: allocator and kernels, once per shape
            agent.latent_rollout(*inputs[b], 1)
            agent.decode(*inputs[b], one)
        for rep in range(repeats):
            for b in (rows_list if rep % 2 == 0 else rows_list[::-1]):
                users = [PROMPT.format(i=i) for i in range(b)]
                r1 = _timed(lambda: agent.latent_rollout(*agent.embed_batch(users), 1), clock)
                rn = _timed(lambda: agent.latent_rollout(*agent.embed_batch(users), steps + 1), clock)
                d1 = _timed(lambda: agent.decode(*agent.embed_batch(users), one), clock)
                dn = _timed(lambda: agent.decode(*agent.embed_batch(users), many), clock)
                step = (rn - r1) / steps
                s = samples[b]
                s["latent_step_ms"].append(step)
                s["prefill_ms"].append(r1 - step)
                s["decoded_token_ms"].append((dn - d1) / steps)
            log(f"  {agent.model_name}: pass {rep + 1}/{repeats} done (load {os.getloadavg()[0]:.2f})")
    points = []
    for b in rows_list:
        point = {"rows": b, "prompt_tokens": int(inputs[b][0].shape[1])}
        for q in QUANTITIES:
            point[q] = statistics.median(samples[b][q])
            point[f"{q}_samples"] = [round(x, 4) for x in samples[b][q]]
        points.append(point)
    return {"model": agent.model_name, "steps": steps, "repeats": repeats, "clock": clock, "points": points,
            "loadavg_1_5_15_before": load0, "loadavg_1_5_15_after": list(os.getloadavg())}


def fit_line(xs: list[float], ys: list[float]) -> dict:
    """Least squares y = a + b x; with r2 and the largest relative residual."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError(f"a line needs at least two distinct x values; got {xs}")
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    ss = sum((y - my) ** 2 for y in ys)
    res = [y - (a + b * x) for x, y in zip(xs, ys)]
    return {"a": a, "b": b, "r2": 1 - sum(r * r for r in res) / ss if ss else 1.0,
            "max_rel_residual": max(abs(r) / max(abs(y), 1e-12) for r, y in zip(res, ys))}


def fit_model(measured: dict) -> dict:
    """Fit of one model's `measure_agent` output: a + b x rows per quantity, and the `models.sim` parameters
    it gives (a fixed cost and a per-row share, clamped at 0: a negative slope is noise)."""
    pts = sorted(measured["points"], key=lambda p: p["rows"])
    rows = [p["rows"] for p in pts]
    lines = {q: fit_line(rows, [p[q] for p in pts]) for q in QUANTITIES}
    prompt = statistics.median(p["prompt_tokens"] for p in pts)

    def at_one(q):  # cost at one row and the share of it each further row adds; a falling line is noise
        if lines[q]["b"] < 0:  # (a cost cannot fall as rows grow): the flat line through the mean
            return max(statistics.mean(p[q] for p in pts), 1e-6), 0.0
        one = max(lines[q]["a"] + lines[q]["b"], 1e-6)
        return one, lines[q]["b"] / one

    step_ms, step_share = at_one("latent_step_ms")
    token_ms, token_share = at_one("decoded_token_ms")
    pre = lines["prefill_ms"]
    pre_a, pre_b = (pre["a"], pre["b"]) if pre["b"] >= 0 else (statistics.mean(p["prefill_ms"] for p in pts), 0.0)
    params = {"step_ms": step_ms, "row_share": step_share, "token_ms": token_ms, "token_row_share": token_share,
              "prefill_ms": max(0.0, pre_a), "prompt_tokens": int(prompt),
              "prefill_token_ms": max(0.0, pre_b) / max(prompt, 1)}
    return {"model": measured["model"], "lines": lines, "sim_params": params}


def fit_all(measurements: list[dict]) -> dict[str, dict]:
    return {m["model"]: fit_model(m) for m in measurements}


def load_measurements(path: str) -> list[dict]:
    """`measure_agent` outputs from this job's JSON ("measurements") or gpu_check.sh's (its costs step)."""
    with open(path) as f:
        data = json.load(f)
    if "measurements" in data:
        return data["measurements"]
    costs = ((data.get("steps") or {}).get("costs") or {}).get("result") or {}
    if costs.get("measurements"):
        return costs["measurements"]
    raise ValueError(f"--from_json {path}: no measurements (expected this job's JSON or gpu_check.json with a "
                     "finished costs step)")


def load_fit(path: str) -> dict[str, dict]:
    """{model: fit} from a JSON this job wrote (or gpu_check.json, fitted now)."""
    with open(path) as f:
        data = json.load(f)
    return data["fit"] if "fit" in data else fit_all(load_measurements(path))


def fitted_sim_name(fit: dict, *, hidden: int, tokens: int, eos_spread: float = 0.0) -> str:
    """A `sim:` model name priced by a fit (`fit_model`'s output)."""
    p = fit["sim_params"]
    items = {"hidden": hidden, "tokens": tokens, "eos_spread": eos_spread, **p}
    return SIMULATED.name(",".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in items.items()))


def _load_agent(name: str, dtype: str):
    model, tok = load_frozen_model(name, dtype=getattr(torch, dtype))
    hidden = model.get_input_embeddings().weight.shape[1]
    return Agent(model, tok, InnerLink(hidden), role="planner", model_name=name)


def versions() -> dict:
    return {k: version(k) for k in ("torch", "transformers", "ray")} | {"python": platform.python_version()}


def run(cfg: FitConfig) -> int:
    if len(set(cfg.rows)) < 2 and not cfg.from_json:
        raise ValueError(f"--rows {cfg.rows}: expected at least two distinct row counts (a line needs two)")

    save_config(cfg, cfg.output_path, "scale_costs.config.json")
    if cfg.from_json:
        measurements, source = load_measurements(cfg.from_json), {"from_json": cfg.from_json}
    else:
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        measurements, source = [], {"machine": platform.platform(), "cpu_count": os.cpu_count(),
                                    "torch_threads": torch.get_num_threads(), "dtype": cfg.dtype}
        for name in cfg.models:
            print(f"timing {name} at rows {cfg.rows}", flush=True)
            measurements.append(measure_agent(_load_agent(name, cfg.dtype), list(cfg.rows), repeats=cfg.repeats,
                                              steps=cfg.steps, clock=cfg.clock))
    fit = fit_all(measurements)
    out = {"source": source, "versions": versions(), "fit": fit, "measurements": measurements,
           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    path = os.path.join(cfg.output_path, "scale_costs.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    for name, f_ in fit.items():
        print(name, json.dumps({q: {k: round(v, 4) for k, v in line.items()} for q, line in f_["lines"].items()}))
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    return run_job(run, FitConfig, argv, prog="python -m jobs.bench.scale_fit", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
