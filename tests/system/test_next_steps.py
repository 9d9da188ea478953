"""The commands the jobs print for a saved system (`recmas_ray/system/next_steps.py`): the same system flags parse
in every job that takes them, so a printed command names the very models it was trained with."""

import pytest

from recmas_ray.system.next_steps import command, system_flags

ROLE_MODELS = {"planner": "tiny:gemma3", "critic": "tiny:llama"}


@pytest.mark.parametrize("job", ["train_inner", "train_outer", "run", "serve"])
def test_system_flags_parse_in_every_job(job, tmp_path, capsys):
    import importlib
    import json

    flags = system_flags("sequential_light", "tiny", ROLE_MODELS)
    extra = {"train_inner": ["--mas_role", "all", "--dataset_name", "synthetic:8", "--save_dir", str(tmp_path)],
             "train_outer": ["--dataset_name", "synthetic:8", "--save_dir", str(tmp_path)],
             "run": ["--dataset", "gsm8k"], "serve": []}[job]
    assert importlib.import_module(f"jobs.{job}").main([*flags, *extra, "--print_config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["system"]["role_models"] == ROLE_MODELS and printed["system"]["style"] == "sequential_light"


def test_command_quotes_for_a_shell():
    assert command("run", "--dataset", "a b.jsonl") == "python -m jobs.run --dataset 'a b.jsonl'"
