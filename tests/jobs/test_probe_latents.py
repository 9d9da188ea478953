"""jobs/experiments/probe_latents.py: bad input exits 2 in one line; on a demo folder (tiny models, links saved as the
demo's training would) every figure is computed and the shuffle/zero/empty paired differences are real."""

import dataclasses
import json
import math

from jobs.experiments import probe_latents


def test_bad_input_exits_2_in_one_line(tmp_path, capsys):
    assert probe_latents.main(["--demo_dir", str(tmp_path / "missing")]) == 2
    assert probe_latents.main(["--demo_dir", str(tmp_path)]) == 2
    assert probe_latents.main(["--demo_dir", str(tmp_path), "--ablations", "reverse"]) == 2
    (tmp_path / "demo_config.json").write_text("{}")
    (tmp_path / "heldout.jsonl").write_text("")
    (tmp_path / "demo_results.json").write_text(json.dumps({"training": {"checkpoints": {"outer": str(tmp_path / "no")}}}))
    assert probe_latents.main(["--demo_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "no demo_config.json" in err[1] and "'reverse'" in err[2]
    assert "checkpoint outer" in err[3] and "is not a folder" in err[3]
    assert not (tmp_path / "probe_latents.json").exists()


def _demo_dir(tmp_path):
    from jobs.experiments.demo.config import DemoConfig
    from jobs.experiments.demo.pipeline import make_data
    from recmas_ray.system.checkpoints import save_links
    from recmas_ray.system.plan import plan_system
    from recmas_ray.system.presets import role_models

    from recmas_ray.system.config import with_system

    cfg = with_system(DemoConfig, preset="tiny", num_train=8, num_eval=10, latent_steps=2, rounds=[1],
                      output_path=str(tmp_path))
    make_data(cfg, tmp_path)
    plan = plan_system(cfg.system, task=cfg.task, preset="tiny", seed=5)
    ckpts = {}
    for role in plan.style.roles:
        ckpts[role] = str(save_links(tmp_path / "inner" / role, type(plan.links)(inner={role: plan.links.inner[role]}), {}))
    ckpts["outer"] = str(save_links(tmp_path / "outer", type(plan.links)(outer=dict(plan.links.outer)), {}))
    (tmp_path / "demo_config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    (tmp_path / "demo_results.json").write_text(json.dumps(
        {"training": {"checkpoints": ckpts}, "role_models": role_models(cfg.system.style, "tiny")}))
    return tmp_path


def test_probe_job_on_a_demo_folder(tmp_path, tiny_cache, capsys):
    d = _demo_dir(tmp_path)
    assert probe_latents.main(["--demo_dir", str(d), "--num_eval", "8", "--batch_size", "4",
                               "--links", "fresh,trained"]) == 0
    printed = capsys.readouterr().out
    data = json.loads((d / "probe_latents.json").read_text())
    rows = {(r["links"], r["ablation"]): r for r in data["rows"]}
    assert set(rows) == {(k, a) for k in ("fresh", "trained") for a in probe_latents.ABLATIONS}
    for (links, ablation), r in rows.items():
        assert r["n"] == 8 and math.isfinite(r["nll"])
        assert all(r["flow"]["nll_by_class"][c] is not None for c in ("result", "operand", "wording"))
        if ablation == "empty":
            assert r["flow"]["edges"] == {}
            continue
        assert set(r["flow"]["edges"]) == {"planner->critic R1", "critic->solver R1"}
        for e in r["flow"]["edges"].values():
            assert math.isfinite(e["mean_cosine"]) and set(e["probe"]) == {"operation", "operand_a", "operand_b",
                                                                            "answer"}
    # shuffling acts where latents are received: the planner (first sender) sends the same, the critic not
    edges = {a: rows[("trained", a)]["flow"]["edges"] for a in ("none", "shuffle")}
    assert edges["shuffle"]["planner->critic R1"] == edges["none"]["planner->critic R1"]
    assert edges["shuffle"]["critic->solver R1"]["mean_cosine"] != edges["none"]["critic->solver R1"]["mean_cosine"]
    assert rows[("trained", "shuffle")]["nll"] != rows[("trained", "none")]["nll"]
    paired = {(t["links"], t["ablation"]) for t in data["paired"]}
    assert paired == {(k, a) for k in ("fresh", "trained") for a in ("shuffle", "zero", "empty")}
    assert all(math.isfinite(t["nll_diff"]["se"]) and "result" in t["nll_diff_by_class"] for t in data["paired"])
    assert "|Method|R|Edge|Cosine|" in printed and "NLL shuffle - intact" in printed
