"""Performance figures of issues 9 and 23, each a ratio measured within one run (median of repetitions).

  (a) end to end: RecursiveMAS vs Recursive-TextMAS at R = 1, 2, 3 -> speedup and token reduction
  (b) latent rollout: static KV cache vs the growing (DynamicCache) one vs the release's full re-run
      per step, at m = 16, 32, 64, with the largest latent difference between them
  (c) backend: Ray actors vs in-process, same agents and batch (one batch and several in flight)
  (d) one latent step vs one decoded token per model, against Proposition 3.1's FLOP ratio
  (e) prompt-prefix KV reuse over R rounds: prompt tokens prefilled per round with and without it,
      seconds per batch, predictions compared
  (f) decode: static cache + EOS checked every k tokens vs the growing cache checked every token
  (g) torch.compile of the one-position step vs eager (optional: minutes of compilation on CPU)

The same agents and questions serve every figure. Nothing here asserts a number: the JSON records
what was measured, on which machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import statistics
import time

import ray
import torch

from recmas_ray.engine.agent import _eos_ids
from recmas_ray.config.engine import EngineConfig
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.engine.kv_cache import PrefixStore
from jobs.bench.perf_config import BenchConfig
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.engine.runner import run_batch
from recmas_ray.distributed.launch import start_agents
from recmas_ray.styles import build_schedule
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system


def _median_time(fn, repeats: int, warmup: bool = True) -> float:
    if warmup:  # first calls pay allocator and kernel set-up
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine() -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "load_average_before": list(os.getloadavg())}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def end_to_end(pool, plan, questions, cfg: BenchConfig) -> list[dict]:
    """(a): seconds per sample and generated tokens, both methods, each R."""
    rows = []
    decode = DecodeConfig(max_new_tokens=cfg.max_new_tokens)
    for r in cfg.rounds:
        entry = {"rounds": r}
        for method in ("recursive_mas", "recursive_textmas"):
            rc = RecursionConfig(method=method, num_recursive_rounds=r, latent_steps=cfg.latent_steps, decode=decode)
            out = {}
            secs = _median_time(lambda: out.update(res=run_batch(pool, plan.style, questions, ["math"] * len(questions), rc)),
                                cfg.repeats, warmup=r == cfg.rounds[0])
            entry[method] = {"seconds_per_sample": secs / len(questions),
                             "tokens_per_sample": statistics.mean(x.num_text_tokens for x in out["res"])}
        mas, text = entry["recursive_mas"], entry["recursive_textmas"]
        entry["speedup"] = text["seconds_per_sample"] / mas["seconds_per_sample"]
        entry["token_reduction"] = 1 - mas["tokens_per_sample"] / text["tokens_per_sample"]
        rows.append(entry)
    return rows


@contextlib.contextmanager
def engine(agents, **fields):
    """Every agent runs with these EngineConfig fields and an empty prefix store; restored after. Continuous
    batching is off unless asked for: these figures time one call's engine (cache kind, prefix reuse, syncs)."""
    fields.setdefault("continuous_batching", False)
    saved = [(a, a.engine, a.prefix_store) for a in agents]
    for a in agents:
        a.engine = dataclasses.replace(a.engine, **fields)
        a.prefix_store = PrefixStore(int(a.engine.prefix_cache_mib * 2**20))
    try:
        yield
    finally:
        for a, eng, store in saved:
            a.engine, a.prefix_store = eng, store


