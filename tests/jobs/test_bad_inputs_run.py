"""Bad input to `jobs/run.py`: one clear line on stderr, exit status 2, no model loaded, nothing written.

Each row is a command line a user could type; the test runs the job in-process with model loading and
agent start-up replaced by failures, so a row that got past validation fails loudly instead of hanging.
"""

import json
from pathlib import Path

import pytest

from jobs import run as run_job
from tests.conftest import write_jsonl

GOOD = ["--style", "sequential_light", "--preset", "tiny", "--backend", "local"]


def _bad_rows(tmp):
    """(id, extra argv, expected fragment of the error line)."""
    (tmp / "not_a_dir").write_text("x")
    (tmp / "bad.json").write_text("{not json")
    (tmp / "unknown_key.json").write_text(json.dumps({"recursion": {"latent_stpes": 3}}))
    (tmp / "empty.jsonl").write_text("")
    write_jsonl(tmp / "fieldless.jsonl", [{"question": "q?"}, {"prompt": "x"}])
    (tmp / "keys_dir").mkdir()
    return [
        ("style", ["--style", "pipeline"], "--style 'pipeline': expected one of"),
        ("method", ["--method", "telepathy"], "'telepathy': expected one of"),
        ("method_in_list", ["--method", "recursive_mas,tele"], "'tele': expected one of"),
        ("preset", ["--preset", "huge"], "--preset 'huge'"),
        ("latent_negative", ["--latent_steps", "-1"], "--latent_steps -1: expected an integer in [0, 4096]"),
        ("latent_huge", ["--latent_steps", "1000000000"], "expected an integer in [0, 4096]"),
        ("latent_text", ["--latent_steps", "many"], "expected an integer, got 'many'"),
        ("latent_alias", ["--latent_length", "99999"], "--latent_steps 99999"),
        ("rounds_zero", ["--num_recursive_rounds", "0"], "--num_recursive_rounds 0"),
        ("rounds_huge", ["--num_recursive_rounds", "1000000"], "expected an integer in [1, 32]"),
        ("sweep_zero", ["--sweep_rounds", "1,0"], "--sweep_rounds 0"),
        ("samples_zero", ["--num_samples", "0"], "--num_samples 0"),
        ("samples_negative", ["--num_samples", "-1"], "--num_samples -1"),
        ("rollouts_zero", ["--num_rollouts", "0"], "--num_rollouts 0"),
        ("batch_zero", ["--batch_size", "0"], "--batch_size 0"),
        ("clients_negative", ["--max_inflight_batches", "-1"], "--num_clients -1"),
        ("client_cpus", ["--client_cpus", "-1"], "--client_cpus -1"),
        ("timeout_negative", ["--timeout_s", "-1"], "--timeout_s -1"),
        ("timeout_zero", ["--timeout_s", "0"], "--timeout_s 0"),
        ("timeout_nan", ["--timeout_s", "nan"], "--timeout_s nan"),
        ("top_p_high", ["--top_p", "2"], "--top_p 2.0: expected a number in (0, 1]"),
        ("top_p_zero", ["--top_p", "0"], "--top_p 0.0"),
        ("temperature_zero", ["--temperature", "0"], "--temperature 0.0"),
        ("temperature_negative", ["--temperature", "-1"], "--temperature -1.0"),
        ("tokens_zero", ["--max_new_tokens", "0"], "--max_new_tokens 0"),
        ("tokens_huge", ["--max_new_tokens", "100000000"], "--max_new_tokens 100000000"),
        ("top_k_negative", ["--top_k", "-3"], "--top_k -3"),
        ("seed_negative", ["--seed", "-1"], "--seed -1"),
        ("threads_negative", ["--torch_threads", "-1"], "--torch_threads -1"),
        ("grader", ["--grader", "lenient"], "--grader 'lenient'"),
        ("backend", ["--backend", "spark"], "--backend 'spark'"),
        ("transport", ["--transport", "tcp"], "--transport 'tcp'"),
        ("device", ["--device", "tpu"], "--device 'tpu'"),
        ("dtype", ["--dtype", "int8"], "--dtype 'int8'"),
        ("placement", ["--placement", "nowhere"], "--placement 'nowhere'"),
        ("role_gpus_role", ["--backend", "ray", "--placement", "one_gpu_per_agent", "--role_gpus", "science=1"],
         "--role_gpus names ['science']"),
        ("role_gpus_value", ["--role_gpus", "planner=x"], "expected a number, got 'x'"),
        ("role_gpus_shape", ["--role_gpus", "planner"], "item 'planner' is not KEY=VALUE"),
        ("role_gpus_negative", ["--placement", "one_gpu_per_agent", "--role_gpus", "planner=-1"], "--role_gpus -1.0"),
        ("role_gpus_cpu", ["--role_gpus", "planner=1"], "--placement cpu cannot give GPUs"),
        ("nccl_on_cpu", ["--backend", "ray", "--transport", "rdt:nccl", "--device", "cpu"], "rdt:nccl"),
        ("rdt_local", ["--transport", "rdt:gloo"], "needs --backend ray"),
        ("ckpt_role", ["--ckpt_override", f"summarizer={tmp}"], "--ckpt_override names ['summarizer']"),
        ("ckpt_missing", ["--ckpt_override", f"planner={tmp}/nope"], "no such folder"),
        ("ckpt_shape", ["--ckpt_override", "planner"], "item 'planner' is not KEY=VALUE"),
        ("dataset_missing", ["--dataset", str(tmp / "missing.jsonl")], "missing.jsonl' does not exist"),
        ("dataset_path_missing", ["--dataset", "math500", "--dataset_path", str(tmp / "m.jsonl")],
         "--dataset_path"),
        ("dataset_empty", ["--dataset", str(tmp / "empty.jsonl")], "empty.jsonl"),
        ("dataset_fieldless", ["--dataset", str(tmp / "fieldless.jsonl")], "row"),
        ("output_under_file", ["--output_path", str(tmp / "not_a_dir" / "out")], "cannot be created"),
        ("output_is_file", ["--output_path", str(tmp / "not_a_dir")], "is not a directory"),
        ("config_missing", ["--config", str(tmp / "nope.json")], "--config"),
        ("config_invalid", ["--config", str(tmp / "bad.json")], "is not valid JSON"),
        ("config_unknown_key", ["--config", str(tmp / "unknown_key.json")], "unknown setting(s) ['latent_stpes']"),
        ("unknown_flag", ["--frobnicate", "3"], "unrecognized arguments: --frobnicate"),
        ("tool_rounds", ["--style", "deliberation", "--max_tool_rounds", "-1"], "--max_tool_rounds -1"),
        # a style without tools: that the setting does not apply comes before its range (issue 47's check order)
        ("python_timeout", ["--python_timeout", "0"], "--python_timeout_s: tool settings apply to a style with tools"),
        ("keys_file_missing", ["--style", "deliberation", "--tavily_keys_file", str(tmp / "keys.txt")],
         "keys.txt' does not exist"),
        ("keys_file_dir", ["--style", "deliberation", "--tavily_keys_file", str(tmp / "keys_dir")], "is a directory"),
    ]




