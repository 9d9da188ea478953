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
    assert manifest["outer"]["math->summarizer"] == {"kind": "outer_ln_res_adapter", "in_dim": 64, "out_dim": 128}


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
                           ckpt_override={"planner": str(inner_dir), "outer": str(outer_dir)})
    x = torch.randn(3, 64)
    assert torch.equal(imported.links.inner["planner"](x), plan.links.inner["planner"](x))
    assert torch.equal(imported.links.outer["planner->critic"](x), plan.links.outer["planner->critic"](x))
    assert imported.sources["outer:critic->solver"] == str(outer_dir)


def test_checks_before_compute(tmp_path, tiny_cache):
    with pytest.raises(ValueError, match="not roles of style sequential_light"):
        plan_system("sequential_light", preset="tiny", ckpt_override={"summarizer": str(tmp_path)})
    with pytest.raises(ValueError, match="unknown preset"):
        plan_system("mixture", preset="huge")
    wrong = plan_system("sequential_light", preset="tiny")  # critic link is 96-d
    save_links(tmp_path / "critic", LinkSet(inner={"critic": wrong.links.inner["critic"]}), {})
    with pytest.raises(ValueError, match="role planner: inner link .* hidden size 96, but its base model tiny:qwen3"):
        plan_system("sequential_light", preset="tiny", ckpt_override={"planner": str(tmp_path / "critic")})
    with pytest.raises(ValueError, match="not of the form ROLE=PATH"):
        parse_overrides(["planner"])
    with pytest.raises(ValueError, match="not a link checkpoint"):
        plan_system("sequential_light", preset="tiny", ckpt_override={"planner": str(tmp_path)})


def test_checkpoint_on_another_base_than_the_presets_is_refused_until_named(tmp_path, tiny_cache):
    plan = plan_system("distillation", preset="tiny")
    llama = plan_system("sequential_light", preset="tiny")  # critic runs tiny:llama (96)
    save_links(tmp_path / "ck", LinkSet(inner={"learner": llama.links.inner["critic"]}),
               {"roles": {"learner": {"base_model": "tiny:llama"}}})
    ck = {"learner": str(tmp_path / "ck")}
    with pytest.raises(ValueError, match=r"role learner: preset tiny gives base model 'tiny:qwen3', but the "
                                         r"checkpoint .* was trained on 'tiny:llama'; name it \(--models learner="):
        plan_system("distillation", preset="tiny", ckpt_override=ck)
    named = plan_system("distillation", preset="tiny", ckpt_override=ck, role_models={"learner": "tiny:llama"})
    assert named.role_models["learner"] == "tiny:llama" and plan.role_models["learner"] == "tiny:qwen3"
    assert named.links.outer["expert->learner"].out_dim == 96
    with pytest.raises(ValueError, match="hidden size"):  # opted in: the preset's model, link sizes still checked
        plan_system("distillation", preset="tiny", ckpt_override=ck, allow_base_model_mismatch=True)


def test_outer_links_of_other_base_models_or_another_style_are_refused(tmp_path, tiny_cache):
    from recmas_ray.system.checkpoints import save_links as save

    light = plan_system("sequential_light", preset="tiny")
    save(tmp_path / "outer", LinkSet(outer=light.links.outer),
         {"kind": "outer", "style": "sequential_light", "roles": {"planner": {"base_model": "tiny:mistral"}}})
    with pytest.raises(ValueError, match=r"outer=.*: trained with planner on 'tiny:mistral', but this system runs "
                                         r"'tiny:qwen3' there"):
        plan_system("sequential_light", preset="tiny", ckpt_override={"outer": str(tmp_path / "outer")})
    mixture = plan_system("mixture", preset="tiny")
    role = mixture.style.roles[0]
    save(tmp_path / "inner", LinkSet(inner={role: mixture.links.inner[role]}),
         {"kind": "inner", "style": "mixture", "roles": {role: {"base_model": mixture.role_models[role]}}})
    target = next(r for r in light.style.roles if light.role_models[r] == mixture.role_models[role])
    with pytest.raises(ValueError, match=r"links trained for style 'mixture', but this system runs 'sequential'; "
                                         r"pass --allow_style_mismatch"):
        plan_system("sequential_light", preset="tiny", ckpt_override={target: str(tmp_path / "inner")})
    opted = plan_system("sequential_light", preset="tiny", ckpt_override={target: str(tmp_path / "inner")},
                        allow_style_mismatch=True)
    assert opted.sources[f"inner:{target}"] == str(tmp_path / "inner")


