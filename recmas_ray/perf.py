"""Performance figures of issue 9, each a ratio measured within one run (median of repetitions).

  (a) end to end: RecursiveMAS vs Recursive-TextMAS at R = 1, 2, 3 -> speedup and token reduction
  (b) latent rollout: KV-cached vs the release's full re-run per step, at m = 16, 32, 64
  (c) backend: Ray actors vs in-process, same agents and batch (one batch and several in flight)
  (d) one latent step vs one decoded token per model, against Proposition 3.1's FLOP ratio

The same agents and questions serve every figure. Nothing here asserts a number: the JSON records
what was measured, on which machine.
"""

from __future__ import annotations

import platform
import statistics
import time

import torch

from recmas_ray.config.perf import BenchConfig
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.config.recursion import RecursionConfig
from recmas_ray.runner import LocalPool, run_batch
from recmas_ray.service import AgentService
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
            "torch": torch.__version__, "threads": torch.get_num_threads()}
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


def rollout_cache(agent, questions, cfg: BenchConfig) -> list[dict]:
    """(b): KV-cached latent rollout vs full re-run of the prefix at every step."""
    e, mask = agent.embed_batch(questions)
    rows = []
    for m in cfg.rollout_steps:
        cached = _median_time(lambda: agent.latent_rollout(e, mask, m, use_cache=True), cfg.repeats)
        full = _median_time(lambda: agent.latent_rollout(e, mask, m, use_cache=False), cfg.repeats)
        rows.append({"latent_steps": m, "cached_s": cached, "full_rerun_s": full, "speedup": full / cached})
    return rows


def step_cost(agent, questions, cfg: BenchConfig) -> dict:
    """(d): time of one latent step vs one decoded token (incremental, cached), and the FLOP prediction."""
    e, mask = agent.embed_batch(questions)
    n = 32
    prefill = _median_time(lambda: agent.latent_rollout(e, mask, 1), cfg.repeats)
    latent = (_median_time(lambda: agent.latent_rollout(e, mask, n + 1), cfg.repeats) - prefill) / n
    dec_cfg = DecodeConfig(max_new_tokens=1)
    dec_prefill = _median_time(lambda: agent.decode(e, mask, dec_cfg), cfg.repeats)
    force = DecodeConfig(max_new_tokens=n + 1)
    eos = agent.tokenizer.eos_token_id
    # ban EOS so every sample decodes exactly n + 1 tokens (timing, not text, is measured)
    head = agent.model.get_output_embeddings()
    bias = torch.zeros(head.out_features, device=agent.device, dtype=agent.dtype)
    bias[eos] = -1e4
    hook = head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        token = (_median_time(lambda: agent.decode(e, mask, force), cfg.repeats) - dec_prefill) / n
    finally:
        hook.remove()
    d = agent.hidden_size
    vocab = head.out_features
    body = sum(p.numel() for n_, p in agent.model.named_parameters() if "embed" not in n_ and "lm_head" not in n_)
    # FLOPs per position (2 per multiply-add): decoder body, then either the inner link (two d x d)
    # or the vocabulary projection (|V| x d); attention over the context is the same for both.
    predicted = (2 * body + 2 * 2 * d * d) / (2 * body + 2 * vocab * d)
    return {"model": agent.model_name, "hidden_size": d, "vocab_size": vocab, "latent_step_s": latent,
            "decoded_token_s": token, "measured_ratio": latent / token, "predicted_ratio_prop31": predicted}


def backend_ratio(plan, questions, cfg: BenchConfig, pool) -> dict:
    """(c): seconds per batch on Ray actors vs in-process, one batch and three batches in flight."""
    import ray

    from recmas_ray.distributed.driver import build_ray_system, init_ray
    from recmas_ray.distributed.placement import PlacementConfig

    init_ray()
    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=max(cfg.rounds), latent_steps=cfg.latent_steps,
                         decode=DecodeConfig(max_new_tokens=cfg.max_new_tokens))
    tasks = ["math"] * len(questions)
    system = build_ray_system(plan, PlacementConfig(preset="cpu" if cfg.device != "cuda" else "colocated"))
    try:
        local = _median_time(lambda: run_batch(pool, plan.style, questions, tasks, rc), cfg.repeats)
        one = _median_time(lambda: ray.get(system.solve(questions, tasks, rc), timeout=3600), cfg.repeats)
        three = _median_time(lambda: ray.get([system.solve(questions, tasks, rc) for _ in range(3)], timeout=3600),
                             cfg.repeats) / 3
    finally:
        system.shutdown()
    return {"local_s_per_batch": local, "ray_s_per_batch": one, "ray_s_per_batch_3_in_flight": three,
            "ray_over_local": one / local, "ray_3_in_flight_over_local": three / local}


def run_bench(cfg: BenchConfig, questions: list[str]) -> dict:
    """All four figures on one set of agents and questions."""
    plan = plan_system(cfg.style, preset=cfg.preset, seed=cfg.seed, device=cfg.device, dtype=cfg.dtype,
                       role_model_overrides=cfg.role_model)
    pool = LocalPool({r: AgentService(*plan.service_args(r)) for r in plan.style.roles})
    out = {"machine": machine(), "config": {k: v for k, v in vars(cfg).items()}, "role_models": plan.role_models}
    out["a_end_to_end"] = end_to_end(pool, plan, questions, cfg)
    decoder = pool.services[plan.style.decoder].agent
    out["b_rollout_cache"] = rollout_cache(decoder, questions, cfg)
    seen, out["d_step_cost"] = set(), []
    for role, svc in pool.services.items():
        if plan.role_models[role] not in seen:
            seen.add(plan.role_models[role])
            out["d_step_cost"].append({"role": role, **step_cost(svc.agent, questions, cfg)})
    if cfg.ray:
        out["c_backend"] = backend_ratio(plan, questions, cfg, pool)
    return out


def plot_bench(result: dict, path) -> None:
    """PNG: (a) speedup and token reduction vs R, (b) cached vs full re-run, (d) measured vs predicted."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.6))
    ax = fig.add_subplot(1, 3, 1)
    a = result["a_end_to_end"]
    ax.plot([r["rounds"] for r in a], [r["speedup"] for r in a], "o-", label="speedup (x)")
    ax.plot([r["rounds"] for r in a], [r["token_reduction"] for r in a], "s-", label="token reduction")
    ax.set_xlabel("recursion rounds R"), ax.set_title("(a) RecursiveMAS vs Recursive-TextMAS"), ax.legend()
    ax = fig.add_subplot(1, 3, 2)
    b = result["b_rollout_cache"]
    ax.plot([r["latent_steps"] for r in b], [r["cached_s"] for r in b], "o-", label="KV cache")
    ax.plot([r["latent_steps"] for r in b], [r["full_rerun_s"] for r in b], "s-", label="full re-run")
    ax.set_xlabel("latent steps m"), ax.set_ylabel("seconds"), ax.set_title("(b) latent rollout"), ax.legend()
    ax = fig.add_subplot(1, 3, 3)
    d = result["d_step_cost"]
    xs = range(len(d))
    ax.bar([x - 0.2 for x in xs], [r["measured_ratio"] for r in d], 0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], [r["predicted_ratio_prop31"] for r in d], 0.4, label="Prop. 3.1")
    ax.set_xticks(list(xs)), ax.set_xticklabels([r["model"].split(":")[-1] for r in d], fontsize=7)
    ax.set_title("(d) latent step / decoded token"), ax.legend()
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(str(path))
