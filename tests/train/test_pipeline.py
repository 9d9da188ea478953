"""The outer-loop job as a real multi-worker Ray Train run (gloo, one worker per role) on the session cluster.

distillation (expert tiny:mistral d=256 -> learner tiny:qwen3 d=64) keeps it to two workers:
  - an uninterrupted 4-step run: the final-round loss falls, base models and inner links stay bit-identical,
    only outer links change, and the result loads through `plan_system(..., ckpt_override={"outer": DIR})`
  - the same run with rank 1 killed mid-step 2 (Ray Train restarts it from checkpoint 1) and a NaN loss at
    step 3 (stops naming the step and sample ids, checkpoint 2 stays the latest), then `resume=True`:
    the final weights equal the uninterrupted run's
  - held-out evaluation every 2 steps writes eval_curve.jsonl / eval_curve.png next to the links
  - a bad inner checkpoint fails before any compute, naming the role
Fault injection goes through the private `faults` argument (never a config field).
"""

import json

import pytest
import torch

from pathlib import Path

from recmas_ray.train.config import OuterTrainConfig
from recmas_ray.engine.links import InnerLink
from recmas_ray.system.checkpoints import LinkSet, load_links, save_links
from recmas_ray.train.core import run_storage
from recmas_ray.train.pipeline import NaNLossError, train_outer
from recmas_ray.system.config import with_system

pytestmark = pytest.mark.timeout(600)


def _cfg(save_dir, **kw):
    base = dict(style="distillation", dataset_name="synthetic:2", save_dir=str(save_dir), num_recursive_rounds=2,
                max_latent_tokens=8, max_steps=4, batch_size=2, num_microbatches=2, lr=2e-2, warmup_steps=0,
                save_every=1, seed=3, max_failures=1, verify_frozen=True)
    return with_system(OuterTrainConfig, **{**base, **kw})


def _inner_ckpt(path, role, base, hidden):
    torch.manual_seed(0)
    manifest = {"kind": "inner", "base_model": base, "roles": {role: {"base_model": base, "hidden_size": hidden}}}
    return str(save_links(path, LinkSet(inner={role: InnerLink(hidden)}), manifest))


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("u")
    inner = _inner_ckpt(root / "inner_learner", "learner", "tiny:qwen3", 64)
    cfg = _cfg(root / "out", ckpt_override={"learner": inner}, eval_every=2, eval_dataset="synthetic:3")
    return cfg, train_outer(cfg)


@pytest.mark.integration
def test_loss_falls_and_only_outer_links_change(uninterrupted):
    from recmas_ray.system.plan import plan_system

    cfg, res = uninterrupted
    losses = [e["loss"] for e in res.log]
    assert len(losses) == 4 and losses[-1] < losses[0] - 1e-3, losses
    workers = res.metrics["workers"]
    assert set(workers) == {"expert", "learner"}
    assert all(w["frozen_unchanged"] is True for w in workers.values()), workers
    saved = load_links(res.save_dir)
    assert not saved.inner and set(saved.outer) == {"expert->learner", "learner->expert"}
    assert saved.manifest["kind"] == "outer" and saved.manifest["step"] == 4
    assert saved.manifest["roles"]["learner"] == {"base_model": "tiny:qwen3", "hidden_size": 64}
    init = plan_system("distillation", preset="tiny", ckpt_override=cfg.system.ckpt_override, seed=cfg.system.seed)
    for edge, link in saved.outer.items():
        for name, p in link.state_dict().items():
            assert not torch.equal(p, init.links.outer[edge].state_dict()[name]), f"{edge}.{name} did not change"
    # What `jobs/run.py --ckpt_override outer=DIR` does: the dims check passes and the trained links load.
    plan = plan_system("distillation", preset="tiny", ckpt_override={**cfg.system.ckpt_override, "outer": str(res.save_dir)})
    assert plan.sources["outer:expert->learner"] == str(res.save_dir)
    assert json.loads((res.save_dir / "config.json").read_text())["eval_every"] == 2


@pytest.mark.integration
def test_held_out_curve_is_written(uninterrupted):
    _, res = uninterrupted
    curve = [json.loads(line) for line in (res.save_dir / "eval_curve.jsonl").read_text().splitlines()]
    assert [e["step"] for e in curve] == [2, 4] and curve == res.eval_log
    assert all(e["num_eval_rows"] == 3 and e["eval_loss"] > 0 for e in curve)
    assert (res.save_dir / "eval_curve.png").stat().st_size > 1000