# ----------------------------------------------------------------------------- untrusted checkpoint folders

class Payload:
    """An arbitrary pickled object, which a weights-only load must refuse."""


def _release_outer(tmp_path, plan, filename_of=lambda key: f"{key}.pt", tasks=None):
    outer_dir = tmp_path / "outer"
    outer_dir.mkdir(exist_ok=True)
    adapters = []
    for key, edge in (("outer_12", "planner->critic"), ("outer_23", "critic->solver"), ("outer_31", "solver->planner")):
        torch.save(plan.links.outer[edge].state_dict(), outer_dir / f"{key}.pt")
        link = plan.links.outer[edge]
        adapters.append({"legacy_key": key, "filename": filename_of(key), "adapter_type": "outer_ln_res_adapter",
                         "in_dim": link.in_dim, "out_dim": link.out_dim})
    cfg = {"format_version": 1, "tasks": {t: {"adapters": adapters} for t in tasks}} if tasks else \
        {"format_version": 1, "adapters": adapters}
    (outer_dir / "outerlink_config.json").write_text(json.dumps(cfg))
    return outer_dir


def test_manifest_paths_must_stay_inside_the_folder(tmp_path, tiny_cache):
    plan = plan_system("sequential_light", preset="tiny", seed=5)
    outside = tmp_path / "elsewhere.pt"
    torch.save(plan.links.outer["planner->critic"].state_dict(), outside)
    for name in ("../elsewhere.pt", str(outside)):
        d = _release_outer(tmp_path, plan, lambda key, n=name: n if key == "outer_12" else f"{key}.pt")
        with pytest.raises(ValueError, match="leaves the checkpoint folder"):
            load_links(d, style=get_style("sequential_light"))
    d = _release_outer(tmp_path, plan, lambda key: "link.pt" if key == "outer_12" else f"{key}.pt")
    (d / "link.pt").symlink_to(outside)
    with pytest.raises(ValueError, match="is a link to .*outside the checkpoint folder"):
        load_links(d, style=get_style("sequential_light"))
    ours = tmp_path / "ours"
    save_links(ours, plan.links, plan.manifest())
    (ours / "links.safetensors").unlink()
    (ours / "links.safetensors").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the checkpoint folder"):
        load_links(ours)


def test_release_manifest_without_the_task_lists_the_tasks(tmp_path, tiny_cache):
    plan = plan_system("sequential_light", preset="tiny", seed=5)
    d = _release_outer(tmp_path, plan, tasks=["math"])
    assert set(load_links(d, style=plan.style, task="math").outer) == set(plan.style.edges)
    with pytest.raises(ValueError, match=r"no links for task 'code'; the release manifest holds tasks \['math'\]"):
        load_links(d, style=plan.style, task="code")


