"""Per-role pools vs whole-system replicas with REAL agents (SmolLM2-135M, Gemma-3-270M), beside the
scaling model's prediction from the fitted cost table: a check of the model that is not the model's own table.

    docs/scale_costs.json (jobs.bench.scale_fit: measured call costs of each demo model vs rows)
        |                                   |
        | pool sizes (pool_sizing)          | sim: parameters per role (scale_fit.fitted_sim_name)
        v                                   v
    Ray: the same number of agent actors    scale_model.model_run: the same layouts, batches, depth;
    as whole systems and as per-role        all agents share this host's cores (`shared_devices`:
    pools, real models, repetitions         agents on one CPU are not one device each)
    interleaved (whole, pools, whole, ...)
        |                                   |
        +---- throughput (batches/s, steady window of the agents' call logs), per layout ----+
                          -> scale_real.json: measured, modelled (marked), their ratio

Every agent runs with one torch thread (as `start_agents(torch_threads=1)`), the fit's setting, and the fit
counts CPU time (`scale_fit --clock cpu`). On one host the agents share its cores, and other users' work takes
some, so the model's devices are processors shared by all agents (`model_run(shared_devices=c)`: n calls running
at once each progress at min(1, c / n)). c is measured apart from the agents, like counting GPUs: before and after
each run, as many busy processes as agents spin for 2 s (`probe_cores`), and c is the mean of their CPU seconds /
wall. (Linux's autogroup scheduling, on here, shares the cores per session, not per process, so c hardly depends
on how many of the user's processes run; the per-process fair share, other load L = cores / (c / k) - k for k
spinners and each call at min(1, cores / (L + n)), is modelled beside it.) The model is given the run's batches, depth
and decode lengths, and both read throughput over the whole active run (first call to last; a short run's
steady window holds a few batches). Beside it: the agents' own CPU seconds per batch (/proc) against the fitted
table's (a check of the table), the cores the agents had (CPU seconds / wall), the model at those cores, and at
all the host's cores (`--cores`, default all). The load average is recorded before and after every run.

    python -m jobs.bench.scale_fit && python -m jobs.bench.scale_real && python -m jobs.bench.scale_tables
                          # the fit, then 6 agents, 12 batches per run, 2 interleaved repetitions per layout
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Annotated

from jobs.bench.call_logs import summarize
from jobs.bench.pool_sizing import resize_pools, size_pools
from recmas_ray.config.checks import Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.placement import PlacementConfig
from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.config.tree import save_config


@dataclass(kw_only=True)
class RealScaleConfig:
    """What the real-agent comparison runs (see the module docstring)."""

    style: str = "sequential_light"
    """Style; its roles take the demo preset's real models (planner SmolLM2, critic Gemma, solver SmolLM2)."""
    preset: str = "demo"
    """Model preset of the roles (demo: the real small models; tiny: random-weight ones, for a quick check)."""
    agents: Annotated[int, Range(2, 64)] = 6
    """Agent actors of each layout (whole systems: agents // roles replicas)."""
    rounds: Annotated[int, Range(1, 8)] = 1
    """R."""
    latent_steps: Annotated[int, Range(1, 256)] = 4
    """m."""
    max_new_tokens: Annotated[int, Range(1, 1024)] = 8
    """Decode budget."""
    batch_size: Annotated[int, Range(1, 64)] = 1
    """Questions per batch."""
    num_batches: Annotated[int, Range(1, 10_000)] = 12
    """Batches per run (throughput is read over the whole active run, in the model alike)."""
    in_flight: Annotated[int, Range(1, 256)] = 4
    """Batches in flight in all, the same for both layouts."""
    repeats: Annotated[int, Range(1, 20)] = 2
    """Runs per layout, interleaved; medians and spread are reported."""
    costs: str = "docs/scale_costs.json"
    """The fitted cost table (jobs.bench.scale_fit)."""
    cores: Annotated[int, Range(0, 4096)] = 0
    """Cores the agents share in the model (0: this host's)."""
    remodel: str | None = None
    """Run no agents: model the runs of this saved scale_real.json again (its layouts and settings must be this
    config's), e.g. after a new fit."""
    timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = 900.0
    """Timeout of every wait."""
    output_path: Annotated[str, WritableDir()] = "docs"
    """Where scale_real.json and its config (scale_real.config.json) go."""