def _interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds of each callable, run in turns (one warm-up each) so load drifts hit all alike."""
    times = {k: [] for k in fns}
    for k, fn in fns.items():
        fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            times[k].append(_median_time(fn, 1, warmup=False))
    return {k: statistics.median(v) for k, v in times.items()}


def rollout_cache(agent, questions, cfg: BenchConfig) -> list[dict]:
    """(b): static-cache rollout vs the growing cache vs the full re-run of the prefix at every step."""
    e, mask = agent.embed_batch(questions)
    rows = []
    for m in cfg.rollout_steps:
        out = {}

        def run(key, use_cache=True, **fields):
            def fn():
                with engine([agent], prefix_cache_mib=0, **fields):
                    out[key] = agent.latent_rollout(e, mask, m, use_cache=use_cache)
            return fn

        t = _interleaved({"static": run("static"), "growing": run("growing", static_cache=False),
                          "full": run("full", use_cache=False)}, cfg.repeats)
        rows.append({"latent_steps": m, "static_s": t["static"], "growing_cache_s": t["growing"],
                     "full_rerun_s": t["full"], "speedup": t["full"] / t["static"],
                     "growing_speedup": t["full"] / t["growing"], "static_over_growing": t["growing"] / t["static"],
                     "max_abs_diff_vs_full": float((out["static"] - out["full"]).abs().max()),
                     "max_abs_diff_vs_growing": float((out["static"] - out["growing"]).abs().max())})
    return rows


def _record_prefills(agents: dict) -> tuple[list, callable]:
    """Log (role, call, last_prefill) after each rollout/decode of these agents; returns (log, undo)."""
    log = []
    for role, agent in agents.items():
        for name in ("latent_rollout", "decode"):
            def wrapped(*a, _orig=getattr(agent, name), _role=role, _name=name, _agent=agent, **k):
                out = _orig(*a, **k)
                log.append((_role, _name, dict(_agent.last_prefill)))
                return out
            setattr(agent, name, wrapped)

    def undo():
        for agent in agents.values():
            for name in ("latent_rollout", "decode"):
                delattr(agent, name)
    return log, undo


def prefix_reuse(pool, plan, questions, cfg: BenchConfig) -> dict:
    """(e): R rounds of recursive_mas with and without prompt-prefix KV reuse (fresh stores each run)."""
    R = max(cfg.rounds)
    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=R, latent_steps=cfg.latent_steps,
                         decode=DecodeConfig(max_new_tokens=cfg.max_new_tokens))
    agents = {r: svc.agent for r, svc in pool.services.items()}
    tasks = ["math"] * len(questions)
    step_rounds = []  # the round of each rollout/decode call, in the order the runner makes them
    for step in build_schedule(plan.style, R):
        step_rounds += [step.round] * (int(step.decode or step.discard_decode) + int(bool(step.outputs)))
    out = {"rounds": R}
    for label, mib in (("reuse", EngineConfig().prefix_cache_mib), ("no_reuse", 0)):
        per_round = {r: {"tokens_prefilled": 0, "tokens_reused": 0} for r in range(1, R + 1)}
        secs = []
        for rep in range(max(cfg.repeats, 1)):
            with engine(agents.values(), prefix_cache_mib=mib):
                log, undo = _record_prefills(agents)
                try:
                    t0 = time.perf_counter()
                    res = run_batch(pool, plan.style, questions, tasks, rc)
                    secs.append(time.perf_counter() - t0)
                finally:
                    undo()
            if rep == 0:
                for r, (_, _, counts) in zip(step_rounds, log):
                    for k in per_round[r]:
                        per_round[r][k] += counts.get(k, 0)
                predictions = [x.prediction for x in res]
        out[label] = {"seconds_per_batch": statistics.median(secs), "per_round": [
            {"round": r, **c} for r, c in per_round.items()], "predictions": predictions}
    out["same_predictions"] = out["reuse"]["predictions"] == out["no_reuse"]["predictions"]
    out["speedup"] = out["no_reuse"]["seconds_per_batch"] / out["reuse"]["seconds_per_batch"]
    return out


def decode_paths(agent, questions, cfg: BenchConfig) -> dict:
    """(f): seconds per decoded token, static cache + EOS read every k tokens vs the growing cache + every token."""
    e, mask = agent.embed_batch(questions)
    n = max(cfg.max_new_tokens, 8)
    got = {}
    with engine([agent], prefix_cache_mib=0):  # greedy, unforced: texts must match
        got["static"] = agent.decode(e, mask, DecodeConfig(max_new_tokens=n))
    with engine([agent], static_cache=False):
        got["growing"] = agent.decode(e, mask, DecodeConfig(max_new_tokens=n))
    with _ban_eos(agent):
        force = DecodeConfig(max_new_tokens=n)

        def run(**fields):
            def fn():
                with engine([agent], prefix_cache_mib=0, **fields):
                    agent.decode(e, mask, force)
            return fn
        t = _interleaved({"static": run(), "growing": run(static_cache=False)}, cfg.repeats)
    return {"tokens": n, "sync_every": EngineConfig().decode_sync_every, "static_s_per_token": t["static"] / n,
            "growing_s_per_token": t["growing"] / n, "speedup": t["growing"] / t["static"],
            "same_greedy_text": got["static"] == got["growing"]}


def compile_step(agent, questions, cfg: BenchConfig) -> dict:
    """(g): latent rollout with the one-position step compiled vs eager (first call, with compilation, apart)."""
    e, mask = agent.embed_batch(questions)
    m = max(cfg.rollout_steps)
    out = {}

    def run(key, compiled):
        def fn():
            with engine([agent], prefix_cache_mib=0, compile_step=compiled):
                out[key] = agent.latent_rollout(e, mask, m)
        return fn

    t0 = time.perf_counter()
    run("compiled", True)()
    first = time.perf_counter() - t0
    t = _interleaved({"compiled": run("compiled", True), "eager": run("eager", False)}, cfg.repeats)
    return {"latent_steps": m, "first_call_s": first, "compiled_s": t["compiled"], "eager_s": t["eager"],
            "speedup": t["eager"] / t["compiled"], "max_abs_diff": float((out["compiled"] - out["eager"]).abs().max())}


@contextlib.contextmanager
def _ban_eos(agent):
    """EOS logits pushed down so every sample decodes its whole budget (timing, not text, is measured)."""
    head = agent.model.get_output_embeddings()
    bias = torch.zeros(head.out_features, device=agent.device, dtype=agent.dtype)
    bias[_eos_ids(agent.model, agent.tokenizer).to(agent.device)] = -1e4
    hook = head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        yield
    finally:
        hook.remove()


def step_cost(agent, questions, cfg: BenchConfig) -> dict:
    """(d): time of one latent step vs one decoded token (incremental, cached), and the FLOP prediction."""
    e, mask = agent.embed_batch(questions)
    n = 32
    prefill = _median_time(lambda: agent.latent_rollout(e, mask, 1), cfg.repeats)
    latent = (_median_time(lambda: agent.latent_rollout(e, mask, n + 1), cfg.repeats) - prefill) / n
    dec_cfg = DecodeConfig(max_new_tokens=1)
    dec_prefill = _median_time(lambda: agent.decode(e, mask, dec_cfg), cfg.repeats)
    force = DecodeConfig(max_new_tokens=n + 1)
    with _ban_eos(agent):
        token = (_median_time(lambda: agent.decode(e, mask, force), cfg.repeats) - dec_prefill) / n
    d = agent.hidden_size
    head = agent.model.get_output_embeddings()
    vocab = head.out_features
    body = sum(p.numel() for n_, p in agent.model.named_parameters() if "embed" not in n_ and "lm_head" not in n_)
    # FLOPs per position (2 per multiply-add): decoder body, then either the inner link (two d x d)
    # or the vocabulary projection (|V| x d); attention over the context is the same for both.
    predicted = (2 * body + 2 * 2 * d * d) / (2 * body + 2 * vocab * d)
    return {"model": agent.model_name, "hidden_size": d, "vocab_size": vocab, "latent_step_s": latent,
            "decoded_token_s": token, "measured_ratio": latent / token, "predicted_ratio_prop31": predicted}


def backend_ratio(plan, questions, cfg: BenchConfig, pool) -> dict:
    """(c): seconds per batch on Ray actors vs in-process, one batch and three batches in flight."""
    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=max(cfg.rounds), latent_steps=cfg.latent_steps,
                         decode=DecodeConfig(max_new_tokens=cfg.max_new_tokens))
    tasks = ["math"] * len(questions)
    system = start_agents(plan, backend="ray", timeout_s=600.0,
                          placement=PlacementConfig(preset="cpu" if cfg.system.device != "cuda" else "colocated"))
    try:
        local = _median_time(lambda: run_batch(pool, plan.style, questions, tasks, rc), cfg.repeats)
        one = _median_time(lambda: ray.get(system.solve(questions, tasks, rc), timeout=3600), cfg.repeats)
        three = _median_time(lambda: ray.get([system.solve(questions, tasks, rc) for _ in range(3)], timeout=3600),
                             cfg.repeats) / 3
    finally:
        system.shutdown()
    return {"local_s_per_batch": local, "ray_s_per_batch": one, "ray_s_per_batch_3_in_flight": three,
            "ray_over_local": one / local, "ray_3_in_flight_over_local": three / local}


def run_bench(cfg: BenchConfig, questions: list[str], on_figure=None) -> dict:
    """The figures named in `cfg.figures` on one set of agents and questions; `on_figure(result)` after each
    (the job writes bench.json then, so a long run keeps what it finished)."""
    plan = plan_system(cfg.system)
    pool = local_pool(plan)
    out = {"machine": machine(), "config": dataclasses.asdict(cfg), "role_models": plan.role_models}
    decoder = pool.services[plan.style.decoder].agent
    figures = {
        "a": ("a_end_to_end", lambda: end_to_end(pool, plan, questions, cfg)),
        "b": ("b_rollout_cache", lambda: rollout_cache(decoder, questions, cfg)),
        "d": ("d_step_cost", lambda: [{"role": role, **step_cost(pool.services[role].agent, questions, cfg)}
                                      for role in _one_role_per_model(plan)]),
        "e": ("e_prefix_reuse", lambda: prefix_reuse(pool, plan, questions, cfg)),
        "f": ("f_decode", lambda: decode_paths(decoder, questions, cfg)),
        "g": ("g_compile", lambda: compile_step(decoder, questions, cfg)),
        "c": ("c_backend", lambda: backend_ratio(plan, questions, cfg, pool)),
    }
    for name, (key, measure) in figures.items():
        if name in cfg.figures and (name != "c" or cfg.ray):
            out[key] = measure()
            out["machine"]["load_average_after"] = list(os.getloadavg())
            if on_figure is not None:
                on_figure(out)
    return out


def _one_role_per_model(plan) -> list[str]:
    seen, roles = set(), []
    for role in plan.style.roles:
        if plan.role_models[role] not in seen:
            seen.add(plan.role_models[role])
            roles.append(role)
    return roles


def plot_bench(result: dict, path) -> None:
    """PNG with one panel per measured figure among (a), (b), (d), (e), (f)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib loads only when a plot is drawn
    from matplotlib.figure import Figure  # lazy: matplotlib loads only when a plot is drawn

    panels = [k for k in ("a_end_to_end", "b_rollout_cache", "d_step_cost", "e_prefix_reuse", "f_decode") if k in result]
    fig = Figure(figsize=(4.4 * max(len(panels), 1), 3.6))
    for i, key in enumerate(panels):
        ax = fig.add_subplot(1, max(len(panels), 1), i + 1)
        _PANELS[key](ax, result[key])
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(str(path))


