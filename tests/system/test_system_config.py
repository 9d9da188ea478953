"""`SystemConfig`: one section chooses the system in every job, its flags as before."""
from __future__ import annotations

import dataclasses
import json

import pytest

from jobs.bench import speed as bench_job
from jobs import run as run_job
from jobs import train_inner
from recmas_ray.config.cli import parse_config
from recmas_ray.config.resume import check_training_resume
from recmas_ray.config.tree import save_config
from recmas_ray.system.config import SystemConfig, with_system
from recmas_ray.train.config import InnerTrainConfig


def test_plain_dotted_and_alias_flags_set_the_same_field(question_file):
    base = ["--dataset", str(question_file), "--backend", "local"]
    plain = run_job.parse(base + ["--style", "mixture", "--seed", "7", "--models", "code=tiny:qwen3"])
    dotted = run_job.parse(base + ["--system.style", "mixture", "--system.seed", "7",
                                   "--system.role_models", "code=tiny:qwen3"])
    alias = run_job.parse(base + ["--style", "mixture", "--seed", "7", "--role_model", "code=tiny:qwen3"])
    assert plain == dotted == alias
    assert plain.system == SystemConfig(style="mixture", seed=7, role_models={"code": "tiny:qwen3"})


def test_a_config_file_is_nested_by_section_and_a_flat_key_refused(tmp_path, question_file, capsys):
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"system": {"style": "mixture", "role_models": {"code": "tiny:qwen3"}},
                                "dataset": str(question_file), "placement": {"preset": "cpu"}}))
    cfg = run_job.parse(["--config", str(conf)])
    assert (cfg.system.style, cfg.system.role_models, cfg.placement.preset) == ("mixture", {"code": "tiny:qwen3"}, "cpu")
    conf.write_text(json.dumps({"style": "mixture", "dataset": str(question_file)}))
    assert run_job.main(["--config", str(conf)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown setting(s) ['style']" in err[0], err


def test_fields_a_job_does_not_read_have_no_flag_and_are_refused(tmp_path, capsys):
    assert train_inner.main(["--device", "cuda"]) == 2
    assert "--device" in capsys.readouterr().err
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"system": {"style": "sequential", "device": "cuda"}}))
    assert train_inner.main(["--config", str(conf), "--save_dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--system.device: not a setting of this job" in err[0]


def test_help_shows_the_jobs_own_defaults(capsys):
    assert bench_job.main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "default: demo" in text and "default: sequential_light" in text  # BenchConfig's, not SystemConfig's


def test_plan_of_a_section_is_the_plan_of_its_fields():
    from recmas_ray.system.plan import plan_system

    section = SystemConfig(style="sequential_light", seed=3, role_models={"critic": "tiny:mistral"})
    a = plan_system(section, task="math")
    b = plan_system("sequential_light", seed=3, role_models={"critic": "tiny:mistral"})
    c = plan_system(dataclasses.replace(section, role_models={}), role_models={"critic": "tiny:mistral"})
    assert a.manifest() == b.manifest() == c.manifest() and a.role_models["critic"] == "tiny:mistral"


def test_resume_names_the_differing_system_fields_by_their_flags(tmp_path):
    cfg = with_system(InnerTrainConfig, dataset_name="synthetic:4", save_dir=str(tmp_path), seed=1, num_workers=0,
                      role_models={"planner": "tiny:llama"})
    save_config(cfg, tmp_path)
    check_training_resume(cfg, tmp_path)  # the same run
    with pytest.raises(ValueError, match=r"differing fields: seed: 1 -> 2$|differing fields: seed: 1 -> 2\."):
        check_training_resume(dataclasses.replace(cfg, system=dataclasses.replace(cfg.system, seed=2)), tmp_path)


def test_with_system_nests_flat_settings_over_the_class_default():
    cfg = with_system(InnerTrainConfig, seed=5, lr=1e-3)
    assert cfg.system == SystemConfig(style="sequential", seed=5) and cfg.lr == 1e-3
    assert parse_config(InnerTrainConfig, ["--seed", "5", "--lr", "1e-3"])[0] == cfg
