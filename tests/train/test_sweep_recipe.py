"""jobs/experiments/sweep_recipe.py: its statistics on data with known answers (default tier) and the whole sweep on tiny
models (integration: inner + outer training on Ray Train, then every measurement)."""

import json

import numpy as np
import pytest


def test_mcnemar_paired_and_probe_on_known_data():
    from jobs.experiments.sweep_recipe_measure import mcnemar_exact, paired, probe_x

    a, b = [True] * 12 + [False] * 4, [False] * 12 + [False] * 4
    got = mcnemar_exact(a, b)
    assert (got["only_a"], got["only_b"]) == (12, 0) and got["p"] == pytest.approx(2 * 0.5**12)
    assert mcnemar_exact(a, a)["p"] == 1.0
    d = paired([1.0, 2.0, None, 4.0], [2.0, 3.5, 9.0, 4.5])
    assert d["n"] == 3 and d["mean"] == pytest.approx(1.0) and d["se"] == pytest.approx(np.std([1, 1.5, 0.5], ddof=1) / 3**0.5)
    rng = np.random.default_rng(0)
    x = rng.integers(2, 41, size=120).astype(float)
    readable = np.c_[x, rng.normal(size=(120, 20))] @ rng.normal(size=(21, 21))  # x linearly mixed in
    assert probe_x(readable, list(x))["r2"] > 0.95
    assert probe_x(rng.normal(size=(120, 21)), list(x))["r2"] < 0.2  # no information: near the constant


def test_the_probe_of_x_needs_no_package_outside_the_demo_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)  # any `import sklearn...` now fails, as in a demo-only venv
    from jobs.experiments.sweep_recipe_measure import probe_x

    x = np.arange(40, dtype=float) % 17
    got = probe_x(np.c_[x, np.ones(40)], list(x))
    assert got["r2"] > 0.95 and got["exact"] > 0.9


def test_token_classes_find_fact_and_result(tiny_cache):
    import torch

    from jobs.experiments.sweep_recipe_measure import token_classes
    from recmas_ray.models.loader import load_frozen_model

    _, tok = load_frozen_model("tiny:qwen3", dtype=torch.float32)
    target = "17 - 8 = 9. \\boxed{9}"
    cls = token_classes(tok, target, "17", "9", "<|im_end|>\n")
    enc = tok(target + "<|im_end|>\n", add_special_tokens=False, return_offsets_mapping=True)
    text = {c: "".join(target[a:b] for (a, b), k in zip(enc["offset_mapping"], cls) if k == c) for c in set(cls)}
    assert text["fact"] == "17" and text["result"].strip() == "9"


def test_token_classes_of_a_recall_answer_score_the_boxed_copy_as_result(tiny_cache):
    import torch

    from jobs.experiments.sweep_recipe_measure import token_classes
    from recmas_ray.models.loader import load_frozen_model

    _, tok = load_frozen_model("tiny:qwen3", dtype=torch.float32)
    target = "x = 63. \\boxed{63}"
    cls = token_classes(tok, target, "63", "63", "<|im_end|>\n")
    enc = tok(target + "<|im_end|>\n", add_special_tokens=False, return_offsets_mapping=True)
    spans = {c: [target[a:b] for (a, b), k in zip(enc["offset_mapping"], cls) if k == c] for c in set(cls)}
    assert "".join(spans["fact"]).strip() == "63" and "".join(spans["result"]).strip() == "63"
    first_result = next(i for i, k in enumerate(cls) if k == "result")
    assert enc["offset_mapping"][first_result][0] > target.index("boxed")


def test_capture_pool_scores_with_the_services_scorer_and_keeps_token_nll(tiny_cache):
    import torch

    from jobs.experiments.sweep_recipe_measure import CapturePool
    from recmas_ray.engine.agent import find_slots
    from recmas_ray.styles import build_schedule, render_prompt
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system

    plan = plan_system("sequential_light", preset="tiny", seed=0)
    pool = local_pool(plan, pool_cls=CapturePool)
    solver = plan.style.decoder
    d = pool.services[solver].agent.hidden_size
    step = build_schedule(plan.style, 1)[-1]
    users = [render_prompt(plan.style, solver, step.variant, "qa", q) for q in ("What is x?", "What is y?")]
    slots = find_slots(pool.services[solver].agent.render_chat(users[0]))
    targets = ["x = 12. \\boxed{12}", "y = 40. \\boxed{40}"]
    lats = [torch.randn(2, 3, d, generator=torch.Generator().manual_seed(i)) for i in range(len(slots))]
    means, _ = pool.score(solver, users, slots, targets, lats)
    want, _ = pool.services[solver].score(users, slots, targets, *lats)
    assert means == pytest.approx(want, rel=1e-6)
    assert [len(t) for t in pool.token_nll] == [len(pool.services[solver].agent.target_token_offsets(t)) for t in targets]
    assert [float(np.mean(t)) for t in pool.token_nll] == pytest.approx(means, rel=1e-6)


@pytest.mark.integration
def test_sweep_runs_end_to_end_on_tiny_models(tmp_path, ray_cluster):
    from jobs.experiments.sweep_recipe import main_cfg, SweepRecipeConfig

    cfg = SweepRecipeConfig(preset="tiny", out_dir=str(tmp_path), recipes=["release_r1", "full_r1"], num_train=12,
                            num_eval=6, num_unseen=4, inner_steps=2, outer_steps=2, latent_steps=2, max_new_tokens=3,
                            eval_batch_size=5)
    assert main_cfg(cfg) == 0
    base = json.loads((tmp_path / "baselines.json").read_text())
    assert set(base) == {"single_floor", "single_ceiling", "textmas"}
    for recipe in cfg.recipes:
        got = json.loads((tmp_path / recipe / "result.json").read_text())
        for variant in ("trained", "shuffled", "zeroed", "fresh"):
            assert len(got[variant]["correct"]) == 10 and len(got[variant]["fact_nll"]) == 10
            assert all(v is not None for v in got[variant]["fact_nll"] + got[variant]["result_nll"])
        assert set(got["trained"]["probe"]) >= {"planner->critic", "critic->solver"}
        assert set(got["tests"]) == {"vs_shuffled", "vs_zeroed", "vs_fresh"}
    table = (tmp_path / "summary.md").read_text()
    assert all(f"| {r} |" in table for r in cfg.recipes)
    assert all(f"| {r} | unseen values | 4 |" in table for r in cfg.recipes)
    with pytest.raises(ValueError, match="other settings"):
        main_cfg(SweepRecipeConfig(**{**cfg.__dict__, "num_eval": 9}))
