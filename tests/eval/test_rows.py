"""The evaluation's row options (`recmas_ray/eval/rows.py`): --format_help changes only the decoder's prompt;
--outer_init untrained gives each loaded outer link its kind's untrained initial state; every new row (the methods
text_relay and rollout_as_text, with both options on) runs through `evaluate` on both backends with the same
predictions, recorded in the fingerprint and the results."""

import json

import pytest
import torch

from recmas_ray.tasks.math import decoder_help_text
from recmas_ray.eval.rows import untrained_outer_links, with_decoder_format_help
from recmas_ray.styles import get_style, render_prompt, render_single_agent_prompt
from tests.conftest import write_jsonl
from tests.system.link_folders import STYLE, TASK, write_system_folder

QUESTIONS = ["x = 41. What is x?", "y = 17. What is y?", "What is 7 * 8?"]
FAST = ["--num_recursive_rounds", "1", "--latent_steps", "3", "--max_new_tokens", "6"]


@pytest.mark.parametrize("style_name", ["sequential_light", "distillation", "mixture"])
def test_format_help_changes_only_the_decoders_prompt(style_name):
    style = get_style(style_name)
    helped = with_decoder_format_help(style)
    prefix = decoder_help_text() + "\n\n"
    for role in style.roles:
        for variant in ("base", "feedback"):
            for task in ("math", "qa", "choice"):
                try:
                    before = render_prompt(style, role, variant, task, QUESTIONS[0])
                except ValueError:  # a role with no feedback variant
                    continue
                after = render_prompt(helped, role, variant, task, QUESTIONS[0])
                assert after.endswith(before) and (after == before) == (role != style.decoder), (role, variant, task)
                if role == style.decoder:
                    assert prefix.strip() in after and after.index(prefix.strip()) < after.index(QUESTIONS[0])
    assert render_single_agent_prompt(helped, "qa", QUESTIONS[0]) == \
        prefix + render_single_agent_prompt(style, "qa", QUESTIONS[0])  # the example first, the question last
    assert "\\boxed{12}" in prefix and prefix.count("Question:") == 1  # the instruction and one worked example


def _folder_with_train_config(root, train_config):
    folder = write_system_folder(root)
    manifest = folder / "outer" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["train_config"] = {**data["train_config"], **train_config}
    manifest.write_text(json.dumps(data))
    return folder


def test_untrained_outer_links_equal_fresh_links_of_the_same_kind(tmp_path, tiny_cache):
    from recmas_ray.engine.links import TokenLink
    from recmas_ray.system.link_init import seeded_outer_link
    from recmas_ray.system.plan import plan_system

    folder = _folder_with_train_config(tmp_path / "sys", {"outer_init": "default", "system": {"seed": 7}})
    plan = plan_system(STYLE, preset="tiny", seed=0, task=TASK, ckpt_override={"outer": str(folder / "outer")})
    trained = plan.links.outer["critic->solver"]
    assert isinstance(trained, TokenLink) and float(trained.residual.weight.detach().abs().sum()) > 0
    untrained = untrained_outer_links(plan, str(folder / "outer"))
    token = untrained.links.outer["critic->solver"]
    fresh = TokenLink(None, None, trained.tau, ids=(trained.source_ids, trained.target_ids),
                      dims=(trained.in_dim, trained.out_dim))  # a token link as constructed: the pure translation
    assert type(token) is TokenLink and token.tau == fresh.tau
    assert {k: v.tolist() for k, v in token.state_dict().items()} == {k: v.tolist() for k, v in
                                                                      fresh.state_dict().items()}
    for edge in ("planner->critic", "solver->planner"):  # release OuterLinks: the seeded init under training's seed
        link, loaded = untrained.links.outer[edge], plan.links.outer[edge]
        want = seeded_outer_link(loaded.in_dim, loaded.out_dim, seed=7, edge=edge)
        assert all(torch.equal(a, b) for a, b in zip(link.state_dict().values(), want.state_dict().values()))
        assert not torch.equal(link.residual_proj.weight, loaded.residual_proj.weight)
    assert untrained.sources["outer:critic->solver"].startswith("untrained(token_link) of ")
    assert plan.links.outer["critic->solver"] is trained  # the given plan is not changed


def test_untrained_needs_outer_links(tiny_cache):
    from recmas_ray.system.plan import plan_system

    plan = plan_system(STYLE, preset="tiny", seed=0, task=TASK)
    with pytest.raises(ValueError, match="--outer_init untrained: this run loads no outer links"):
        untrained_outer_links(plan, None)


def _run(folder, tmp_path, backend, extra):
    from jobs import run as run_job

    data = write_jsonl(tmp_path / "q.jsonl", [{"question": q, "answer": "0"} for q in QUESTIONS])
    out = tmp_path / f"eval-{backend}-{len(extra)}"
    assert run_job.main(["--style", STYLE, "--preset", "tiny", "--links", str(folder), "--dataset", str(data),
                         "--backend", backend, "--output_path", str(out), "--no_format_retry", "--batch_size", "3",
                         "--no_progress", *FAST, *extra]) == 0
    rows = sorted((json.loads(line) for f in out.glob("samples_*.jsonl") for line in open(f)),
                  key=lambda r: (r["method"], int(r["doc_id"])))
    results = json.loads(next(out.glob("results_*.json")).read_text())
    fingerprint = json.loads(next(out.glob("samples_*.fingerprint.json")).read_text())
    return rows, results, fingerprint


ROWS = ["--methods", "recursive_mas", "text_relay", "rollout_as_text", "--format_help", "--outer_init", "untrained"]


