"""The main job: real heterogeneous language models collaborating in latent space, trained and evaluated.

On a local Ray cluster (or the one `ray job submit` runs in), offline:
  1. generate multi-step arithmetic word problems (train / held-out split)
  2. train the sequential style's inner links (three roles at once), then its outer links
  3. evaluate RecursiveMAS and Recursive-TextMAS on the held-out split at R = 1, 2, 3
  4. print the results table and write the plot

  python jobs/demo.py                    # real small models (SmolLM2-135M, Gemma-3-270M), ~15 min on 2 cores
  python jobs/demo.py --quick            # ~2 minutes
  python jobs/demo.py --preset tiny --quick --backend local   # seconds-scale smoke run
"""

import argparse
import dataclasses
import sys



def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo", choices=["demo", "tiny"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--backend", default="ray", choices=["ray", "local"])
    p.add_argument("--output_path", default="out/demo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no_progress", action="store_true")
    args = p.parse_args(argv)

    from recmas_ray.demo import DemoConfig, quick, run_demo
    from recmas_ray.distributed.driver import init_ray

    cfg = DemoConfig(preset=args.preset, backend=args.backend, output_path=args.output_path, seed=args.seed,
                     progress=not args.no_progress)
    if args.quick:
        cfg = quick(cfg)
    try:
        init_ray()
        run_demo(dataclasses.replace(cfg))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
