"""The end-to-end demo behind `jobs/demo.py`: train a sequential system, then evaluate it against text.

  synthetic data --split--> train.jsonl / heldout.jsonl
  inner loop   : planner, critic, solver inner links trained concurrently (Ray Train, one run per role)
  outer loop   : outer links trained through R rounds of the frozen agents (pipeline-parallel Ray Train)
  evaluation   : RecursiveMAS and Recursive-TextMAS on the held-out split at R = 1, 2, 3, on Ray actors
  report       : one results table (speedup and token reduction vs Recursive-TextMAS) and a PNG

Everything runs offline; with `--preset demo` the agents are real small models from PyPI wheels
(SmolLM2-135M and Gemma-3-270M), with `--preset tiny` the random tiny models of the tests.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from recmas_ray.agent import DecodeConfig
from recmas_ray.distributed.placement import PlacementConfig
from recmas_ray.eval.results import markdown_table, plot_vs_rounds
from recmas_ray.models.loader import resolve_model_path
from recmas_ray.system.presets import role_models
from recmas_ray.train.synthetic import make_arithmetic_dataset, split_train_eval, write_jsonl


@dataclass(kw_only=True)
class DemoConfig:
    """Sizes of the demo run (defaults: about 15 minutes on 2 CPU cores with the demo models)."""

    preset: str = "demo"
    """demo (real small models) or tiny."""
    style: str = "sequential_light"
    """The demo trains and evaluates the sequential style."""
    num_train: int = 96
    """Generated training rows."""
    num_eval: int = 8
    """Held-out questions evaluated per method and R."""
    inner_steps: int = 30
    """Inner-loop steps per role."""
    outer_steps: int = 8
    """Outer-loop steps."""
    outer_rounds: int = 2
    """R used while training the outer links."""
    rounds: tuple[int, ...] = (1, 2, 3)
    """R values evaluated."""
    latent_steps: int = 16
    """m at evaluation."""
    max_latent_tokens: int = 24
    """Latents passed between agents during outer training."""
    max_new_tokens: int = 64
    """Decoding budget per text step."""
    lr: float = 1e-4
    """Outer-loop learning rate (the spec's stable value; the reference default 5e-4 spiked)."""
    backend: str = "ray"
    """Evaluation backend."""
    output_path: str = "out/demo"
    """Where data, checkpoints, results and the plot go."""
    seed: int = 0
    """Seed of data, links and training."""
    progress: bool = True
    """Progress bars."""


def quick(cfg: DemoConfig) -> DemoConfig:
    """The ~2-minute version: fewer rows, steps, questions and tokens."""
    return dataclasses.replace(cfg, num_train=16, num_eval=3, inner_steps=4, outer_steps=2, latent_steps=4,
                               max_latent_tokens=8, max_new_tokens=24)


def run_demo(cfg: DemoConfig) -> dict:
    """Run the whole pipeline; returns the combined results and the paths written."""
    from recmas_ray.eval.driver import EvalConfig, evaluate
    from recmas_ray.config.training import InnerTrainConfig, OuterTrainConfig
    from recmas_ray.train.inner_job import train_all_roles
    from recmas_ray.train.pipeline import train_outer

    out = Path(cfg.output_path).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    rows = make_arithmetic_dataset(cfg.num_train + cfg.num_eval, seed=cfg.seed)
    train, heldout = split_train_eval(rows, cfg.num_eval, seed=cfg.seed)
    train_file, eval_file = write_jsonl(train, out / "train.jsonl"), write_jsonl(heldout, out / "heldout.jsonl")
    models = role_models(cfg.style, cfg.preset)
    for name in sorted(set(models.values())):  # convert GGUF -> safetensors once, before workers need it
        print(f"[demo] preparing {name}: {resolve_model_path(name)}", flush=True)

    print(f"[demo] inner loop: {list(models)} on {models}", flush=True)
    inner_dirs = train_all_roles(
        InnerTrainConfig(style="sequential", mas_role="all", dataset_name=str(train_file), save_dir=str(out / "inner"),
                         max_steps=cfg.inner_steps, batch_size=2, warmup_steps=2, save_every=cfg.inner_steps,
                         seed=cfg.seed, num_workers=0, progress=cfg.progress, max_length=512, role_model=models))
    overrides = {role: str(path) for role, path in inner_dirs.items()}

    print("[demo] outer loop", flush=True)
    outer = train_outer(OuterTrainConfig(
        style=cfg.style, ckpt_override=overrides, preset=cfg.preset, dataset_name=str(train_file),
        save_dir=str(out / "outer"), num_recursive_rounds=cfg.outer_rounds, max_latent_tokens=cfg.max_latent_tokens,
        max_steps=cfg.outer_steps, batch_size=1, lr=cfg.lr, warmup_steps=1, save_every=cfg.outer_steps,
        seed=cfg.seed, cpus_per_worker=0.5))
    overrides["outer"] = str(outer.save_dir)

    results, rows_for_plot = {}, []
    for r in cfg.rounds:
        print(f"[demo] evaluation at R={r}", flush=True)
        ev = evaluate(EvalConfig(
            style=cfg.style, dataset=str(eval_file), preset=cfg.preset, ckpt_override=overrides,
            methods=["recursive_mas", "recursive_textmas"], num_recursive_rounds=r, latent_steps=cfg.latent_steps,
            decode=DecodeConfig(max_new_tokens=cfg.max_new_tokens), batch_size=4, backend=cfg.backend,
            placement=PlacementConfig(preset="cpu"), output_path=str(out / f"eval_R{r}"), seed=cfg.seed),
            progress=cfg.progress)
        for key, value in ev["results"].items():
            results[f"R={r}/{value['method']}"] = {**value, "benchmark": f"heldout R={r}"}
            rows_for_plot.append({"method": value["method"], "rounds": r, "accuracy": value.get("accuracy,strict"),
                                  "tokens_per_sample": value.get("tokens_per_sample,none"),
                                  "seconds_per_sample": value.get("seconds_per_sample,none")})
    table = markdown_table(results)
    plot = plot_vs_rounds(rows_for_plot, out / "demo_vs_rounds.png")
    (out / "demo_results.json").write_text(json.dumps({"results": results, "outer_log": outer.log[-5:]},
                                                      indent=2, default=str))
    print("\n" + table, flush=True)
    print(f"\n[demo] plot: {plot}\n[demo] results: {out / 'demo_results.json'}", flush=True)
    return {"results": results, "table": table, "plot": str(plot), "output_path": str(out)}