@pytest.fixture
def no_models(monkeypatch):
    """Fail the test if anything tries to load a model or start agents."""
    import recmas_ray.eval.run as driver
    import recmas_ray.models.loader as loader

    def boom(*a, **k):
        raise AssertionError("a model was loaded for bad input")

    monkeypatch.setattr(loader, "load_frozen_model", boom)
    monkeypatch.setattr(driver, "BatchRunner", boom)
    monkeypatch.setattr(driver, "plan_system", boom)


def test_every_bad_input_is_one_line_exit_2(tmp_path, question_file, capsys, no_models):
    rows = _bad_rows(tmp_path)
    out = tmp_path / "out"
    failures = []
    for name, extra, fragment in rows:
        argv = GOOD + ["--dataset", str(question_file), "--output_path", str(out)] + extra
        rc = run_job.main(argv)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        problems = []
        if rc != 2:
            problems.append(f"exit {rc}")
        if len(lines) != 1 or not lines[0].startswith("error: "):
            problems.append(f"stderr {err!r}")
        if "Traceback" in err:
            problems.append("traceback")
        if fragment not in err:
            problems.append(f"message lacks {fragment!r}: {err.strip()!r}")
        if out.exists():
            problems.append("output written")
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}")
    assert not failures, "\n".join(failures)
    assert len(rows) >= 55  # the table itself must not shrink unnoticed


def test_debug_shows_the_traceback(question_file, tmp_path):
    with pytest.raises(ValueError, match="latent_steps"):
        run_job.main(GOOD + ["--dataset", str(question_file), "--latent_steps", "-1", "--debug"])


def test_help_and_print_config_load_nothing_heavy(question_file, capsys):
    import subprocess
    import sys

    code = ("import sys\nfrom jobs import run\ntry:\n    run.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))")
    # from the checkout's root, as README runs the jobs (pip installs only recmas_ray)
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]
    assert "--latent_steps" in out.stdout and "--latent_length" in out.stdout
    assert run_job.main(GOOD + ["--dataset", str(question_file), "--print_config", "--latent_length", "7"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["recursion"]["latent_steps"] == 7 and cfg["system"]["style"] == "sequential_light"


def test_config_file_then_flags(tmp_path, question_file, capsys):
    """A saved config.json reruns the same run; flags given after it win."""
    first = run_job.parse(GOOD + ["--dataset", str(question_file), "--latent_steps", "5", "--top_p", "0.5"])
    from recmas_ray.config.tree import save_config

    path = save_config(first, tmp_path)
    again = run_job.parse(["--config", str(path)])
    assert again == first
    tweaked = run_job.parse(["--config", str(path), "--latent_steps", "9"])
    assert tweaked.recursion.latent_steps == 9 and tweaked.recursion.decode.top_p == 0.5
