"""Every link kind is first-class in the checkpoint layout: its kind and arguments are named in the manifest, it
comes back bit-identical, and an untrusted folder naming an unknown kind, shapes that do not match its arguments or
the models, or token ids outside a vocabulary, is refused with one line before any weight is used."""

import json

import pytest
import torch

from tests.system.link_folders import STYLE, TASK, make_links, write_system_folder


def _states(links):
    from recmas_ray.engine.links import link_state

    return {f"{p}:{n}": link_state(m) for p, t in (("inner", links.inner), ("outer", links.outer)) for n, m in t.items()}


def test_every_kind_round_trips_with_its_kind_and_arguments_named(tmp_path, tiny_cache):
    from recmas_ray.system.checkpoints import load_links, save_links

    _, links = make_links()
    save_links(tmp_path / "all", links, {"style": STYLE})
    manifest = json.loads((tmp_path / "all" / "manifest.json").read_text())
    assert manifest["outer"]["critic->solver"] == {"kind": "token_link", "in_dim": 96, "out_dim": 128,
                                                   "num_tokens": 50, "tau": 0.05}
    assert manifest["outer"]["planner->critic"] == {"kind": "outer_ln_res_adapter", "in_dim": 64, "out_dim": 96}
    assert manifest["inner"]["planner"] == {"kind": "ln_res_adapter", "hidden_size": 64}
    back = load_links(tmp_path / "all", hidden_sizes={"planner": 64, "critic": 96, "solver": 128})
    want, got = _states(links), _states(back)
    assert want.keys() == got.keys()
    for key in want:
        assert want[key].keys() == got[key].keys()
        for name in want[key]:
            assert want[key][name].dtype == got[key][name].dtype or want[key][name].is_floating_point()
            assert torch.equal(want[key][name].to(got[key][name].dtype), got[key][name]), (key, name)
    assert got["outer:critic->solver"]["source_ids"].dtype == torch.long  # ids stay integers on disk
    assert not back.outer["critic->solver"].bound  # its tables are the models' own, bound where they run


def _edit_manifest(folder, edit):
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["outer"]["critic->solver"].update(kind="pickle_link"),
     "unknown outer link kind 'pickle_link' in manifest.json; expected one of ['outer_ln_res_adapter', 'token_link']"),
    (lambda m: m["outer"]["critic->solver"].update(num_tokens=49), "do not match a link of kind token_link"),
    (lambda m: m["outer"]["planner->critic"].update(out_dim=128), "do not match a link of kind outer_ln_res_adapter"),
    (lambda m: m["outer"]["critic->solver"].update(tau=-1), "tau=-1; expected a positive number"),
    (lambda m: m["outer"]["critic->solver"].update(kind="ln_res_adapter"), "unknown outer link kind"),
])
def test_a_manifest_that_does_not_match_its_tensors_is_refused_in_one_line(tmp_path, tiny_cache, edit, message):
    from recmas_ray.system.plan import plan_system

    folder = write_system_folder(tmp_path / "sys")
    _edit_manifest(folder / "outer", edit)
    with pytest.raises(ValueError) as e:
        plan_system(STYLE, preset="tiny", task=TASK, ckpt_override={"outer": str(folder / "outer")})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_links_for_other_hidden_sizes_are_refused_against_the_plan(tmp_path, tiny_cache):
    from recmas_ray.system.plan import plan_system

    folder = write_system_folder(tmp_path / "sys")
    with pytest.raises(ValueError, match=r"critic->solver: link maps 96->128, but the models' config.json give "
                                         r"96->64"):
        plan_system(STYLE, preset="tiny", task=TASK, role_models={"solver": "tiny:qwen3"},
                    ckpt_override={"outer": str(folder / "outer")})


def test_token_ids_outside_the_receivers_vocabulary_are_refused_where_the_link_binds(tmp_path, tiny_cache):
    from recmas_ray.engine.service import AgentService

    plan, links = make_links()
    token = links.outer["critic->solver"]
    token.target_ids[0] = 5000
    plan.links.outer["critic->solver"] = token
    with pytest.raises(ValueError, match="token id 5000 is outside tiny:gemma3's vocabulary of 272"):
        AgentService(*plan.service_args("critic"))


def test_an_unbound_token_link_says_so_and_binds_to_the_same_function():
    from recmas_ray.engine.links import TokenLink, link_from_state, link_state

    src, dst = torch.randn(6, 4), torch.randn(6, 5)
    full = TokenLink(src, dst, 0.1, ids=([0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]))
    torch.nn.init.normal_(full.residual.weight)
    back = link_from_state(link_state(full), place="outer", what="t")
    x = torch.randn(2, 3, 4)
    with pytest.raises(RuntimeError, match="unbound"):
        back(x)
    back.bind(src, dst)
    assert torch.equal(back(x), full(x)) and back.tau == full.tau


def test_plan_service_args_ship_token_links_with_their_receivers_model(tmp_path, tiny_cache):
    from recmas_ray.engine.service import AgentService
    from recmas_ray.system.plan import plan_system

    folder = write_system_folder(tmp_path / "sys")
    plan = plan_system(STYLE, preset="tiny", task=TASK, ckpt_override={"outer": str(folder / "outer")})
    assert plan.specs["critic"].outer_targets == {"critic->solver": "tiny:gemma3"}
    service = AgentService(*plan.service_args("critic"))
    link = service.agent.outer_links["critic->solver"]
    solver = AgentService(*plan.service_args("solver")).agent
    with torch.no_grad():  # the target table is the receiver's own input embedding of the target ids
        want = solver.model.get_input_embeddings()(link.target_ids).float()
    assert torch.equal(link.target_KE, want)


def test_the_experiments_earlier_links_pt_loads_as_token_links(tmp_path, tiny_cache):
    from recmas_ray.engine.links import link_state
    from recmas_ray.system.plan import plan_system

    _, links = make_links()
    state = link_state(links.outer["critic->solver"])
    (tmp_path / "old").mkdir()
    torch.save({"critic->solver": state}, tmp_path / "old" / "links.pt")
    plan = plan_system(STYLE, preset="tiny", task=TASK, ckpt_override={"outer": str(tmp_path / "old")},
                       allow_style_mismatch=True)
    got = link_state(plan.links.outer["critic->solver"])
    assert all(torch.equal(got[k], state[k]) for k in state)
    torch.save({"critic->solver": {**state, "tau": torch.tensor(float("nan"))}}, tmp_path / "old" / "links.pt")
    with pytest.raises(ValueError, match="NaN"):
        plan_system(STYLE, preset="tiny", task=TASK, ckpt_override={"outer": str(tmp_path / "old")})
