"""Where the start of a system goes: `System.build` on the Ray backend, phase by phase, and `jobs.serve` until it
serves, each in a fresh Python process, with the wall and CPU seconds of each phase and the machine's load.

  python -m jobs.bench.start                         # tiny preset, sequential_light: build phases, build, serve
  python -m jobs.bench.start --targets phases        # only the phase breakdown
  python -m jobs.bench.start --targets build serve --compare_tree /tmp/old --repeats 2
                                                     # against another checkout, runs interleaved

Phases (one fresh process, the steps `System.build(backend="ray")` takes, in its order):
  import_torch      torch + transformers (what planning and the agents need)
  import_ray        ray
  plan              plan_system: model configs, dims, links (no weights)
  ray_start         a private local cluster (`init_ray`)
  agents            placement group and agent actors started (the orchestrator and router actors too), until
                    every agent's `ready()` answers (models loaded)
  orchestrator      then until the orchestrator and the router answer
`build` is `System.build` itself end to end (import of recmas_ray included) in another fresh process; `serve` is
`python -m jobs.serve` from launch until it prints its URL (the application answers then).

CPU seconds are those of the measured process and every process below it (Ray's GCS, raylet, workers), read from
/proc at each phase's end (a process that exited in between is not counted); `cpu_by_process` splits the total by
process title at the end. With `--compare_tree` (another checkout of the project, e.g. a `git worktree` of an older
commit) `build` and `serve` also run from that tree, alternating with this one `--repeats` times, so load drift hits
both alike; `ratio` is the median wall time here over there. Prints one JSON object and writes it to
<output_path>/bench_start.json.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import psutil

from recmas_ray.config.checks import Range
from recmas_ray.config.cli import run_job

TARGETS = ("phases", "build", "serve")


@dataclass(kw_only=True)
class StartBenchConfig:
    """What the start benchmark measures."""

    style: str = "sequential_light"
    """Collaboration style of the system started."""
    preset: str = "tiny"
    """Base models of its roles (tiny: random-weight models built locally)."""
    targets: list[str] = field(default_factory=lambda: list(TARGETS))
    """What to measure: phases (System.build's steps), build (System.build end to end), serve (jobs.serve)."""
    timeout_s: Annotated[float, Range(10, 3600)] = 600.0
    """Longest wait for one target."""
    output_path: str = "out/bench_start"
    """Folder of bench_start.json."""
    compare_tree: str = ""
    """Another checkout of the project whose build and serve start are measured alternately with this one's."""
    repeats: Annotated[int, Range(1, 20)] = 1
    """Measurements of each target (and of each tree with --compare_tree)."""

    def validate(self) -> None:
        bad = [t for t in self.targets if t not in TARGETS]
        if bad or not self.targets:
            raise ValueError(f"--targets {' '.join(self.targets)}: expected some of {' '.join(TARGETS)}")


def tree_cpu(pid: int | None = None) -> tuple[float, dict[str, float]]:
    """CPU seconds (user + system, reaped children included) of a process and all below it, and by title."""
    root = psutil.Process(pid or os.getpid())
    total, by_name = 0.0, {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            name = _title(proc)
        except psutil.Error:
            continue
        seconds = t.user + t.system + t.children_user + t.children_system
        total += seconds
        by_name[name] = by_name.get(name, 0.0) + seconds
    return total, by_name


def _title(proc) -> str:
    """A process's kind: Ray's titles (ray::AgentActor, ray::IDLE), else its program name."""
    cmd = proc.cmdline()
    first = cmd[0] if cmd else proc.name()
    if first.startswith("ray::"):
        return first.split(".")[0].split()[0]
    name = os.path.basename(first)
    return name if not name.startswith("python") or len(cmd) < 2 else os.path.basename(cmd[1] if cmd[1] != "-m"
                                                                                         else cmd[2])


class Phases:
    """Wall and CPU seconds of consecutive phases of this process (and its descendants)."""

    def __init__(self):
        self.rows: list[dict] = []
        self.t, self.cpu = time.perf_counter(), tree_cpu()[0]

    def mark(self, name: str) -> None:
        t, cpu = time.perf_counter(), tree_cpu()[0]
        self.rows.append({"phase": name, "wall_s": round(t - self.t, 2), "cpu_s": round(cpu - self.cpu, 2)})
        self.t, self.cpu = t, cpu


def child_phases(style: str, preset: str) -> dict:
    """`System.build(backend="ray")`'s steps, timed one by one (run in a fresh process)."""
    phases = Phases()
    import torch  # noqa: F401  # lazy: timed (phase import_torch)
    import transformers  # noqa: F401  # lazy: timed (phase import_torch)

    phases.mark("import_torch")
    import ray  # noqa: F401  # lazy: timed (phase import_ray)

    phases.mark("import_ray")
    from jobs.bench import start_steps  # lazy: timed in the child (phase plan: the Ray layer's import)

    replicas = start_steps.build_by_phase(phases, style, preset)
    cpu_by = tree_cpu()[1]
    replicas.shutdown()
    return {"phases": phases.rows, "cpu_by_process": {k: round(v, 2) for k, v in sorted(cpu_by.items())}}


def child_build(style: str, preset: str) -> dict:
    """`System.build` end to end, import of the package included (run in a fresh process)."""
    phases = Phases()
    import recmas_ray as rm  # lazy: timed in the child (phase build: the package's import)

    system = rm.System.build(style, preset=preset, backend="ray")
    phases.mark("build")
    cpu_by = tree_cpu()[1]
    system.close()
    return {"phases": phases.rows, "cpu_by_process": {k: round(v, 2) for k, v in sorted(cpu_by.items())}}


HERE = Path(__file__).resolve().parents[2]


def _env(tree: Path) -> dict:
    """This environment with `tree` first on the import path (its recmas_ray and jobs), no cluster address."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH")) if p)
    return env


def _run_child(fn: str, cfg: StartBenchConfig, tree: Path = HERE) -> dict:
    """`fn` of this file in a fresh process; `tree`'s package is the one measured (this file's code runs)."""
    code = ("import json, sys, recmas_ray; "
            f"import importlib.util as u; spec = u.spec_from_file_location('start_bench', {__file__!r}); "
            f"m = sys.modules['start_bench'] = u.module_from_spec(spec); spec.loader.exec_module(m); "
            f"print('RESULT ' + json.dumps(m.{fn}({cfg.style!r}, {cfg.preset!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=cfg.timeout_s,
                          env=_env(tree), cwd=tree)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{fn} failed (exit {done.returncode}): {(done.stderr or done.stdout)[-1500:]}")
    return json.loads(lines[-1][len("RESULT "):])


def measure_serve(cfg: StartBenchConfig, tree: Path = HERE) -> dict:
    """`python -m jobs.serve` from launch until it prints its URL; then stopped (Ctrl-C, as a user would)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = tempfile.mkdtemp(prefix="bench-start-serve-")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jobs.serve", "--style", cfg.style, "--preset", cfg.preset,
                             "--port", str(port), "--log_dir", logs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_env(tree), cwd=tree)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "serving " in line:
                break
            if time.perf_counter() - t0 > cfg.timeout_s:
                raise RuntimeError("jobs.serve did not start in time")
        else:
            raise RuntimeError(f"jobs.serve exited: {''.join(seen)[-1500:]}")
        wall = time.perf_counter() - t0
        cpu, by = tree_cpu(proc.pid)
        return {"phases": [{"phase": "serve", "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}],
                "cpu_by_process": {k: round(v, 2) for k, v in sorted(by.items())}}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def bench(cfg: StartBenchConfig) -> int:
    # lazy: the children load this file: its top imports little of the package, whose import they time
    from recmas_ray.eval.results import machine_load

    trees = {"this": HERE} | ({"compare": Path(cfg.compare_tree).resolve()} if cfg.compare_tree else {})
    out = {"style": cfg.style, "preset": cfg.preset, "trees": {k: str(v) for k, v in trees.items()},
           "machine_before": machine_load(), "targets": {}}
    for target in cfg.targets:
        runs: dict[str, list] = {name: [] for name in trees}
        for _ in range(cfg.repeats):
            for name, tree in trees.items():
                if name != "this" and target == "phases":  # the phase split needs this tree's functions
                    continue
                before = machine_load()
                try:
                    got = measure_serve(cfg, tree) if target == "serve" else _run_child(f"child_{target}", cfg, tree)
                except (RuntimeError, subprocess.TimeoutExpired) as e:  # e.g. Ray's start-up timeout on a busy machine
                    runs[name].append({"error": str(e)[-300:], "load_avg_before": before["load_avg"]})
                    continue
                got["load_avg_before"] = before["load_avg"]
                got["total_wall_s"] = round(sum(p["wall_s"] for p in got["phases"]), 2)
                got["total_cpu_s"] = round(sum(p["cpu_s"] for p in got["phases"]), 2)
                runs[name].append(got)
        entry = {"runs": {k: v for k, v in runs.items() if v}}
        if len(entry["runs"]) == 2:
            ok = {k: [r["total_wall_s"] for r in v if "error" not in r] for k, v in entry["runs"].items()}
            if all(ok.values()):
                med = {k: statistics.median(v) for k, v in ok.items()}
                entry["median_wall_s"] = med
                entry["ratio_this_over_compare"] = round(med["this"] / med["compare"], 3)
        out["targets"][target] = entry
    out["machine_after"] = machine_load()
    Path(cfg.output_path).mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, indent=2)
    (Path(cfg.output_path) / "bench_start.json").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def main(argv=None) -> int:
    return run_job(bench, StartBenchConfig, argv, prog="python -m jobs.bench.start", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