def _panel_a(ax, a):
    ax.plot([r["rounds"] for r in a], [r["speedup"] for r in a], "o-", label="speedup (x)")
    ax.plot([r["rounds"] for r in a], [r["token_reduction"] for r in a], "s-", label="token reduction")
    ax.set_xlabel("recursion rounds R"), ax.set_title("(a) RecursiveMAS vs Recursive-TextMAS"), ax.legend()


def _panel_b(ax, b):
    ms = [r["latent_steps"] for r in b]
    ax.plot(ms, [r["speedup"] for r in b], "o-", label="static cache")
    ax.plot(ms, [r["growing_speedup"] for r in b], "s-", label="growing cache")
    ax.axhline(10, ls=":", c="grey", label="target 10x at m = 64")
    ax.set_xlabel("latent steps m"), ax.set_ylabel("x faster than full re-run")
    ax.set_title("(b) latent rollout"), ax.legend(fontsize=7)


def _panel_d(ax, d):
    xs = range(len(d))
    ax.bar([x - 0.2 for x in xs], [r["measured_ratio"] for r in d], 0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], [r["predicted_ratio_prop31"] for r in d], 0.4, label="Prop. 3.1")
    ax.set_xticks(list(xs)), ax.set_xticklabels([r["model"].split(":")[-1] for r in d], fontsize=7)
    ax.set_title("(d) latent step / decoded token"), ax.legend()


