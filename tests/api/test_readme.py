"""The README's section "Python API, serving and lm-eval" runs as written: its Python blocks, its jobs/run.py
command and its lm-eval command (tiny models, in a scratch directory holding a copy of jobs/examples)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Python API, serving and lm-eval"


def section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end > 0 else None]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", section(), re.S)


def command(prefix: str) -> list[str]:
    """The README's bash command starting with `prefix` (backslash continuations joined), as argv."""
    for block in re.findall(r"```bash\n(.*?)```", section(), re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            if cmd.strip().startswith(prefix):
                return shlex.split(cmd.split(" # ")[0])
    raise AssertionError(f"no command starting with {prefix!r} in the README section")


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "jobs" / "examples", tmp_path / "jobs" / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_python_api_block_runs_as_written(scratch, tiny_cache, capsys):
    code = python_blocks()[0]
    assert 'backend="local"' in code and "rm.System.build" in code
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "planner 1 rollout 8 0" in out and "recursive_textmas" in out
    assert list((scratch / "out" / "api").glob("results_*.json"))


def test_role_model_command_runs_as_written(scratch, tiny_cache):
    from jobs import run as run_job

    argv = command("python -m jobs.run")
    assert "--role_model" in argv
    assert run_job.main(argv[3:] + ["--no_progress"]) == 0
    assert list((scratch / "out" / "roles").glob("results_*.json"))


@pytest.mark.integration  # Ray Train runs for the inner and outer links
def test_training_block_runs_as_written(scratch, ray_cluster, capsys):
    code = python_blocks()[1]
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    for role in ("planner", "critic", "solver", "outer"):
        assert (scratch / "ckpt" / "api" / role / "links.safetensors").exists(), role
    assert "ckpt/api/outer" in capsys.readouterr().out


@pytest.mark.integration  # a fresh interpreter with lm-eval, torch and three models
def test_lm_eval_command_runs_as_written(scratch, tiny_cache):
    pytest.importorskip("lm_eval")
    argv = command("lm_eval --model recmas_ray")  # lm-eval's own script; the .pth hook registers the model
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_DATASETS_CACHE": str(scratch / "ds_cache"), "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / argv[0]), *argv[1:]], cwd=scratch, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(scratch.glob("results/lm_eval/**/results_*.json")) and \
        list(scratch.glob("results/lm_eval/**/samples_recmas_questions_*.jsonl"))


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