def test_innerlink_config_is_read_and_checked_against_the_model_config(tmp_path, tiny_cache):
    from recmas_ray.models.loader import resolve_model_path

    plan = plan_system("sequential_light", preset="tiny", seed=5)
    d = tmp_path / "planner_release"
    d.mkdir()
    torch.save(plan.links.inner["planner"].state_dict(), d / "adapter(math).pt")
    torch.save(plan.links.inner["critic"].state_dict(), d / "adapter(code).pt")  # 96-d: wrong for this model
    (d / "innerlink_config.json").write_text(json.dumps(
        {"adapter_type": "ln_res_adapter", "tasks": {"math": {"adapter.pt": "adapter(math).pt"},
                                                     "code": {"adapter.pt": "adapter(code).pt"}}}))
    (d / "config.json").write_text(open(f"{resolve_model_path('tiny:qwen3')}/config.json").read())
    ls = load_links(d, role="planner", task="math")
    x = torch.randn(2, 64)
    assert torch.equal(ls.inner["planner"](x), plan.links.inner["planner"](x))
    with pytest.raises(ValueError, match=r"link maps 96, but the models' config.json give 64"):
        load_links(d, role="planner", task="code")
    with pytest.raises(ValueError, match=r"tasks \['code', 'math'\]"):
        load_links(d, role="planner", task="choice")


def test_corrupt_files_are_one_line_errors_naming_the_file(tmp_path, tiny_cache):
    plan = plan_system("mixture", preset="tiny", seed=3)
    ck = tmp_path / "ck"
    save_links(ck, plan.links, plan.manifest())
    blob = (ck / "links.safetensors").read_bytes()
    (ck / "links.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match=r"links.safetensors: not a readable safetensors file") as e:
        load_links(ck)
    assert "\n" not in str(e.value)
    (ck / "links.safetensors").write_bytes(b"junk" * 8)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_links(ck)
    rel = tmp_path / "rel"
    rel.mkdir()
    (rel / "adapter.pt").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"adapter.pt: not a plain tensor checkpoint"):
        load_links(rel, role="planner")
    torch.save({"proj1.weight": Payload()}, rel / "adapter.pt")  # a pickled object: weights_only refuses it
    with pytest.raises(ValueError, match="not a plain tensor checkpoint"):
        load_links(rel, role="planner")


def test_shapes_are_checked_from_the_header_before_weights_load(tmp_path, tiny_cache, monkeypatch):
    from recmas_ray.system import checkpoints

    plan = plan_system("sequential_light", preset="tiny", seed=5)
    save_links(tmp_path / "ck", plan.links, {})
    monkeypatch.setattr(checkpoints, "load_file", lambda *a, **k: pytest.fail("weights read before the shape check"))
    with pytest.raises(ValueError, match=r"(inner link critic: link maps 96, but|outer link .*->critic: link maps) .* 128"):
        load_links(tmp_path / "ck", hidden_sizes={"planner": 64, "critic": 128, "solver": 64})


def test_explicit_model_that_differs_from_the_checkpoint_is_refused(tmp_path, tiny_cache):
    llama = plan_system("sequential_light", preset="tiny")  # critic runs tiny:llama (96)
    save_links(tmp_path / "ck", LinkSet(inner={"learner": llama.links.inner["critic"]}),
               {"roles": {"learner": {"base_model": "tiny:llama"}}})
    ck = {"learner": str(tmp_path / "ck")}
    with pytest.raises(ValueError, match=r"role learner: the configured base model 'tiny:qwen3' differs from "
                                         r"'tiny:llama', named by the checkpoint"):
        plan_system("distillation", preset="tiny", ckpt_override=ck, role_models={"learner": "tiny:qwen3"})
    same = plan_system("distillation", preset="tiny", ckpt_override=ck, role_models={"learner": "tiny:llama"})
    assert same.role_models["learner"] == "tiny:llama"
    # Opting in runs the configured model; the link sizes are still checked (96 vs tiny:qwen3's 64).
    with pytest.raises(ValueError, match="hidden size"):
        plan_system("distillation", preset="tiny", ckpt_override=ck, role_models={"learner": "tiny:qwen3"},
                    allow_base_model_mismatch=True)


def test_eval_flags_for_models_and_the_opt_in(tmp_path, question_file, capsys):
    from jobs import run as run_job

    argv = ["--style", "distillation", "--dataset", str(question_file), "--models", "teacher=tiny:llama",
            "--output_path", str(tmp_path / "o")]
    assert run_job.main(argv) == 2
    assert "--models names ['teacher']" in capsys.readouterr().err