@pytest.mark.integration
def test_kill_nan_stop_and_resume_match_uninterrupted(uninterrupted, tmp_path):
    """Rank 1 dies during step 2 (Ray Train restarts both workers from checkpoint 1); the loss turns NaN at
    step 3, which stops the run naming the step and sample ids with checkpoint 2 kept as the latest;
    `resume=True` then finishes steps 3-4 with the same weights as the uninterrupted run."""
    cfg_u, res_u = uninterrupted
    # file:// storage: the URI path Ray Train and our run folder code take for s3:// and gs:// too
    cfg = _cfg(tmp_path / "out", ckpt_override=cfg_u.system.ckpt_override, eval_every=2, eval_dataset="synthetic:3",
               storage_path=f"file://{tmp_path / 'store'}")
    with pytest.raises(NaNLossError, match=r"step 3 for sample ids \['\d+', '\d+'\]"):
        train_outer(cfg, faults={"kill_rank": 1, "kill_step": 2, "nan_step": 3})
    storage = run_storage(cfg, "outer-distillation")
    run_dir = tmp_path / "store" / storage.name
    assert (run_dir / ".killed-rank1-step2").exists()  # the kill really happened
    last = storage.latest_complete()
    assert last is not None and Path(last.path).name == "checkpoint_000002"
    assert [e["step"] for e in json.loads((run_dir / "checkpoint_000002" / "train_state.json").read_text())["log"]] \
        == [1, 2]
    assert not (tmp_path / "out" / "links.safetensors").exists()

    cfg.resume = True
    resumed = train_outer(cfg)
    assert [e["step"] for e in resumed.log] == [1, 2, 3, 4]
    a, b = load_links(res_u.save_dir).outer, load_links(resumed.save_dir).outer
    for edge in a:
        for name, p in a[edge].state_dict().items():
            torch.testing.assert_close(b[edge].state_dict()[name], p, rtol=0, atol=1e-7)
    assert [e["loss"] for e in resumed.log] == pytest.approx([e["loss"] for e in res_u.log], rel=1e-6)
    assert [e["eval_loss"] for e in resumed.eval_log] == pytest.approx([e["eval_loss"] for e in res_u.eval_log],
                                                                       rel=1e-6)


@pytest.mark.integration
def test_keep_best_exports_the_links_of_the_lowest_held_out_loss(uninterrupted, tmp_path):
    """--keep_best with an evaluation every step: the exported links are those of the step with the lowest
    held-out loss, byte for byte the checkpoint of that step, and the manifest records the choice."""
    from recmas_ray.train.outer import read_outer_links

    cfg_u, _ = uninterrupted
    # a large lr, so the held-out loss need not fall at every step
    cfg = _cfg(tmp_path / "out", ckpt_override=cfg_u.system.ckpt_override, eval_every=1, eval_dataset="synthetic:3",
               keep_best=True, num_to_keep=4, lr=0.5, storage_path=f"file://{tmp_path / 'store'}")
    res = train_outer(cfg)
    losses = {e["step"]: e["eval_loss"] for e in res.eval_log}
    assert list(losses) == [1, 2, 3, 4]
    best = min(losses, key=losses.get)
    saved = load_links(res.save_dir)
    assert saved.manifest["chosen"]["step"] == best and saved.manifest["chosen"]["among_steps"] == [1, 2, 3, 4]
    assert saved.manifest["chosen"]["eval_loss"] == pytest.approx(losses[best])
    at_best = read_outer_links(tmp_path / "store" / run_storage(cfg, "outer-distillation").name /
                               f"checkpoint_{best:06d}")
    for edge, link in saved.outer.items():
        for name, p in link.state_dict().items():
            assert torch.equal(p, at_best[edge].state_dict()[name]), (edge, name)


def test_keep_best_needs_an_evaluation(tmp_path):
    with pytest.raises(ValueError, match="--keep_best needs --eval_every"):
        _cfg(tmp_path / "out", keep_best=True).validate()


@pytest.mark.parametrize("base,hidden", [("tiny:qwen3", 96), ("tiny:llama", 64)])
def test_bad_inner_checkpoint_fails_before_compute(tmp_path, base, hidden, monkeypatch):
    import ray.train.torch

    import recmas_ray.models.loader

    for mod, attr in ((ray.train.torch, "TorchTrainer"), (recmas_ray.models.loader, "load_frozen_model")):
        monkeypatch.setattr(mod, attr, lambda *a, **k: pytest.fail("reached compute"))
    bad = _inner_ckpt(tmp_path / "bad", "learner", base, hidden)
    cfg = _cfg(tmp_path / "out", ckpt_override={"learner": bad})
    with pytest.raises(ValueError, match="link learner: link maps|role learner"):
        train_outer(cfg)
