"""Load benchmark of the OpenAI server: N concurrent clients, dynamic batching vs one request per batch.

Two Serve applications of the same system (same models, links, seed) run side by side on one private
local Ray cluster, on 127.0.0.1 only:

  batched     --max_batch_size B (default 16), the server's defaults otherwise
  unbatched   --max_batch_size 1 with up to `unbatched_concurrency` single-request batches in flight
              (how the server ran before batching: every request alone, overlapping across agents)

For each client count (1, 4, 16, 64) both are measured back to back (so load drift on a shared machine
hits both alike): closed-loop clients, each sending its next request when the previous one is answered,
until the level's request budget is spent or its time bound passes. Figures per level: requests/s,
p50/p99 latency, completion tokens/s, mean rows per batch (from the server's /metrics) and errors.

Targets at 16 clients: batched throughput >= 4x batched at 1 client, and >= 3x unbatched.

  python -m jobs.bench.serve                       # tiny preset, R = 2, m = 8, 32 tokens, greedy
  python -m jobs.bench.serve --clients 1 4 16 64 --requests_per_client 4 --num_recursive_rounds 1 --latent_steps 4

Writes <output_path>/bench_serve.json (figures, ratios, machine and load) and bench_serve.png.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated

from ray import serve

from jobs import serve as serve_job
from jobs.bench.backend import machine
from recmas_ray.config.checks import OneOf, Range, WritableDir
from recmas_ray.config.cli import run_job
from recmas_ray.config.tree import save_config
from recmas_ray.config.choices import BACKENDS
from recmas_ray.distributed.cluster import init_ray
from recmas_ray.system.config import SystemConfig

MODEL = "recmas-bench"
MAX_CLIENTS = 256
MAX_REQUESTS_PER_LEVEL = 2000


@dataclass(kw_only=True)
class ServeBenchConfig:
    """What the serving benchmark runs."""

    SYSTEM_FIELDS = ("style", "preset", "role_models", "seed")
    """System fields the benchmark passes on (the others get no flag and are refused when set); both servers
    get fresh links."""
    FLAG_ALIASES = {"role_model": "system.role_models"}
    """The benchmark's spelling of the per-role base models (config/cli.py)."""

    system: SystemConfig = field(default_factory=lambda: SystemConfig(style="sequential_light", seed=0))
    """The served system of both servers: style, base models (preset, role_models) and seed of the links."""
    backend: Annotated[str, OneOf(BACKENDS)] = "ray"
    """Backend of both servers (ray: agent actors; local: agents inside the replica)."""
    clients: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    """Concurrent client counts measured (each 1..256)."""
    requests_per_client: Annotated[int, Range(1, 100)] = 6
    """Requests per client and level (at least min_requests_per_level per level)."""
    min_requests_per_level: Annotated[int, Range(1, MAX_REQUESTS_PER_LEVEL)] = 16
    """Fewest requests of one level (so 1 client still gives a median)."""
    level_timeout_s: Annotated[float, Range(1, 3600)] = 240.0
    """Time bound of one level: clients send no new request after it."""
    max_tokens: Annotated[int, Range(1, 4096)] = 32
    """max_tokens of every request."""
    num_recursive_rounds: Annotated[int, Range(1, 32)] = 2
    """R of every request (R = 2, m = 8, 32 tokens: about the single-request cost of the unbatched server)."""
    latent_steps: Annotated[int, Range(0, 4096)] = 8
    """m of every request."""
    max_batch_size: Annotated[int, Range(2, 1024)] = 16
    """--max_batch_size of the batched server."""
    batch_wait_timeout_s: Annotated[float, Range(0, 10)] = 0.02
    """--batch_wait_timeout_s of the batched server."""
    batched_concurrency: Annotated[int, Range(0, 64)] = 0
    """--max_concurrent_batches of the batched server (0: the server's default)."""
    unbatched_concurrency: Annotated[int, Range(1, 64)] = 16
    """Single-request batches the unbatched server runs at once."""
    torch_threads: Annotated[int, Range(0, 1024)] = 1
    """Torch threads per agent (1 keeps CPU timings steady on a shared machine)."""
    output_path: Annotated[str, WritableDir()] = "out/bench_serve"
    """Where bench_serve.json, bench_serve.png and config.json go."""

    def validate(self) -> None:
        self.system.check_tables("--role_model")
        bad = [c for c in self.clients if not isinstance(c, int) or isinstance(c, bool) or not 1 <= c <= MAX_CLIENTS]
        if not self.clients or bad:
            raise ValueError(f"--clients {self.clients}: expected client counts between 1 and {MAX_CLIENTS}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_config(args: ServeBenchConfig, name: str, port: int, batched: bool):
    system = args.system
    argv = ["--style", system.style, "--preset", system.preset, "--backend", args.backend, "--model_name", MODEL,
            "--app_name", name, "--route_prefix", f"/{name}", "--port", str(port), "--seed", str(system.seed),
            "--torch_threads", str(args.torch_threads), "--max_new_tokens", str(args.max_tokens),
            "--max_batch_size", str(args.max_batch_size if batched else 1),
            "--batch_wait_timeout_s", str(args.batch_wait_timeout_s if batched else 0),
            "--max_ongoing_requests", str(2 * MAX_CLIENTS)]
    if not batched:
        argv += ["--max_concurrent_batches", str(args.unbatched_concurrency)]
    elif args.batched_concurrency:
        argv += ["--max_concurrent_batches", str(args.batched_concurrency)]
    for role, model in system.role_models.items():
        argv += ["--role_model", f"{role}={model}"]
    return serve_job.parse(argv)


class Client:
    """One keep-alive HTTP connection to 127.0.0.1."""

    def __init__(self, port: int, prefix: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.prefix = prefix

    def get(self, path: str) -> bytes:
        self.conn.request("GET", self.prefix + path)
        return self.conn.getresponse().read()

    def chat(self, question: str, args: ServeBenchConfig) -> tuple[int, dict]:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": question}],
                           "max_tokens": args.max_tokens, "temperature": 0,
                           "num_recursive_rounds": args.num_recursive_rounds, "latent_steps": args.latent_steps})
        self.conn.request("POST", self.prefix + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read())


