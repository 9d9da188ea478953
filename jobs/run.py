"""Evaluate a RecursiveMAS system (and its text baselines) on a benchmark or a local question file.

Examples (CPU, offline):
  python jobs/run.py --style sequential_light --preset tiny --dataset questions.jsonl \
      --backend local --num_recursive_rounds 2 --latent_steps 8 --output_path out
  python jobs/run.py --style mixture --preset tiny --dataset questions.jsonl --backend ray \
      --method recursive_mas,recursive_textmas --num_recursive_rounds 2
  A sweep over R (one sub-directory R<r> per value, one plot across them):
  python jobs/run.py --style sequential_light --dataset questions.jsonl --num_recursive_rounds 1,2,3 --plot
On a cluster (GPU agents, one per GPU):
  ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- \
      python jobs/run.py --style sequential_scaled --preset paper --dataset math500 \
      --placement one_gpu_per_agent --device cuda --output_path /mnt/shared/results
"""

import argparse
import os
import sys


from recmas_ray.agent import DecodeConfig
from recmas_ray.distributed.placement import PRESETS, PlacementConfig
from recmas_ray.system.plan import parse_overrides
from recmas_ray.styles import get_style


def parse_role_amounts(text: str | None, flag: str) -> dict[str, float]:
    """`"science=1,math=0.5"` -> {"science": 1.0, "math": 0.5}."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        role, sep, value = item.partition("=")
        try:
            out[role] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"{flag} item {item!r} is not ROLE=NUMBER")
    return out


def parse_rounds(text: str) -> list[int]:
    """`"1,2,3"` -> [1, 2, 3] (values are checked by the evaluation config)."""
    try:
        rounds = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        rounds = []
    if not rounds:
        raise ValueError(f"--num_recursive_rounds {text!r} is not an integer or a comma list of integers")
    return rounds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--style", required=True)
    p.add_argument("--dataset", required=True, help="benchmark name or a local .jsonl/.json file")
    p.add_argument("--dataset_path", default=None, help="local copy of a named benchmark")
    p.add_argument("--dataset_json_field", default=None)
    p.add_argument("--preset", default="tiny", help="tiny | demo | paper")
    p.add_argument("--ckpt_override", action="extend", nargs="+", default=[], metavar="ROLE=PATH")
    p.add_argument("--method", default="recursive_mas", help="comma list of recursive_mas, recursive_textmas, "
                   "textmas, single_agent")
    p.add_argument("--num_recursive_rounds", default="3", help="R, or a comma list of R values to sweep")
    p.add_argument("--latent_steps", type=int, default=32)
    p.add_argument("--num_samples", type=int, default=None)
    p.add_argument("--num_rollouts", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_inflight_batches", type=int, default=2, help="ray: client actors (batches in flight)")
    p.add_argument("--client_cpus", type=float, default=0.25, help="ray: logical CPUs per client actor")
    p.add_argument("--client_max_restarts", type=int, default=-1,
                   help="ray: restarts of a dead client actor (-1: no limit, 0: a dead client ends the run)")
    p.add_argument("--no_format_retry", action="store_true", help="disable the answer-format retry")
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--do_sample", action="store_true", help="sample (T, top_p) instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top_p", type=float, default=0.95)
    p.add_argument("--decode_every_round", action="store_true", help="mixture reference behaviour")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--backend", default="ray", choices=["ray", "local"])
    p.add_argument("--placement", default="cpu", choices=list(PRESETS))
    p.add_argument("--role_gpus", default=None, help="per-role GPUs, e.g. science=1,math=0.5")
    p.add_argument("--role_cpus", default=None, help="per-role logical CPUs")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--grader", default="strict", choices=["strict", "reference"])
    p.add_argument("--output_path", default="out")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--plot", action="store_true")
    p.add_argument("--timeout_s", type=float, default=900.0)
    p.add_argument("--torch_threads", type=int, default=0)
    p.add_argument("--transport", default="object_store", choices=["object_store", "rdt:gloo", "rdt:nccl"],
                   help="latents between agents: object store, or Ray Direct Transport (alpha)")
    p.add_argument("--tavily_keys_file", default=None, help="deliberation search: one Tavily key per line "
                   "(TAVILY_API_KEY is used too); read on the toolcaller's machine")
    p.add_argument("--max_tool_rounds", type=int, default=5, help="deliberation: tool calls per sample")
    p.add_argument("--python_timeout", type=float, default=10.0, help="deliberation: seconds per Python call")
    p.add_argument("--no_progress", action="store_true")
    return p


def config_from_args(args):
    from recmas_ray.eval.driver import EvalConfig

    placement = PlacementConfig(preset=args.placement, role_gpus=parse_role_amounts(args.role_gpus, "--role_gpus"),
                                role_cpus=parse_role_amounts(args.role_cpus, "--role_cpus"))
    decode = DecodeConfig(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                          temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    tools = None
    if get_style(args.style).name == "deliberation":
        from recmas_ray.tools.loop import ToolLoopConfig

        tools = ToolLoopConfig(max_tool_rounds=args.max_tool_rounds, python_timeout_s=args.python_timeout,
                               tavily_keys_file=args.tavily_keys_file)
    return EvalConfig(
        style=args.style, dataset=args.dataset, dataset_path=args.dataset_path,
        dataset_json_field=args.dataset_json_field, preset=args.preset,
        ckpt_override=parse_overrides(args.ckpt_override), methods=[m.strip() for m in args.method.split(",")],
        num_recursive_rounds=parse_rounds(args.num_recursive_rounds)[0], latent_steps=args.latent_steps, decode=decode,
        decode_every_round=args.decode_every_round, num_samples=args.num_samples, num_rollouts=args.num_rollouts,
        batch_size=args.batch_size, max_inflight_batches=args.max_inflight_batches, backend=args.backend,
        placement=placement, device=args.device, dtype=args.dtype, seed=args.seed, grader=args.grader,
        output_path=args.output_path, resume=args.resume, plot=args.plot, timeout_s=args.timeout_s,
        torch_threads=args.torch_threads, transport=args.transport, tools=tools, client_cpus=args.client_cpus,
        client_max_restarts=args.client_max_restarts, format_retry=not args.no_format_retry)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import dataclasses

    from recmas_ray.eval.driver import bench_name, evaluate, plot_results

    try:
        cfg = config_from_args(args)
        rounds = parse_rounds(args.num_recursive_rounds)
        if len(rounds) == 1:
            outs = [evaluate(cfg, progress=not args.no_progress)]
        else:  # one sub-directory per R, so --resume finds each R's own samples file
            outs = [evaluate(dataclasses.replace(cfg, num_recursive_rounds=r, plot=False,
                                                 output_path=os.path.join(cfg.output_path, f"R{r}")),
                             progress=not args.no_progress) for r in rounds]
            if cfg.plot:
                outs[-1]["plot_path"] = str(plot_results(cfg.output_path, bench_name(cfg), cfg.style))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a failed or timed-out run; finished samples are on disk
        print(f"error: {e}", file=sys.stderr)
        return 1
    for out in outs:
        print(f"samples: {out['samples_path']}\nresults: {out['results_path']}")
    if "plot_path" in outs[-1]:
        print(f"plot: {outs[-1]['plot_path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