def test_every_new_row_runs_in_process_and_is_recorded(tmp_path, tiny_cache):
    folder = write_system_folder(tmp_path / "sys")
    rows, results, fingerprint = _run(folder, tmp_path, "local", ROWS)
    assert {r["method"] for r in rows} == {"recursive_mas", "text_relay", "rollout_as_text"} and len(rows) == 9
    assert results["row_options"] == {"format_help": True, "format_help_text": decoder_help_text(),
                                      "outer_init": "untrained"}
    assert fingerprint["format_help"] is True and fingerprint["outer_init"] == "untrained"
    assert "untrained(token_link)" in json.dumps(fingerprint["links"])
    readout = [t for r in rows if r["method"] == "rollout_as_text" for t in r["trace"] if t["action"] == "rollout_text"]
    assert len(readout) == 6 and all(t["text_tokens"] == 3 for t in readout)  # planner and critic, m tokens each
    # the untrained token link: no residual, so its share of the output is 0
    channel = results["channel"]["critic->solver"]
    assert channel["mean_residual_share"] == 0.0 and 0.0 < channel["mean_top1"] <= 1.0
    plain, plain_results, plain_fp = _run(folder, tmp_path, "local", ["--methods", "recursive_mas"])
    assert "format_help" not in plain_fp and "outer_init" not in plain_fp  # off: the fingerprint as before
    assert plain_results["channel"]["critic->solver"]["mean_residual_share"] > 0  # the trained residual


@pytest.mark.integration  # jobs.run on Ray, three methods: ~1-2 min on a busy 2-core machine
@pytest.mark.timeout(900)
def test_every_new_row_gives_the_same_predictions_on_ray(tmp_path, ray_cluster, tiny_cache):
    folder = write_system_folder(tmp_path / "sys")
    local, local_results, _ = _run(folder, tmp_path, "local", ROWS)
    remote, remote_results, _ = _run(folder, tmp_path, "ray", ROWS)
    assert [(r["method"], r["doc_id"], r["prediction"]) for r in remote] == \
        [(r["method"], r["doc_id"], r["prediction"]) for r in local]
    assert [[t.get("text") for t in r["trace"]] for r in remote] == [[t.get("text") for t in r["trace"]] for r in local]
    for edge, c in local_results["channel"].items():  # the actors compute what this process does
        got = remote_results["channel"][edge]
        assert got["nearest"] == c["nearest"] and got["num_messages"] == c["num_messages"]
        assert got["mean_top1"] == pytest.approx(c["mean_top1"], abs=1e-6)


@pytest.mark.parametrize("init", ["bridge", "state_bridge"])
def test_untrained_release_links_restart_from_the_bridge_their_training_fitted(tmp_path, tiny_cache, init):
    from types import SimpleNamespace

    from recmas_ray.system.checkpoints import LinkSet
    from recmas_ray.system.link_init import seeded_outer_link
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.bridge import bridge_outer_links, state_bridge_outer_links
    from recmas_ray.train.data import load_rows
    from recmas_ray.train.outer import prepare_samples

    trained = {"outer_init": init, "bridge_ridge": 0.05, "system": {"seed": 5, "dtype": "float32"}, "task": "math",
               "dataset_name": "synthetic:4", "rollout_latent_steps": 2, "num_recursive_rounds": 1}
    folder = _folder_with_train_config(tmp_path / "sys", trained)
    plan = plan_system(STYLE, preset="tiny", seed=0, task=TASK, ckpt_override={"outer": str(folder / "outer")})
    got = untrained_outer_links(plan, str(folder / "outer")).links.outer
    # the reference: the seeded links under the training seed, refit by the training job's own bridge functions
    edges = ["planner->critic", "solver->planner"]
    ref = LinkSet()
    ref.inner.update(plan.links.inner)
    ref.outer.update({e: seeded_outer_link(plan.links.outer[e].in_dim, plan.links.outer[e].out_dim, seed=5, edge=e)
                      for e in edges})
    view = SimpleNamespace(style=plan.style, role_models=plan.role_models, links=ref)
    if init == "bridge":
        bridge_outer_links(view, ridge=0.05)
    else:
        questions = [s.question for s in prepare_samples(load_rows("synthetic:4"), plan.style, "math")]
        state_bridge_outer_links(view, questions, task="math", num_steps=2, num_rounds=1, ridge=0.05)
    for e in edges:
        assert all(torch.equal(a, b) for a, b in zip(got[e].state_dict().values(), ref.outer[e].state_dict().values()))
        seeded = seeded_outer_link(ref.outer[e].in_dim, ref.outer[e].out_dim, seed=5, edge=e)
        assert not torch.equal(got[e].residual_proj.weight, seeded.residual_proj.weight)  # the fit did happen


def test_the_apis_evaluate_takes_format_help_and_the_new_methods(tmp_path, tiny_cache):
    import recmas_ray as rm

    data = write_jsonl(tmp_path / "q.jsonl", [{"question": q, "answer": "0"} for q in QUESTIONS[:2]])
    with rm.System.build("distillation", preset="tiny", backend="local") as system:
        report = system.evaluate(str(data), methods=["text_relay", "rollout_as_text"], num_recursive_rounds=1,
                                 latent_steps=2, max_new_tokens=4, format_help=True, format_retry=False,
                                 output_path=str(tmp_path / "api"), progress=False)
    results = json.loads(open(report["results_path"]).read())
    assert results["row_options"]["format_help"] is True
    assert {v["method"] for v in report["results"].values()} == {"text_relay", "rollout_as_text"}
    decoded = [json.loads(line) for line in open(report["samples_path"])]
    assert len(decoded) == 4 and all(r["trace"][-1]["action"] == "decode" for r in decoded)
