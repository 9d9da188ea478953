"""The commands that reuse a system folder, printed at the end of each training job.

A system folder is what `--links DIR` reads everywhere (jobs.run, jobs.serve, jobs.push_links, the Python API's
`System.build(links=)`, lm-eval's `pretrained=`): one sub-folder per role with its inner link and `outer/` with the
outer links, each a `links.safetensors` + `manifest.json` checkpoint. `jobs.train_inner --mas_role all --save_dir DIR`
writes the role folders, `jobs.train_outer --links DIR` adds `DIR/outer`.
"""

from __future__ import annotations

import shlex


def system_flags(style: str, preset: str, role_models: dict[str, str] | None = None) -> list[str]:
    """The flags that name the same system again (style, preset, per-role base models given by name)."""
    flags = ["--style", style, "--preset", preset]
    if role_models:
        flags += ["--models", *[f"{r}={m}" for r, m in sorted(role_models.items())]]
    return flags


def command(job: str, *args: str) -> str:
    """`python -m jobs.<job> ARGS`, quoted for a POSIX shell."""
    return " ".join(["python", "-m", f"jobs.{job}", *map(shlex.quote, args)])


def next_commands(folder: str, *, style: str, preset: str, task: str, role_models: dict[str, str] | None = None,
                  dataset: str | None = None, outer_trained: bool = True, train_rows: str | None = None) -> list[str]:
    """Console lines: the exact commands that evaluate, serve and publish `folder` (and, before its outer links
    exist, the one that trains them into it, on `train_rows`). `dataset`: the evaluation file to name (a placeholder
    otherwise)."""
    system = system_flags(style, preset, role_models)
    lines = []
    if not outer_trained:
        lines += ["train the outer links into the same folder:",
                  "  " + command("train_outer", *system, "--links", folder, "--task", task, "--dataset_name",
                                 train_rows or "TRAIN_ROWS.jsonl")]
    lines += ["evaluate:" if outer_trained else "evaluate (fresh outer links until outer/ exists):", "  " + command("run", *system, "--links", folder, "--task", task, "--dataset",
                                          dataset or "QUESTIONS.jsonl", "--backend", "ray", "--output_path",
                                          f"{folder.rstrip('/')}_eval"),
              "serve:", "  " + command("serve", *system, "--links", folder, "--task", task, "--port", "8000"),
              "publish (real base models only):",
              "  " + command("push_links", folder, "--repo", "ORG/NAME", "--dry_run")]
    return lines
