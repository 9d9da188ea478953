"""The Python steps of `jobs/gpu_check.sh` and its one result file.

    python -m jobs.bench.gpu_check env         OUT DEVICE          # card, HBM floor, versions, wheels, internals
    python -m jobs.bench.gpu_check latent_step OUT DEVICE [--tiny] # latent step vs the HBM floor, 1 / 8 / 64 rows
    python -m jobs.bench.gpu_check costs       OUT DEVICE [--tiny] # the scaling model's cost table (scale_fit)
    python -m jobs.bench.gpu_check compare     OUT RUN_A RUN_B     # two runs' predictions, sample by sample
    python -m jobs.bench.gpu_check record      OUT NAME RC SECONDS LIMIT [RESULT_JSON]

Each measuring step writes its figures to OUT/NAME.part.json; `record` (the shell runs it after every step,
whatever the step's status) folds that file, the step's exit status, seconds and limit into OUT/gpu_check.json
and removes the part, so the result is one JSON that is complete up to the last finished step even if the
machine is taken back mid-run. Nothing here imports Ray.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import sys
import time
from types import SimpleNamespace

from recmas_ray.eval.samples import read_samples, sample_key
from recmas_ray.models.registry import TINY

# HBM bandwidth by card, bytes/s, from NVIDIA's datasheets (H100 Tensor Core GPU datasheet: SXM 3.35 TB/s,
# PCIe 2 TB/s, NVL 3.9 TB/s; H200 datasheet: SXM and NVL 4.8 TB/s). The first name contained in the device's
# name wins, so the more specific names come first.
HBM_BYTES_PER_S = (("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("H200", 4.8e12))
TESTED = {"torch": "2.13.0", "transformers": ">=4.57,<5.40 (5.24, 5.25 and 4.57.6 tested)", "ray": "2.60.0"}
"""The versions the project is tested with (pyproject.toml); a device image's own may differ (env records it)."""
RESULT = "gpu_check.json"


def hbm_floor(name: str) -> tuple[str | None, float | None]:
    """(matched card, HBM bytes/s) for a device name, (None, None) when the card is not in the table."""
    for card, bw in HBM_BYTES_PER_S:
        if card.lower() in name.lower():
            return card, bw
    return None, None


def _torch():
    """torch, for the measuring steps: `record` runs after every step, whatever failed in it (an image whose torch
    does not import included), so this module's top imports neither torch nor transformers."""
    import torch  # lazy: `record` must run where torch does not import (see _torch)

    return torch


def _transformers():
    """transformers, for the measuring steps (see `_torch`)."""
    import transformers  # lazy: `record` must run where transformers does not import (see _torch)

    return transformers


def device_name(device: str) -> str:
    torch = _torch()
    return torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else platform.processor() or "cpu"


