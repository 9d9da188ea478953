r"""Inner-loop training: warm-start each role's inner link on its frozen base model, with Ray Train.

Flags follow the original `train_inner.py`; every InnerTrainConfig field is a flag (see --help).
`--mas_role all` trains every role of the style at once, one Ray Train run per role, each on its own
base model (`--preset` picks them) and writing <save_dir>/<role>/.

Examples (CPU, offline, tiny random models and the generated arithmetic set):
  python jobs/train_inner.py --model_name_or_path tiny:qwen3 --mas_design sequential --mas_role planner \
      --dataset_name synthetic:256 --save_dir checkpoints/inner/planner --max_steps 100 --num_workers 0
  python jobs/train_inner.py --mas_design sequential --mas_role all --preset tiny \
      --dataset_name synthetic:256 --save_dir checkpoints/inner --max_steps 200 --lr 1e-3
  python jobs/run.py --style sequential --preset tiny --dataset questions.jsonl \
      --ckpt_override planner=checkpoints/inner/planner critic=checkpoints/inner/critic solver=checkpoints/inner/solver
Resume a stopped run (same flags plus --resume; ends with the weights of an uninterrupted run):
  python jobs/train_inner.py ... --resume
On a cluster (one GPU per role, shared storage for checkpoints):
  ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- \
      python jobs/train_inner.py --mas_design sequential --mas_role all --preset paper \
      --dataset_name RecursiveMAS/Sequential-Math --save_dir /mnt/shared/inner --storage_path /mnt/shared/ray \
      --use_gpu --num_workers 1 --dtype bfloat16 --max_steps 20000 --max_failures 3
"""

import argparse
import ast
import dataclasses
import inspect
import sys


from recmas_ray.distributed.driver import init_ray
from recmas_ray.train import inner
from recmas_ray.train.inner import InnerTrainConfig


def _field_docs(cls) -> dict[str, str]:
    """Attribute docstrings (the string under each dataclass field) -> CLI help."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for prev, node in zip(body, body[1:]):
        if isinstance(prev, ast.AnnAssign) and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docs[prev.target.id] = " ".join(str(node.value.value).split())
    return docs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    docs = _field_docs(InnerTrainConfig)
    for f in dataclasses.fields(InnerTrainConfig):
        kind, help_ = str(f.type), docs.get(f.name, "")
        if kind == "bool":
            if f.default:
                p.add_argument(f"--no_{f.name}", dest=f.name, action="store_false", help=help_)
            else:
                p.add_argument(f"--{f.name}", action="store_true", help=help_)
            continue
        conv = int if kind.startswith("int") else float if kind.startswith("float") else str
        default = None if f.name == "model_name_or_path" else f.default  # required unless --preset
        p.add_argument(f"--{f.name}", type=conv, default=default, help=f"{help_} (default {default})")
    p.add_argument("--style", dest="mas_design", default=argparse.SUPPRESS, help="same as --mas_design")
    p.add_argument("--preset", default=None, choices=["tiny", "demo", "paper"],
                   help="base model of each role from recmas_ray.system.presets (instead of --model_name_or_path)")
    return p


def config_from_args(args) -> tuple[InnerTrainConfig, dict[str, str] | None]:
    """(config, per-role base models or None)."""
    from recmas_ray.system.presets import role_models

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(InnerTrainConfig)}
    if args.preset and args.model_name_or_path:
        raise ValueError("give either --model_name_or_path or --preset, not both")
    if not args.preset and not args.model_name_or_path:
        raise ValueError("--model_name_or_path is required (or --preset tiny|demo|paper to pick one per role)")
    models = role_models(args.mas_design, args.preset) if args.preset else None
    if models is None:
        return InnerTrainConfig(**values), None
    if args.mas_role != "all":
        from recmas_ray.styles import get_style
        from recmas_ray.train.data import canonical_role

        values["model_name_or_path"] = models[canonical_role(get_style(args.mas_design), args.mas_role)]
    else:
        values["model_name_or_path"] = next(iter(models.values()))
    return InnerTrainConfig(**values), models


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg, models = config_from_args(args)
        if cfg.mas_role == "all":
            init_ray()
            dirs = inner.train_all_roles(cfg, None, role_models=models)
        else:
            role = inner.validate_config(cfg)[1]
            if cfg.num_workers > 0:
                init_ray()
            dirs = {role: inner.train_inner(cfg)}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for role, path in dirs.items():
        print(f"{role}: {path}")
    print("use with: python jobs/run.py --style " + cfg.mas_design + " --ckpt_override "
          + " ".join(f"{r}={p}" for r, p in dirs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