def role_params(plan, fit: dict, max_new_tokens: int) -> dict:
    """Each role's `models.sim` parameters from the fit of its model."""
    from jobs.bench.scale_fit import fitted_sim_name  # lazy: keeps spawned children light (probe_cores)
    from recmas_ray.models.sim import parse_sim_name  # lazy: keeps spawned children light (probe_cores)

    missing = sorted({m for m in plan.role_models.values() if m not in fit})
    if missing:
        raise ValueError(f"the cost table has no fit for {missing}; expected one of {sorted(fit)} "
                         "(python -m jobs.bench.scale_fit --models ...)")
    return {r: parse_sim_name(fitted_sim_name(fit[m], hidden=64, tokens=max_new_tokens))
            for r, m in plan.role_models.items()}


def questions(n: int, size: int, tag: str) -> list:
    return [([f"{tag} question {k}.{i}: what is {k} + {i} times 3?" for i in range(size)], ["math"] * size)
            for k in range(n)]


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used so far (/proc/PID/stat; they run on this host)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15 of stat)
    return total


def _spin(seconds: float, out) -> None:
    cpu0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass
    out.put(time.process_time() - cpu0)


def probe_cores(processes: int, seconds: float = 2.0) -> float:
    """Cores `processes` busy processes get now (their CPU seconds / wall): what this host gives as many
    runnable agents while other users' work runs, measured apart from the agents themselves."""
    ctx = mp.get_context("spawn")  # not fork: the driver holds Ray's threads
    out = ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(seconds, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    cpu = sum(out.get(timeout=seconds * 100) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return cpu / seconds


def agent_pids(reps) -> list[int]:
    import ray  # lazy: keeps spawned children light (probe_cores)

    handles = [h for s in reps.systems for h in s.actors().values()]
    return ray.get([h.__ray_call__.remote(lambda self: os.getpid()) for h in handles], timeout=60)


def real_run(plan, layout_copies: dict | None, replicas: int, cfg: RealScaleConfig, tag: str) -> dict:
    """One run of `cfg.num_batches` on Ray: the agents' call logs read as the model's are (`summarize`)."""
    from recmas_ray.distributed.launch import start_agents  # lazy: keeps spawned children light (probe_cores)

    rc = RecursionConfig(method="recursive_mas", num_recursive_rounds=cfg.rounds, latent_steps=cfg.latent_steps,
                         decode=DecodeConfig(max_new_tokens=cfg.max_new_tokens))
    placement = PlacementConfig(preset="cpu", cpus_per_agent=0.05, num_replicas=replicas, agent_max_restarts=0,
                                role_replicas=layout_copies or {}, ready_timeout_s=cfg.timeout_s)
    load0 = list(os.getloadavg())
    cores_before = probe_cores(cfg.agents)
    reps = start_agents(plan, backend="ray", placement=placement, timeout_s=cfg.timeout_s, torch_threads=1)
    try:
        reps.solve_all(questions(replicas, cfg.batch_size, f"warm{tag}"), rc, in_flight_per_replica=1)
        reps.call_logs(clear=True)
        pids = agent_pids(reps)
        cpu0, t0 = _cpu_s(pids), time.time()
        out = reps.solve_all(questions(cfg.num_batches, cfg.batch_size, tag), rc,
                             in_flight_per_replica=max(1, cfg.in_flight // replicas))
        wall, cpu = time.time() - t0, _cpu_s(pids) - cpu0
        logs = reps.call_logs()
    finally:
        reps.shutdown()
    entries = {}
    for log in logs:
        for calls in log.values():
            for c in calls:
                m = re.search(r" question (\d+)\.0:", c["first_user"])
                if m:
                    entries[m.group(1)] = min(entries.get(m.group(1), c["t0"]), c["t0"])
    tokens = [r.num_text_tokens for _, res in out for r in res]
    run = summarize(logs, list(entries.values()))
    cores_after = probe_cores(cfg.agents)
    return {"throughput_batches_per_s": run["throughput_active_window"],
            "throughput_steady_window": run["throughput_batches_per_s"], "steady_s": run["steady_s"],
            "steady_batches": run["steady_batches"], "throughput_wall": cfg.num_batches / wall,
            "probed_cores_before_after": [cores_before, cores_after],
            "host_busy_by_role": run["host_busy_by_role"], "wall_s": wall, "mean_decoded_tokens": statistics.mean(tokens),
            "agents_cpu_s": cpu, "agents_cpu_s_per_batch": cpu / cfg.num_batches, "effective_cores": cpu / wall,
            "loadavg_1_5_15_before": load0, "loadavg_1_5_15_after": list(os.getloadavg())}


def bench(cfg: RealScaleConfig) -> int:
    from jobs.bench.scale_fit import load_fit  # lazy: keeps spawned children light (probe_cores)
    from jobs.bench.scale_model import expected_role_ms, model_run  # lazy: keeps spawned children light (probe_cores)
    from recmas_ray.system.plan import plan_system  # lazy: keeps spawned children light (probe_cores)

    fit = load_fit(cfg.costs)
    plan = plan_system(cfg.style, preset=cfg.preset, seed=0, dtype="float32")
    roles = list(plan.style.roles)
    params = role_params(plan, fit, cfg.max_new_tokens)  # before anything is written: a missing fit is exit 2
    if cfg.agents < len(roles):
        raise ValueError(f"--agents {cfg.agents}: the {cfg.style} style has {len(roles)} roles; expected at least that")
    n_whole = cfg.agents // len(roles)
    role_ms = expected_role_ms(plan.style, params, cfg.rounds, cfg.latent_steps, cfg.max_new_tokens, cfg.batch_size)
    copies = size_pools(role_ms, n_whole * len(roles))
    layouts = {"whole_system": (None, n_whole), "per_role_pools": (copies, 1)}
    settings = {k: getattr(cfg, k) for k in ("style", "preset", "agents", "rounds", "latent_steps", "max_new_tokens",
                                              "batch_size", "num_batches", "in_flight")}
    if cfg.remodel:  # the runs of a saved report, modelled again (with this fit)
        saved = json.load(open(cfg.remodel))
        differ = {k: (v, saved.get("settings", {}).get(k)) for k, v in settings.items()
                  if saved.get("settings", {}).get(k) != v}
        if differ:
            raise ValueError(f"--remodel {cfg.remodel}: its runs had other settings {differ} (this config's, "
                             "the saved); expected the same")
        copies, runs = saved["pool_copies"], {n: lay["runs"] for n, lay in saved["layouts"].items()}
        layouts = {"whole_system": (None, saved["whole_system_replicas"]), "per_role_pools": (copies, 1)}
    save_config(cfg, cfg.output_path, "scale_real.config.json")
    if not cfg.remodel:
        runs = {name: [] for name in layouts}
        for rep in range(cfg.repeats):  # interleaved: one run of each layout per pass, alternating which goes first
            for name in (list(layouts) if rep % 2 == 0 else list(layouts)[::-1]):
                cps, n = layouts[name]
                runs[name].append(real_run(plan, cps, n, cfg, f"r{rep}"))
                print(json.dumps({name: {k: v for k, v in runs[name][-1].items() if not isinstance(v, dict)}}),
                      flush=True)
    cores = cfg.cores or os.cpu_count()
    report = {"settings": settings, "role_models": plan.role_models, "fit_from": cfg.costs, "role_device_ms_per_batch":
              role_ms, "pool_copies": copies, "whole_system_replicas": n_whole, "agents": n_whole * len(roles),
              "cores": cores, "layouts": {}}
    for name, (cps, n) in layouts.items():
        layout = [cps or {r: 1 for r in roles}] * n
        for run in runs[name]:  # the model of each run: the fit's costs, the run's batches, depth, decode lengths
            tokens = max(1, round(run["mean_decoded_tokens"]))
            kw = dict(rounds=cfg.rounds, latent_steps=cfg.latent_steps, max_new_tokens=tokens,
                      batch_size=cfg.batch_size, num_batches=cfg.num_batches, depth=max(1, cfg.in_flight // n))
            model_params = role_params(plan, fit, tokens)
            run["modelled_cpu_s_per_batch"] = sum(expected_role_ms(
                plan.style, model_params, cfg.rounds, cfg.latent_steps, tokens, cfg.batch_size).values()) / 1e3
            # the other runnable load the probe saw: k spinners got r cores each of the host's, so the scheduler
            # shared the cores among host / r runnable processes, k of them the probe's
            probed = statistics.mean(run["probed_cores_before_after"])
            run["other_load"] = max(0.0, cores / max(probed / cfg.agents, 1e-9) - cfg.agents)
            # primary: the probed cores as the agents' capacity (autogroup: see the module docstring); the
            # per-process fair share beside it
            run["modelled_throughput_batches_per_s"] = model_run(
                plan.style, model_params, layout, shared_devices=probed, **kw)["throughput_active_window"]
            run["modelled_per_process_share"] = model_run(
                plan.style, model_params, layout, shared_devices=cores, other_load=run["other_load"],
                **kw)["throughput_active_window"]
            run["modelled_at_run_cores"] = model_run(plan.style, model_params, layout,
                                                     shared_devices=run["effective_cores"], **kw)["throughput_active_window"]
            run["modelled_at_host_cores"] = model_run(plan.style, model_params, layout, shared_devices=cores,
                                                      **kw)["throughput_active_window"]
        xs = [r["throughput_batches_per_s"] for r in runs[name]]
        ms = [r["modelled_throughput_batches_per_s"] for r in runs[name]]
        report["layouts"][name] = {
            "measured_throughput_batches_per_s": statistics.median(xs), "measured_spread": [min(xs), max(xs)],
            "modelled_throughput_batches_per_s": statistics.median(ms), "modelled_spread": [min(ms), max(ms)],
            "measured_vs_modelled": statistics.median(x / m - 1 for x, m in zip(xs, ms)),
            "effective_cores": statistics.median(r["effective_cores"] for r in runs[name]),
            "measured_cpu_s_per_batch": statistics.median(r["agents_cpu_s_per_batch"] for r in runs[name]),
            "modelled_cpu_s_per_batch": statistics.median(r["modelled_cpu_s_per_batch"] for r in runs[name]),
            "modelled_at_host_cores": statistics.median(r["modelled_at_host_cores"] for r in runs[name]),
            "modelled_at_run_cores": statistics.median(r["modelled_at_run_cores"] for r in runs[name]),
            "probed_cores": statistics.median(statistics.mean(r["probed_cores_before_after"]) for r in runs[name]),
            "other_load": statistics.median(r["other_load"] for r in runs[name]),
            "modelled_per_process_share": statistics.median(r["modelled_per_process_share"] for r in runs[name]),
            "runs": runs[name]}
    w, p = report["layouts"]["whole_system"], report["layouts"]["per_role_pools"]
    report["pools_vs_whole"] = {
        "measured": p["measured_throughput_batches_per_s"] / w["measured_throughput_batches_per_s"],
        "modelled": p["modelled_throughput_batches_per_s"] / w["modelled_throughput_batches_per_s"]}
    busy = statistics.median  # the online rule's decision from the pools' measured busy (median over runs)
    pool_busy = {r: busy(run["host_busy_by_role"][r] for run in p["runs"]) for r in roles}
    report["resize_rule_on_measured_busy"] = {"busy": pool_busy, "copies": resize_pools(copies, pool_busy)}
    path = os.path.join(cfg.output_path, "scale_real.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: report[k] for k in ("pool_copies", "pools_vs_whole")}), flush=True)
    for name, lay in report["layouts"].items():
        print(f"{name}: measured {lay['measured_throughput_batches_per_s']:.3f} batches/s "
              f"({lay['measured_spread'][0]:.3f}-{lay['measured_spread'][1]:.3f}), modelled "
              f"{lay['modelled_throughput_batches_per_s']:.3f} ({lay['measured_vs_modelled']:+.1%})", flush=True)
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    return run_job(bench, RealScaleConfig, argv, prog="python -m jobs.bench.scale_real", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