def probe_internals() -> dict:
    """The transformers internals the KV-cache code touches (recmas_ray/engine/kv_cache.py, scheduler.py): a cache
    with `.layers`, each with `.keys` / `.values`; a static cache's `lazy_initialization` and `max_cache_len`;
    the forward's cache keyword. Checked on a tiny model, so a device image whose transformers moved them is
    named in one line here rather than as a traceback deep in a later step."""
    torch = _torch()
    out = {"ok": False, "missing": []}
    try:
        from recmas_ray.models.loader import load_frozen_model  # lazy: a failing import is recorded, not raised

        model, tok = load_frozen_model(TINY.name("llama"), dtype=torch.float32)
        ids = tok(["probe"], return_tensors="pt")["input_ids"]
        res = model(input_ids=ids, use_cache=True)
        cache = getattr(res, "past_key_values", None) or getattr(res, "cache", None)
        layers = getattr(cache, "layers", None)
        if layers is None:
            out["missing"].append(f"{type(cache).__name__}.layers")
        elif not all(hasattr(layers[0], a) for a in ("keys", "values")):
            out["missing"].append(f"{type(layers[0]).__name__}.keys/.values")
        from transformers import StaticCache  # lazy: a transformers without it is recorded, not raised

        try:
            static = StaticCache(config=model.config, max_cache_len=8)
        except TypeError:  # older signatures took max_batch_size too
            static = StaticCache(config=model.config, max_batch_size=1, max_cache_len=8)
        first = static.layers[0] if hasattr(static, "layers") else None
        for attr in ("lazy_initialization", "max_cache_len"):
            if first is None or not hasattr(first, attr):
                out["missing"].append(f"StaticCache layer .{attr}")
        out["cache_class"] = type(cache).__name__
    except Exception as e:  # recorded, not raised: the other steps still run and say what they found
        out["missing"].append(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
    out["ok"] = not out["missing"]
    return out


def env(out: str, device: str) -> dict:
    torch, transformers = _torch(), _transformers()
    try:
        import ray  # lazy: optional on a device image (recorded as None)

        ray_version = ray.__version__
    except ImportError:
        ray_version = None
    name = device_name(device)
    card, bw = hbm_floor(name) if device == "cuda" else (None, None)
    wheels = sorted(f for f in os.listdir(".whl") if f.endswith(".whl")) if os.path.isdir(".whl") else []
    report = {"device": device, "device_name": name, "num_gpus": torch.cuda.device_count(),
              "gpu_memory_gib": (torch.cuda.get_device_properties(0).total_memory / 2**30
                                 if device == "cuda" and torch.cuda.is_available() else None),
              "hbm_card": card, "hbm_bytes_per_s": bw, "python": platform.python_version(),
              "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
              "ray": ray_version, "tested_with": TESTED, "wheels_installed": wheels,
              "internals": probe_internals(), "loadavg_1_5_15": list(os.getloadavg())}
    if device == "cuda" and card is None:
        print(f"warning: no HBM bandwidth known for {name!r} (known: {[c for c, _ in HBM_BYTES_PER_S]}); "
              "latent_step reports no floor", flush=True)
    if not report["internals"]["ok"]:
        print(f"warning: transformers {transformers.__version__} lacks {report['internals']['missing']}; the engine "
              f"steps may fail (tested with {TESTED['transformers']})", flush=True)
    return report


def _from_config(cfg, dtype):
    """`AutoModelForCausalLM.from_config` with the dtype keyword of this transformers (dtype since 4.56,
    torch_dtype before)."""
    auto = _transformers().AutoModelForCausalLM
    try:
        return auto.from_config(cfg, dtype=dtype)
    except TypeError:
        return auto.from_config(cfg, torch_dtype=dtype)


TINY_SHAPES = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 4096}
"""What the dry run (--tiny) puts over any shapes: the same code path in seconds on a CPU."""


def shaped_agent(shapes: dict, device: str, dtype, *, tiny: bool = False, name: str = "random"):
    """An `Agent` on a random-weight model of `shapes` (a `scale_fit.DEMO_SHAPES` entry or Qwen2.5-1.5B's;
    `tiny`: with `TINY_SHAPES` over them), with the tiny byte-level tokenizer (its ids fit any vocabulary):
    nothing is downloaded."""
    from recmas_ray.engine.agent import Agent  # lazy: imports torch (see _torch)
    from recmas_ray.engine.links import InnerLink  # lazy: imports torch (see _torch)
    from recmas_ray.models.loader import load_frozen_model  # lazy: imports torch (see _torch)

    torch, transformers = _torch(), _transformers()
    kw = {k: v for k, v in shapes.items() if k != "family"} | (TINY_SHAPES if tiny else {})
    cls = {"llama": transformers.LlamaConfig, "gemma3": transformers.Gemma3TextConfig,
           "qwen2": transformers.Qwen2Config}[shapes["family"]]
    _, tok = load_frozen_model(TINY.name("qwen3"), dtype=torch.float32)
    torch.manual_seed(0)
    model = _from_config(cls(**kw), dtype).to(device).eval().requires_grad_(False)
    return Agent(model, tok, InnerLink(kw["hidden_size"]), role="planner", model_name=name)


QWEN25_15B = {"family": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
              "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
              "max_position_embeddings": 32768, "tie_word_embeddings": True}
"""Qwen2.5-1.5B's config.json shapes (its model card's config), built with no download."""


def latent_step(out: str, device: str, tiny: bool) -> dict:
    """One latent step and one decoded token (`jobs.bench.perf.step_cost`) of Qwen2.5-1.5B's shapes, bf16, at
    1 / 8 / 64 rows (dry run: `TINY_SHAPES`, 1 / 2 rows), against the HBM floor: the bytes of the weights a latent
    step reads (its layers: not the embedding table or the LM head) / the detected card's bandwidth."""
    from jobs.bench.perf import step_cost  # lazy: imports torch (see _torch)

    torch = _torch()
    agent = shaped_agent(QWEN25_15B, device, torch.bfloat16, tiny=tiny, name="random:qwen2.5-1.5b-shapes")
    step_bytes = sum(p.numel() * p.element_size() for p in agent.model.model.layers.parameters())
    card, bw = hbm_floor(device_name(device)) if device == "cuda" else (None, None)
    floor_ms = step_bytes / bw * 1e3 if bw else None
    report = {"device_name": device_name(device), "hbm_card": card, "hbm_bytes_per_s": bw,
              "layers": len(agent.model.model.layers), "step_weight_bytes": step_bytes, "hbm_floor_ms": floor_ms,
              "rows": {}}
    with torch.no_grad():
        for rows in (1, 2) if tiny else (1, 8, 64):
            cost = step_cost(agent, [f"Question {i}: what is {i} + 7? Make a short plan." for i in range(rows)],
                             SimpleNamespace(repeats=1 if tiny else 3))
            step_ms = cost["latent_step_s"] * 1e3
            report["rows"][str(rows)] = {**cost, "latent_step_ms": step_ms,
                                         "x_floor": step_ms / floor_ms if floor_ms else None}
            print(f"{rows:3d} rows: {step_ms:.3f} ms per latent step, {cost['decoded_token_s'] * 1e3:.3f} per decoded "
                  f"token" + (f"; {step_ms / floor_ms:.1f}x the HBM floor of {floor_ms:.3f} ms ({card})"
                              if floor_ms else ""), flush=True)
    return report


