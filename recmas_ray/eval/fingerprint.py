"""The fingerprint of an evaluation run: everything that changes its samples, kept next to the samples file
(`samples_<bench>_<time>.fingerprint.json`). `--resume` against a different fingerprint stops before
anything is written, naming every differing field (`settings_diff`, shared with training's resume check).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
from pathlib import Path

from recmas_ray.eval.config import EvalConfig
from recmas_ray.config.resume import settings_diff
from recmas_ray.eval.samples import check_samples_file

log = logging.getLogger(__name__)


def link_hashes(plan) -> dict[str, str]:
    """sha256 (first 16 hex digits) of every link's weights, by "inner:ROLE" / "outer:EDGE"."""
    out = {}
    for kind, table in (("inner", plan.links.inner), ("outer", plan.links.outer)):
        for name, module in sorted(table.items()):
            h = hashlib.sha256()
            for key, t in sorted(module.state_dict().items()):
                h.update(key.encode())
                h.update(t.detach().cpu().contiguous().float().numpy().tobytes())
            out[f"{kind}:{name}"] = h.hexdigest()[:16]
    return out


def run_fingerprint(cfg: EvalConfig, manifest: dict, extra: dict | None = None) -> dict:
    """Everything that changes a run's samples: style, models, links (sources and hashes), methods,
    recursion (R, m, decoding), grader, format retry, seed, rollouts, question source, dtype.

    `manifest` is the plan's (`SystemPlan.manifest()`, with `link_sha256` added by the caller);
    `extra` adds fields (e.g. a prompt-set hash) in one line.
    """
    rec = dataclasses.asdict(cfg.recursion)
    rec.pop("method", None)  # set per method by the driver; `methods` below covers it
    rec.get("decode", {}).pop("seed", None)  # set from `seed`
    if rec.get("adaptive_threshold") is None:  # off: samples written before the option existed still resume
        rec.pop("adaptive_threshold", None)
    fp = {"style": cfg.system.style, "models": {r: v["base_model"] for r, v in manifest["roles"].items()},
          "links": manifest.get("sources", {}), "link_sha256": manifest.get("link_sha256", {}),
          "methods": list(cfg.methods), "recursion": rec, "grader": cfg.grader, "format_retry": cfg.format_retry,
          "seed": cfg.system.seed, "num_rollouts": cfg.num_rollouts, "dtype": cfg.system.dtype,
          # batch_size changes padding, hence (rarely) a greedy token: a resume must keep it
          "batch_size": cfg.batch_size,
          "message_dtype": cfg.system.message_dtype,  # bf16 messages change the latents the next agent reads
          # not num_samples: it only selects questions (samples are keyed by doc id), so a resume may extend it
          "dataset": {"name": cfg.dataset, "path": cfg.dataset_path, "json_field": cfg.dataset_json_field},
          "tools": dataclasses.asdict(cfg.tools) if cfg.tool_loop() is not None else None}
    fp.update(extra or {})
    return json.loads(json.dumps(fp, default=str))


def fingerprint_diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ, with both values (the shared `settings_diff`)."""
    return settings_diff(old, new, prefix)


def fingerprint_path(samples_file: Path) -> Path:
    return samples_file.with_name(samples_file.stem + ".fingerprint.json")


def read_fingerprint(side: Path) -> dict:
    """A samples file's fingerprint; a corrupt or unreadable one is one line naming it and the way out."""
    try:
        data = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--resume: fingerprint {side} is unreadable ({' '.join(str(e).split())}); it cannot "
                         "show which run wrote the samples: delete it to adopt this run's settings, or use another "
                         "--output_path") from None
    if not isinstance(data, dict):
        raise ValueError(f"--resume: fingerprint {side} holds a {type(data).__name__}, not a JSON object; delete it "
                         "to adopt this run's settings, or use another --output_path")
    return data


def bench_name(cfg: EvalConfig) -> str:
    """The benchmark's name in results and samples file names (a local file: its stem)."""
    return Path(cfg.dataset).stem if os.path.exists(cfg.dataset) else cfg.dataset


def verify_resume(cfg: EvalConfig, fp: dict) -> None:
    """With --resume, refuse (before anything is written) the latest samples file of another run."""
    existing = sorted(glob.glob(str(Path(cfg.output_path) / f"samples_{bench_name(cfg)}_*.jsonl")))
    if cfg.resume and existing:
        check_samples_file(existing[-1])  # read now: a damaged file stops the run before any model loads
        _same_run(Path(existing[-1]), fp)


def _same_run(samples_file: Path, fp: dict) -> bool:
    """True when `samples_file` has this run's fingerprint, False when it has none; else a ValueError naming
    the differing fields."""
    side = fingerprint_path(samples_file)
    if not side.exists():
        return False
    diff = fingerprint_diff(read_fingerprint(side), fp)
    if diff:
        raise ValueError(f"--resume: {samples_file.name} was written by a different run; differing "
                         f"fields: {'; '.join(diff)}. Use another --output_path or drop --resume")
    return True


def check_fingerprint(samples_file: Path, fp: dict, *, resume: bool) -> None:
    """Write the samples file's fingerprint, or (resuming) refuse one that differs, naming the fields."""
    side = fingerprint_path(samples_file)
    if resume and samples_file.exists():
        if _same_run(samples_file, fp):
            return
        log.warning("--resume: %s has no fingerprint (an older run); adopting this run's", samples_file)
    tmp = side.with_name("." + side.name + ".tmp")
    tmp.write_text(json.dumps(fp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(side)


def resolved_runtime(cfg: EvalConfig, plan) -> dict:
    """Fingerprint fields that `auto` settings hide: the device and dtype the agents really use, and the
    revision of each base model (a Hub snapshot's commit, a local model's config hash)."""
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from recmas_ray.models.loader import model_revision, resolve_dtype
    # lazy: transformers reads env settings on import; this module loads before the console sets them
    from recmas_ray.engine.service import pick_device

    device = pick_device(cfg.system.device)  # as the agents resolve it (on a Ray cluster: as seen from the driver)
    return {"device": cfg.system.device, "resolved_device": device.type,
            "resolved_dtype": str(resolve_dtype(cfg.system.dtype, device)).replace("torch.", ""),
            "model_revisions": {r: model_revision(m) for r, m in sorted(plan.role_models.items())}}
