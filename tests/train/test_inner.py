"""Inner-loop training: the loss as specified (over the chat template's rendered assistant turn), a 100-step
run that learns, frozen base weights, gradient accumulation, bit-exact resume in Ray Train's local mode (the
default tier's real Ray Train run), and, in the integration tier, a 2-worker gloo run, a failed worker
restarted by Ray Train, and `--mas_role all` feeding `plan_system`."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from jobs import train_inner as cli
from recmas_ray.engine.agent import Agent
from recmas_ray.train.config import InnerTrainConfig
from recmas_ray.system.config import with_system
from recmas_ray.models.loader import load_frozen_model
from recmas_ray.styles import get_style
from recmas_ray.system.checkpoints import load_links
from recmas_ray.system.link_init import seeded_inner_link
from recmas_ray.train.core import run_storage, step_indices
from recmas_ray.train.data import role_examples
from recmas_ray.train.inner import inner_loss, make_optimizer, train_step
from recmas_ray.train.inner_job import train_inner
from recmas_ray.train.synthetic import make_arithmetic_dataset, write_jsonl

SEQ = get_style("sequential")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny tensors: a second intra-op thread only adds sync cost (500x slower ops on a busy 2-core box).
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def rows():
    return make_arithmetic_dataset(24, seed=1)


@pytest.fixture
def train_file(tmp_path, rows):
    return str(write_jsonl(rows, tmp_path / "train.jsonl"))


def _agent(model_name="tiny:qwen3", role="planner", seed=42):
    model, tok = load_frozen_model(model_name, dtype=torch.float32)
    link = seeded_inner_link(model.config.hidden_size, seed=seed, role=role)
    return Agent(model, tok, link, role=role, model_name=model_name)


def _cfg(train_file, save_dir, **kw):
    base = dict(model_name_or_path="tiny:qwen3", mas_role="planner", dataset_name=train_file, save_dir=str(save_dir),
                max_steps=12, batch_size=1, lr=2e-3, warmup_steps=2, save_every=3, log_every=3, num_workers=0,
                progress=False, max_failures=0)
    return with_system(InnerTrainConfig, **(base | kw))


def test_inner_loss_is_the_spec_loss(tiny_cache, rows):
    agent = _agent(role="critic")
    (u1, t1), (u2, t2) = role_examples(rows[:2], SEQ, "critic", "math")
    per_row_cos, per_row_sq = [], []
    for user, target in ((u1, t1), (u2, t2)):
        e_LD, _, asst_L = agent.embed_teacher_forced(user, None, target)
        with torch.no_grad():
            h_LD = agent.forward_hidden(e_LD[None], torch.ones(1, e_LD.shape[0], dtype=torch.long))[0]
        keep = asst_L[1:]  # position t+1 is a token of the rendered assistant turn
        turn = agent.tokenizer(target + "<|im_end|>\n", add_special_tokens=False).input_ids  # Qwen's turn end
        assert int(keep.sum()) == len(turn) and agent.tokenizer.decode(turn).endswith("<|im_end|>\n")
        pred, tgt = agent.inner_link(h_LD[:-1][keep]), e_LD[1:][keep].detach()
        per_row_cos.append(1 - F.cosine_similarity(pred, tgt, dim=-1))
        per_row_sq.append((pred - tgt).pow(2))
    # Two rows of different length in one left-padded batch: mean over all kept positions of both.
    want_cos = torch.cat(per_row_cos).mean()
    want_mse = torch.cat(per_row_sq).mean()
    got = inner_loss(agent, [(u1, t1), (u2, t2)])
    assert torch.allclose(got, want_cos, atol=1e-5), (got, want_cos)
    got_mix = inner_loss(agent, [(u1, t1), (u2, t2)], w_cos=0.5, w_mse=0.25)
    assert torch.allclose(got_mix, 0.5 * want_cos + 0.25 * want_mse, rtol=1e-4)
    got.backward()
    assert all(p.grad is not None for p in agent.inner_link.parameters())
    assert all(p.grad is None for p in agent.model.parameters())


def test_100_steps_cut_the_loss_and_change_only_the_inner_link(tiny_cache, rows):
    agent = _agent()
    cfg = InnerTrainConfig(max_steps=100, batch_size=1, lr=2e-3, warmup_steps=10)
    base_before = {k: v.clone() for k, v in agent.model.state_dict().items()}
    link_before = {k: v.clone() for k, v in agent.inner_link.state_dict().items()}
    opt, sched = make_optimizer(agent.inner_link, cfg)
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in agent.inner_link.parameters()}
    examples = role_examples(rows, SEQ, "planner", "math")
    losses = [train_step(agent, opt, sched, [examples[i] for i in step_indices(len(examples), s, 1, cfg.system.seed)], cfg)
              for s in range(cfg.max_steps)]
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print(f"inner loss first10 {first:.4f} last10 {last:.4f}")
    assert last <= 0.7 * first, (first, last)
    assert all(torch.equal(v, base_before[k]) for k, v in agent.model.state_dict().items())
    assert all(not torch.equal(v, link_before[k]) for k, v in agent.inner_link.state_dict().items())


def test_grad_accumulation_equals_the_larger_batch(tiny_cache, rows):
    """2 x 1 accumulated rows == one step on the same 2 rows when each chunk's loss is the mean of equal parts
    (here: the same row twice, so the per-chunk and the joint mean agree exactly)."""
    examples = role_examples(rows, SEQ, "planner", "math")
    pair = [examples[0], examples[0]]
    a, b = _agent(), _agent()
    opt_a, sched_a = make_optimizer(a.inner_link, InnerTrainConfig(lr=1e-2, warmup_steps=0, max_steps=4))
    cfg_b = InnerTrainConfig(lr=1e-2, warmup_steps=0, max_steps=4, batch_size=1, grad_accum_steps=2)
    opt_b, sched_b = make_optimizer(b.inner_link, cfg_b)
    la = train_step(a, opt_a, sched_a, pair, InnerTrainConfig(lr=1e-2, warmup_steps=0, max_steps=4, batch_size=2))
    lb = train_step(b, opt_b, sched_b, pair, cfg_b)
    assert la == pytest.approx(lb, rel=1e-6)
    for k, v in a.inner_link.state_dict().items():
        torch.testing.assert_close(v, b.inner_link.state_dict()[k], rtol=1e-5, atol=1e-6)


def test_resume_ends_with_the_uninterrupted_weights(tiny_cache, tmp_path, train_file):
    full = train_inner(_cfg(train_file, tmp_path / "full"))
    half = train_inner(_cfg(train_file, tmp_path / "cut", stop_at_step=6))
    assert json.loads((half / "manifest.json").read_text())["step"] == 6
    resumed = train_inner(_cfg(train_file, tmp_path / "cut", resume=True))
    a, b = load_links(full), load_links(resumed)
    assert a.manifest["step"] == b.manifest["step"] == 12
    assert a.manifest["loss_log"] == b.manifest["loss_log"]  # steps 7..12 really ran after the restart
    for k, v in a.inner["planner"].state_dict().items():
        assert torch.equal(v, b.inner["planner"].state_dict()[k]), k
    again = load_links(train_inner(_cfg(train_file, tmp_path / "cut", resume=True)))  # nothing left to do
    assert again.manifest["step"] == 12
    assert torch.equal(again.inner["planner"].proj1.weight, b.inner["planner"].proj1.weight)
    init = seeded_inner_link(64, seed=42, role="planner").state_dict()
    assert not torch.equal(init["proj1.weight"], a.inner["planner"].state_dict()["proj1.weight"])
    # Checkpoints hold the link, its manifest and the optimizer state only: no base model copy.
    run_dir = Path(run_storage(_cfg(train_file, tmp_path / "cut"), "inner-sequential-planner").root)
    ckpts = sorted(run_dir.glob("checkpoint_[0-9]*"))
    assert [c.name for c in ckpts] == ["checkpoint_000009", "checkpoint_000012"]  # num_to_keep=2
    assert sorted(os.listdir(ckpts[-1])) == ["COMPLETE", "links.safetensors", "manifest.json", "optim-planner.pt",
                                             "train_state.json"]
    assert sum(f.stat().st_size for f in ckpts[-1].iterdir()) < 500_000
    manifest = b.manifest
    assert manifest["kind"] == "inner" and manifest["roles"]["planner"] == {"base_model": "tiny:qwen3",
                                                                            "hidden_size": 64}


def test_resume_falls_back_past_a_torn_checkpoint(tiny_cache, tmp_path, train_file):
    """The newest checkpoint is torn (its weights half-written): --resume starts from the one before and still
    ends with the uninterrupted weights."""
    from recmas_ray.train.core import COMPLETE

    full = load_links(train_inner(_cfg(train_file, tmp_path / "full", max_steps=9)))
    uri = f"file://{tmp_path / 'store'}"  # Ray Train storage as a URI (as s3:// or gs:// would be)
    train_inner(_cfg(train_file, tmp_path / "cut", max_steps=9, stop_at_step=6, storage_path=uri))
    run_dir = Path(run_storage(_cfg(train_file, tmp_path / "cut", storage_path=uri), "inner-sequential-planner").root)
    assert str(run_dir).startswith(str(tmp_path / "store"))
    weights = run_dir / "checkpoint_000006" / "links.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert (run_dir / "checkpoint_000006" / COMPLETE).exists()  # sealed, but a file no longer matches
    resumed = load_links(train_inner(_cfg(train_file, tmp_path / "cut", max_steps=9, resume=True, storage_path=uri)))
    assert resumed.manifest["loss_log"] == full.manifest["loss_log"]  # steps 4..9 re-ran from checkpoint 3
    for k, v in full.inner["planner"].state_dict().items():
        assert torch.equal(v, resumed.inner["planner"].state_dict()[k]), k


def test_load_dir_and_role_model(tiny_cache, tmp_path, train_file):
    """--load_dir with a link folder initialises the link; with a sealed checkpoint it continues that run;
    --role_model picks the base model and lands in the manifest."""
    from recmas_ray.train.inner_job import plan_roles

    full = load_links(train_inner(_cfg(train_file, tmp_path / "full", max_steps=9)))
    train_inner(_cfg(train_file, tmp_path / "cut", max_steps=9, stop_at_step=6))
    ckpt = Path(run_storage(_cfg(train_file, tmp_path / "cut"), "inner-sequential-planner").root) / "checkpoint_000006"
    cont = load_links(train_inner(_cfg(train_file, tmp_path / "cont", max_steps=9, load_dir=str(ckpt))))
    assert cont.manifest["loss_log"][-1] == full.manifest["loss_log"][-1]
    assert all(torch.equal(v, cont.inner["planner"].state_dict()[k]) for k, v in full.inner["planner"].state_dict().items())
    init = plan_roles(_cfg(train_file, tmp_path / "x", load_dir=str(tmp_path / "full")), ["planner"])
    assert torch.equal(init.links.inner["planner"].proj1.weight, full.inner["planner"].proj1.weight)
    other = load_links(train_inner(_cfg(train_file, tmp_path / "llama", model_name_or_path=None, max_steps=1,
                                        role_models={"planner": "tiny:llama"})))
    assert other.manifest["base_model"] == "tiny:llama" and other.manifest["train_config"]["system"]["role_models"] == {
        "planner": "tiny:llama"}


def test_bad_input_fails_up_front(tmp_path, rows):
    bad = [dict(r) for r in rows]
    bad[5]["plan"] = ""
    path = str(write_jsonl(bad, tmp_path / "bad.jsonl"))
    with pytest.raises(ValueError, match=r"row 5: .*role planner.*'plan' empty \(\"\"\)"):
        train_inner(_cfg(path, tmp_path / "out"))
    with pytest.raises(ValueError, match="unknown role 'judge'"):
        train_inner(_cfg(path, tmp_path / "out", mas_role="judge"))
    assert cli.main(["--model_name_or_path", "tiny:qwen3", "--mas_role", "judge", "--dataset_name", path,
                     "--save_dir", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_two_workers_gloo_average_gradients(ray_cluster, tmp_path, train_file, rows):
    cfg = _cfg(train_file, tmp_path / "dp", num_workers=2, max_steps=4, save_every=2, log_every=2, progress=True)
    out = train_inner(cfg)
    got = load_links(out)
    assert got.manifest["step"] == 4 and got.manifest["world_size"] == 2
    run_dir = Path(run_storage(cfg, "inner-sequential-planner").root)
    ray_ckpts = sorted(p.name for p in run_dir.glob("checkpoint_[0-9]*"))
    assert ray_ckpts == ["checkpoint_000002", "checkpoint_000004"]
    # Reference: the same two data shards per step in one process, gradients averaged by hand.
    agent = _agent()
    opt, sched = make_optimizer(agent.inner_link, cfg)
    examples = role_examples(rows, SEQ, "planner", "math")
    params = list(agent.inner_link.parameters())
    for step in range(cfg.max_steps):
        idx = step_indices(len(examples), step, 2, cfg.system.seed)
        grads = []
        for rank in range(2):
            opt.zero_grad()
            inner_loss(agent, [examples[idx[rank]]]).backward()
            grads.append([p.grad.clone() for p in params])
        for p, g0, g1 in zip(params, *grads):
            p.grad = (g0 + g1) / 2
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
    for k, v in agent.inner_link.state_dict().items():
        assert torch.allclose(v, got.inner["planner"].state_dict()[k], atol=1e-5), k


@pytest.mark.integration
def test_all_roles_train_concurrently_and_load_in_plan_system(ray_cluster, tmp_path, train_file, capsys):
    from recmas_ray.system.presets import role_models
    from recmas_ray.system.plan import plan_system

    save = tmp_path / "inner"
    rc = cli.main(["--mas_design", "sequential", "--mas_role", "all", "--preset", "tiny",
                   "--dataset_name", train_file, "--save_dir", str(save), "--max_steps", "3",
                   "--batch_size", "1", "--num_workers", "0", "--log_every", "1", "--no_progress"])
    assert rc == 0
    assert f"--links {save}" in capsys.readouterr().out  # the next commands read the one system folder
    dirs = {r: save / r for r in SEQ.roles}
    plan = plan_system("sequential", preset="tiny", ckpt_override={r: str(d) for r, d in dirs.items()})
    assert plan.role_models == role_models("sequential", "tiny")
    for role, d in dirs.items():
        saved = load_links(d)
        assert saved.manifest["step"] == 3 and saved.manifest["base_model"] == plan.role_models[role]
        for k, v in saved.inner[role].state_dict().items():
            assert torch.equal(v, plan.links.inner[role].state_dict()[k]), (role, k)


@pytest.mark.integration
def test_failed_worker_resumes_from_the_latest_checkpoint(ray_cluster, tmp_path, train_file):
    # One Ray Train worker fails once at step 5; FailureConfig restarts it from checkpoint_000004.
    cfg = _cfg(train_file, tmp_path / "ft", num_workers=1, max_steps=8, save_every=2, log_every=2, max_failures=1)
    got = load_links(train_inner(cfg, faults={"fail_step": 5}))
    want = load_links(train_inner(_cfg(train_file, tmp_path / "ref", max_steps=8, save_every=2, log_every=2)))
    assert got.manifest["step"] == 8
    for k, v in want.inner["planner"].state_dict().items():
        assert torch.allclose(v, got.inner["planner"].state_dict()[k], atol=1e-6), k
    with pytest.raises(Exception, match="injected failure"):  # no retries left: the error reaches the driver
        train_inner(replace(cfg, max_failures=0), faults={"fail_step": 3})