def costs(out: str, device: str, tiny: bool) -> dict:
    """`scale_fit.measure_agent` on random-weight models of the demo models' shapes, bf16 on a GPU (fp32 on
    the CPU dry run: `TINY_SHAPES`, rows 1 / 2, 2 steps), and their fit: the input of `python -m jobs.bench.scale_fit
    --from_json gpu_check.json`."""
    from jobs.bench.scale_fit import DEMO_SHAPES, fit_all, measure_agent  # lazy: imports torch (see _torch)

    torch = _torch()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    rows = [1, 2] if tiny else [1, 4, 16, 64]
    measurements = []
    for name, shapes in DEMO_SHAPES.items():
        agent = shaped_agent(shapes, device, dtype, tiny=tiny, name=name)
        m = measure_agent(agent, rows, repeats=1 if tiny else 3, steps=2 if tiny else 16,
                          clock="cpu" if device == "cpu" else "wall")
        m.update({"weights": "random", "dtype": str(dtype).removeprefix("torch."), "layers": len(agent.model.model.layers)})
        measurements.append(m)
        del agent
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"device_name": device_name(device), "measurements": measurements, "fit": fit_all(measurements)}


def compare(out: str, run_a: str, run_b: str) -> dict:
    """The predictions of two runs' samples files, sample by sample (read as a resume reads them)."""
    def predictions(folder):
        return {sample_key(r): r["prediction"] for path in glob.glob(os.path.join(folder, "samples_*.jsonl"))
                for r in read_samples(path)}

    a, b = predictions(run_a), predictions(run_b)
    same = sum(a[k] == b.get(k) for k in a)
    print(f"same predictions: {same} of {len(a)} (the second run has {len(b)})", flush=True)
    if not a or same != len(a) or len(a) != len(b):
        raise RuntimeError(f"predictions differ: {same} of {len(a)} equal, {len(b)} in the second run")
    return {"samples": len(a), "same_predictions": same}


def record(out: str, name: str, rc: int, seconds: float, limit: float, part: str | None) -> None:
    """Fold one step into OUT/gpu_check.json (written whole to a temporary file, then renamed)."""
    path = os.path.join(out, RESULT)
    data = json.load(open(path)) if os.path.exists(path) else {"steps": {}}
    status = "ok" if rc == 0 else "timeout" if rc in (124, 137) else "skipped" if rc < 0 else "failed"
    entry = {"status": status, "rc": rc, "seconds": seconds, "limit_s": limit}
    if part and os.path.exists(part):
        try:
            entry["result"] = json.load(open(part))
        except ValueError as e:
            entry["result_error"] = f"{part}: {e}"
        if part.endswith(".part.json"):
            os.remove(part)
    data["steps"][name] = entry
    data["updated"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def main(argv: list[str]) -> int:
    usage = __doc__.split("\n\n")[1]
    if len(argv) < 2:
        print(f"error: expected a step and OUT; usage:\n{usage}", file=sys.stderr)
        return 2
    step, out, rest = argv[0], argv[1], argv[2:]
    if step == "record":
        record(out, rest[0], int(rest[1]), float(rest[2]), float(rest[3]), rest[4] if len(rest) > 4 else None)
        return 0
    tiny = "--tiny" in rest
    rest = [a for a in rest if a != "--tiny"]
    steps = {"env": lambda: env(out, rest[0]), "latent_step": lambda: latent_step(out, rest[0], tiny),
             "costs": lambda: costs(out, rest[0], tiny), "compare": lambda: compare(out, rest[0], rest[1])}
    if step not in steps or not rest:
        print(f"error: step {step!r} with {rest}; usage:\n{usage}", file=sys.stderr)
        return 2
    result = steps[step]()
    with open(os.path.join(out, f"{step}.part.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
