"""Every job command written in cluster/, README.md and docs/ parses with its job's own parser (no cluster,
no models, no file system checks): a wrong flag in an example fails here, not on a cluster."""

from pathlib import Path

import pytest

from tests.cluster.job_commands import Command, find_commands, parse_command

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(p for p in (REPO / "cluster").rglob("*") if p.is_file() and p.suffix in
                    (".md", ".yaml", ".yml", ".sh", ".sbatch")), REPO / "README.md",
                  *(REPO / "docs").glob("*.md")])
COMMANDS = [c for path in SOURCES for c in find_commands(path, REPO)]


def test_the_files_hold_the_commands_we_expect():
    jobs = {(c.source, c.job) for c in COMMANDS if not c.elided}
    for expected in [("cluster/kuberay/rayjob.yaml", "run"), ("cluster/slurm/ray.sbatch", "run"),
                     ("cluster/slurm/ray.sbatch", "train_inner"), ("cluster/README.md", "run"),
                     ("cluster/README.md", "train_inner"), ("cluster/README.md", "train_outer"),
                     ("README.md", "run"), ("README.md", "train_inner"), ("README.md", "serve"),
                     ("docs/usage.md", "run"), ("docs/cluster.md", "train_outer"), ("docs/benchmarks.md", "bench.speed"),
                     ("docs/benchmarks.md", "experiments.sweep_recipe")]:
        assert expected in jobs, expected
    assert len([c for c in COMMANDS if not c.elided]) >= 15


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if not c.elided], ids=str)
def test_command_parses(cmd: Command):
    parse_command(cmd)


def test_cluster_commands_use_the_module_form():
    old = [str(c) for c in COMMANDS if c.source.startswith("cluster/")]
    text = "\n".join((REPO / p).read_text() for p in ["cluster/kuberay/rayjob.yaml", "cluster/slurm/ray.sbatch",
                                                       "cluster/submit.sh", "cluster/README.md"])
    assert "python jobs/" not in text, old


def test_a_wrong_flag_is_caught(tmp_path):
    bad = tmp_path / "rayjob.yaml"
    bad.write_text("spec:\n  entrypoint: python -m jobs.run --style sequential_scaled --dataset math500 "
                   "--storage_path /mnt/shared/recmas\n")
    (cmd,) = find_commands(bad, tmp_path)
    with pytest.raises(AssertionError, match="storage_path"):
        parse_command(cmd)
    bad.write_text("#   sbatch cluster/slurm/ray.sbatch run --style sequential_scaled --dataset math500 \\\n"
                   "#       --num_replicas many\n")
    (cmd,) = find_commands(bad, tmp_path)
    assert cmd.argv[-2:] == ["--num_replicas", "many"]
    with pytest.raises(AssertionError, match="num_replicas"):
        parse_command(cmd)
    bad.write_text("`python -m jobs.run --style sequential_light --dataset q.jsonl --placment cpu` runs it\n")
    (cmd,) = find_commands(bad.rename(tmp_path / "x.md"), tmp_path)
    with pytest.raises(AssertionError, match="placment"):
        parse_command(cmd)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-x"]))