def _panel_e(ax, e):
    rounds = [r["round"] for r in e["reuse"]["per_round"]]
    ax.bar([r - 0.2 for r in rounds], [r["tokens_prefilled"] for r in e["no_reuse"]["per_round"]], 0.4,
           label="without reuse")
    ax.bar([r + 0.2 for r in rounds], [r["tokens_prefilled"] for r in e["reuse"]["per_round"]], 0.4,
           label="prefix KV reuse")
    ax.set_xticks(rounds), ax.set_xlabel("round"), ax.set_ylabel("prompt tokens prefilled")
    ax.set_title(f"(e) prefix reuse ({e['speedup']:.2f}x per batch)"), ax.legend(fontsize=7)


def _panel_f(ax, f):
    ax.bar([0, 1], [1e3 * f["growing_s_per_token"], 1e3 * f["static_s_per_token"]])
    ax.set_xticks([0, 1]), ax.set_xticklabels(["growing cache,\nsync each token", f"static cache,\nsync every {f['sync_every']}"])
    ax.set_ylabel("ms per decoded token (batch)"), ax.set_title("(f) decode loop")


_PANELS = {"a_end_to_end": _panel_a, "b_rollout_cache": _panel_b, "d_step_cost": _panel_d,
           "e_prefix_reuse": _panel_e, "f_decode": _panel_f}