def _batches(client: Client) -> tuple[float, float]:
    """(batches run, rows run) so far, from the server's Prometheus text."""
    values = {}
    for line in client.get("/metrics").decode().splitlines():
        if line.startswith("recmas_batch_rows_count") or line.startswith("recmas_batch_rows_sum"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values.get("recmas_batch_rows_count", 0.0), values.get("recmas_batch_rows_sum", 0.0)


def measure(args: ServeBenchConfig, port: int, prefix: str, num_clients: int) -> dict:
    """One level: `num_clients` closed-loop clients until the request budget or the time bound is spent."""
    total = min(MAX_REQUESTS_PER_LEVEL, max(args.min_requests_per_level, num_clients * args.requests_per_client))
    lock, next_index, records = threading.Lock(), [0], []
    deadline = time.monotonic() + args.level_timeout_s

    def worker():
        client = Client(port, prefix)
        while True:
            with lock:
                i = next_index[0]
                if i >= total or time.monotonic() > deadline:
                    return
                next_index[0] += 1
            t0 = time.perf_counter()
            try:
                status, data = client.chat(f"What is {i} + {2 * i + 1}?", args)
            except (OSError, http.client.HTTPException, ValueError) as e:
                status, data, client = 599, {"error": str(e)}, Client(port, prefix)
            seconds = time.perf_counter() - t0
            tokens = data.get("usage", {}).get("completion_tokens", 0) if status == 200 else 0
            with lock:
                records.append((status, seconds, tokens))

    probe = Client(port, prefix)
    batches0, rows0 = _batches(probe)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(num_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.level_timeout_s + 600)
    wall = time.perf_counter() - t0
    batches1, rows1 = _batches(probe)
    ok = [r for r in records if r[0] == 200]
    latencies = sorted(r[1] for r in ok)
    pct = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]) if latencies else (lambda q: None)
    statuses: dict[str, int] = {}
    for r in records:
        if r[0] != 200:
            statuses[str(r[0])] = statuses.get(str(r[0]), 0) + 1
    return {"clients": num_clients, "requests": len(records), "ok": len(ok), "errors": len(records) - len(ok),
            "error_statuses": statuses,
            "wall_s": wall, "requests_per_s": len(ok) / wall, "tokens_per_s": sum(r[2] for r in ok) / wall,
            "latency_p50_s": statistics.median(latencies) if latencies else None, "latency_p99_s": pct(0.99),
            "mean_rows_per_batch": (rows1 - rows0) / (batches1 - batches0) if batches1 > batches0 else None,
            "loadavg_1min_at_start": load}


