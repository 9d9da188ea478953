"""The examples in README.md and docs/ run as written: the README's Python API block and its `jobs.run` command,
the role-model command of docs/usage.md, the Python training block of docs/training.md and the lm-eval command of
docs/serving.md (tiny models, in a scratch directory holding a copy of jobs/examples)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(page: str) -> list[str]:
    """The ```python blocks of one page (a path relative to the repository root), in order."""
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), re.S)


def command(page: str, prefix: str, *, containing: str = "") -> list[str]:
    """The page's first bash command that starts with `prefix` and holds `containing` (backslash continuations
    joined, a trailing `# comment` dropped), as argv."""
    text = (ROOT / page).read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            if cmd.strip().startswith(prefix) and containing in cmd:
                return shlex.split(cmd.split(" # ")[0])
    raise AssertionError(f"no command starting with {prefix!r} (holding {containing!r}) in {page}")


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "jobs" / "examples", tmp_path / "jobs" / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_python_api_block_runs_as_written(scratch, tiny_cache, capsys):
    code = python_blocks("README.md")[0]
    assert 'backend="local"' in code and "rm.System.build" in code
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "planner 1 rollout 8 0" in out and "recursive_textmas" in out
    assert out.count("|Tasks|Method|") == 1  # evaluate returns its table; the block's print shows it once
    assert list((scratch / "out" / "api").glob("results_*.json"))


def test_readme_command_line_example_runs_as_written(scratch, tiny_cache):
    from jobs import run as run_job

    argv = command("README.md", "python -m jobs.run", containing="--output_path out/cli")
    assert "--backend" in argv and argv[argv.index("--backend") + 1] == "local"
    assert run_job.main(argv[3:] + ["--no_progress"]) == 0
    assert list((scratch / "out" / "cli").glob("results_*.json"))


def test_role_model_command_runs_as_written(scratch, tiny_cache):
    from jobs import run as run_job

    argv = command("docs/usage.md", "python -m jobs.run", containing="--role_model")
    assert run_job.main(argv[3:] + ["--no_progress"]) == 0
    assert list((scratch / "out" / "roles").glob("results_*.json"))


@pytest.mark.integration  # Ray Train runs for the inner and outer links
def test_training_block_runs_as_written(scratch, ray_cluster, capsys):
    code = python_blocks("docs/training.md")[0]
    exec(compile(code, "docs/training.md", "exec"), {"__name__": "__readme__"})
    for role in ("planner", "critic", "solver", "outer"):
        assert (scratch / "ckpt" / "api" / role / "links.safetensors").exists(), role
    assert "ckpt/api/outer" in capsys.readouterr().out


@pytest.mark.integration  # a fresh interpreter with lm-eval, torch and three models
def test_lm_eval_command_runs_as_written(scratch, tiny_cache):
    pytest.importorskip("lm_eval")
    argv = command("docs/serving.md", "lm_eval --model recmas_ray")  # lm-eval's own script; the .pth hook registers it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_DATASETS_CACHE": str(scratch / "ds_cache"), "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / argv[0]), *argv[1:]], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(scratch.glob("results/lm_eval/**/results_*.json")) and \
        list(scratch.glob("results/lm_eval/**/samples_recmas_questions_*.jsonl"))


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_docs_links_point_at_files_and_headings_that_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            linked = (page.parent / target) if target else page
            assert linked.exists(), f"{page.relative_to(ROOT)} links to missing {target}"
            if anchor:
                assert anchor in anchors(linked), f"{page.relative_to(ROOT)} links to missing {target}#{anchor}"


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
