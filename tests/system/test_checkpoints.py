"""Checkpoints: our format round trip, release layouts import with identical outputs, early checks."""

import json

import pytest
import torch

from recmas_ray.system.checkpoints import LinkSet, load_links, save_links
from recmas_ray.styles import get_style
from recmas_ray.system.plan import parse_overrides, plan_system


def test_our_format_round_trip(tmp_path, tiny_cache):
    plan = plan_system("mixture", preset="tiny", seed=3)
    save_links(tmp_path / "ck", plan.links, {"style": "mixture", **plan.manifest()})
    back = load_links(tmp_path / "ck")
    assert set(back.outer) == set(get_style("mixture").edges) and set(back.inner) == set(plan.style.roles)
    for e, m in plan.links.outer.items():
        assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), back.outer[e].state_dict().values()))
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert manifest["outer"]["math->summarizer"] == {"in_dim": 64, "out_dim": 128}


def test_release_layouts_import_with_identical_outputs(tmp_path, tiny_cache):
    plan = plan_system("sequential_light", preset="tiny", seed=5)
    inner_dir, outer_dir = tmp_path / "planner", tmp_path / "outer"
    inner_dir.mkdir(), outer_dir.mkdir()
    torch.save(plan.links.inner["planner"].state_dict(), inner_dir / "adapter.pt")
    (inner_dir / "adapter_config.json").write_text(json.dumps({"adapter_type": "ln_res_adapter"}))
    adapters = []
    for key, edge in (("outer_12", "planner->critic"), ("outer_23", "critic->solver"), ("outer_31", "solver->planner")):
        torch.save(plan.links.outer[edge].state_dict(), outer_dir / f"{key}.pt")
        link = plan.links.outer[edge]
        adapters.append({"legacy_key": key, "filename": f"{key}.pt", "adapter_type": "outer_ln_res_adapter",
                         "in_dim": link.in_dim, "out_dim": link.out_dim})
    (outer_dir / "outerlink_config.json").write_text(json.dumps({"format_version": 1, "adapters": adapters}))
    imported = plan_system("sequential_light", preset="tiny", seed=99,
                           ckpt_overrides={"planner": str(inner_dir), "outer": str(outer_dir)})
    x = torch.randn(3, 64)
    assert torch.equal(imported.links.inner["planner"](x), plan.links.inner["planner"](x))
    assert torch.equal(imported.links.outer["planner->critic"](x), plan.links.outer["planner->critic"](x))
    assert imported.sources["outer:critic->solver"] == str(outer_dir)


def test_checks_before_compute(tmp_path, tiny_cache):
    with pytest.raises(ValueError, match="not roles of style sequential_light"):
        plan_system("sequential_light", preset="tiny", ckpt_overrides={"summarizer": str(tmp_path)})
    with pytest.raises(ValueError, match="unknown preset"):
        plan_system("mixture", preset="huge")
    wrong = plan_system("sequential_light", preset="tiny")  # critic link is 96-d
    save_links(tmp_path / "critic", LinkSet(inner={"critic": wrong.links.inner["critic"]}), {})
    with pytest.raises(ValueError, match="role planner: inner link .* hidden size 96, but its base model tiny:qwen3"):
        plan_system("sequential_light", preset="tiny", ckpt_overrides={"planner": str(tmp_path / "critic")})
    with pytest.raises(ValueError, match="not of the form ROLE=PATH"):
        parse_overrides(["planner"])
    with pytest.raises(ValueError, match="not a link checkpoint"):
        plan_system("sequential_light", preset="tiny", ckpt_overrides={"planner": str(tmp_path)})


def test_manifest_base_model_wins_over_preset(tmp_path, tiny_cache):
    plan = plan_system("distillation", preset="tiny")
    llama = plan_system("sequential_light", preset="tiny")  # critic runs tiny:llama (96)
    save_links(tmp_path / "ck", LinkSet(inner={"learner": llama.links.inner["critic"]}),
               {"roles": {"learner": {"base_model": "tiny:llama"}}})
    moved = plan_system("distillation", preset="tiny", ckpt_overrides={"learner": str(tmp_path / "ck")})
    assert moved.role_models["learner"] == "tiny:llama" and plan.role_models["learner"] == "tiny:qwen3"
    assert moved.links.outer["expert->learner"].out_dim == 96