def plot(results: dict, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib loads only when a plot is drawn
    from matplotlib.figure import Figure  # lazy: matplotlib loads only when a plot is drawn

    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    ax_rps, ax_lat = fig.subplots(1, 2)
    for color, (mode, levels) in zip(("C0", "C1"), results.items()):
        xs = [lv["clients"] for lv in levels]
        ax_rps.plot(xs, [lv["requests_per_s"] for lv in levels], marker="o", color=color, label=mode)
        ax_lat.plot(xs, [lv["latency_p50_s"] for lv in levels], marker="o", color=color, label=f"{mode} p50")
        ax_lat.plot(xs, [lv["latency_p99_s"] for lv in levels], marker="x", linestyle="--", color=color,
                    label=f"{mode} p99")
    for ax, label in ((ax_rps, "requests / s"), (ax_lat, "latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    ax_rps.set_title("throughput")
    ax_lat.set_title("latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def ratios(results: dict) -> dict:
    """The two target ratios at 16 clients (None when 1 or 16 clients were not measured)."""
    by = {mode: {lv["clients"]: lv["requests_per_s"] for lv in levels} for mode, levels in results.items()}
    batched, unbatched = by["batched"], by["unbatched"]
    out = {"batched_16_over_batched_1": None, "batched_16_over_unbatched_16": None}
    if 16 in batched and 1 in batched and batched[1] > 0:
        out["batched_16_over_batched_1"] = batched[16] / batched[1]
    if 16 in batched and 16 in unbatched and unbatched[16] > 0:
        out["batched_16_over_unbatched_16"] = batched[16] / unbatched[16]
    out["targets"] = {"batched_16_over_batched_1": 4.0, "batched_16_over_unbatched_16": 3.0}
    out["met"] = {k: v is not None and v >= out["targets"][k] for k, v in out.items() if k in out["targets"]}
    return out


def run(args: ServeBenchConfig) -> int:
    out_dir = args.output_path
    save_config(args, out_dir)
    # Two systems (3 agents + orchestrator each) and two replicas: logical CPUs for all of them.
    init_ray(num_cpus=max(16, os.cpu_count() or 1), log_to_driver=False)
    port = _free_port()
    configs = {mode: _server_config(args, mode, port, mode == "batched") for mode in ("batched", "unbatched")}
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    for cfg in configs.values():
        serve_job.start(cfg)
    results: dict[str, list] = {mode: [] for mode in configs}
    try:
        for mode in configs:  # warm-up: first requests load kernels and caches
            for _ in range(2):
                Client(port, f"/{mode}").chat("What is 1 + 1?", args)
        for num_clients in args.clients:
            for mode in configs:
                level = measure(args, port, f"/{mode}", num_clients)
                results[mode].append(level)
                print(f"{mode:>9} {num_clients:>3} clients: {level['requests_per_s']:.2f} req/s, p50 "
                      f"{level['latency_p50_s'] or float('nan'):.2f} s, rows/batch {level['mean_rows_per_batch']}, "
                      f"errors {level['errors']}, load {level['loadavg_1min_at_start']:.1f}", flush=True)
    finally:
        for cfg in configs.values():
            serve.delete(cfg.app_name)
        serve.shutdown()
    report = {"results": results, "ratios": ratios(results), "machine": machine(args.torch_threads),
              "servers": {mode: {"max_batch_size": cfg.max_batch_size, "batch_wait_timeout_s": cfg.batch_wait_timeout_s,
                                 "max_concurrent_batches": cfg.max_concurrent_batches, "backend": cfg.backend}
                          for mode, cfg in configs.items()},
              "request": {"max_tokens": args.max_tokens, "num_recursive_rounds": args.num_recursive_rounds,
                          "latent_steps": args.latent_steps, "temperature": 0}}
    path = os.path.join(out_dir, "bench_serve.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    plot(results, os.path.join(out_dir, "bench_serve.png"))
    print(json.dumps(report["ratios"], indent=2))
    print(f"wrote {path} and bench_serve.png")
    return 0


def main(argv=None) -> int:
    return run_job(run, ServeBenchConfig, argv, prog="python -m jobs.bench.serve", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
