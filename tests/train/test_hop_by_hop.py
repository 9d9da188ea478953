"""`--schedule hop_by_hop` (recmas_ray/train/hop_by_hop.py, hop_by_hop_job.py) on tiny models.

The Ray Train run (the session cluster, a worker per role: 3 for sequential_light, 4 for mixture, 2 for
distillation) against the single-process reference `train_in_process` on the same plan, rows and batches:
the gradients of steps 1 and 3 before clipping, the per-step losses and the links after 3 steps (warmup and
cosine schedule, so every step's lr differs) agree to float rounding (sequential_light in the default tier,
mixture with -m integration); every worker's base model and inner
link stay bit-identical; the untrained hops stay the pure translation. The Python API reaches the schedule
too. What it cannot train (R > 1, a decoder that is not last, no rollout, an end-to-end option it would
ignore) is refused by `jobs.train_outer` in one line, exit 2, before any model loads.
"""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.timeout(600)

M, STEPS = 3, 3
TASKS = {"sequential_light": "recall", "mixture": "mixture", "distillation": "recall"}


def _rows(style, tmp_path, num_train=6):
    from recmas_ray.train.synthetic import write_jsonl
    from recmas_ray.train.synthetic_facts import split_by_value

    train, _, _ = split_by_value(TASKS[style], style, num_train=num_train, num_seen=1, num_unseen=0, seed=0)
    return train, str(write_jsonl(train, tmp_path / "train.jsonl"))


def _cfg(style, data, save_dir, **kw):
    from recmas_ray.system.config import with_system
    from recmas_ray.train.config import OuterTrainConfig

    base = dict(style=style, preset="tiny", seed=0, dataset_name=data, task="qa", save_dir=str(save_dir),
                schedule="hop_by_hop", num_recursive_rounds=1, rollout_latent_steps=M, token_tau=0.05,
                max_steps=STEPS, batch_size=2, lr=1e-2, warmup_steps=1, lr_scheduler_type="cosine",
                value_token_weight=5.0, verify_frozen=True, progress=False, cpus_per_worker=0.5, max_failures=0)
    return with_system(OuterTrainConfig, **{**base, **kw})


def _reference(cfg, rows, batches):
    from recmas_ray.styles import get_style
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.hop_by_hop import train_in_process
    from recmas_ray.train.outer import prepare_samples

    style = get_style(cfg.system.style)
    pool = local_pool(plan_system(cfg.system, task=cfg.task))
    agents = {r: s.agent for r, s in pool.services.items()}
    return train_in_process(agents, style, prepare_samples(rows, style, cfg.task), cfg, batches,
                            capture_grads=(1, STEPS), log=lambda _: None)


@pytest.mark.parametrize("style", ["sequential_light", pytest.param("mixture", marks=pytest.mark.integration)])
def test_ray_train_equals_the_single_process_reference(ray_cluster, tmp_path, style):
    from recmas_ray.styles import get_style
    from recmas_ray.train import core
    from recmas_ray.train.hop_by_hop import LINKS_FILE, decoder_edges, load
    from recmas_ray.train.hop_by_hop_job import train_hop_by_hop

    rows, data = _rows(style, tmp_path)
    cfg = _cfg(style, data, tmp_path / "out")
    res = train_hop_by_hop(cfg, capture_grads=(1, STEPS))
    batches = [core.step_indices(len(rows), s, cfg.batch_size, cfg.system.seed) for s in range(STEPS)]
    ref = _reference(cfg, rows, batches)

    roles = get_style(style).roles
    assert set(res.metrics["workers"]) == set(roles) and len(roles) >= 3  # one Ray Train worker per stage
    assert all(w["frozen_unchanged"] is True for w in res.metrics["workers"].values()), res.metrics["workers"]
    got = res.metrics["captured_grads"]
    assert set(got) == set(ref["grads"]) == {1, STEPS}
    for step in got:
        assert set(got[step]) == set(ref["grads"][step]) == set(decoder_edges(get_style(style), _sched(style)))
        for edge, grads in ref["grads"][step].items():
            for name, g in grads.items():
                assert float(g.abs().sum()) > 0.0, (step, edge, name)
                torch.testing.assert_close(got[step][edge][name], g, rtol=1e-5, atol=1e-8)
    assert [round(e["loss"], 5) for e in res.log] == [round(e["loss"], 5) for e in ref["log"]]
    saved = load(res.save_dir / LINKS_FILE)
    assert list(saved) == list(ref["links"])  # every sent edge, in schedule order
    for edge, entry in ref["links"].items():
        for key, want in entry.items():
            torch.testing.assert_close(saved[edge][key], want, rtol=1e-5, atol=1e-8)
        trained = edge in decoder_edges(get_style(style), _sched(style))
        assert (float(saved[edge]["residual.weight"].abs().sum()) > 0.0) == trained, edge


def _sched(style):
    from recmas_ray.styles import build_schedule, get_style

    return build_schedule(get_style(style), 1)


@pytest.mark.integration
def test_the_python_api_trains_the_schedule(ray_cluster, tmp_path):
    import recmas_ray as rm
    from recmas_ray.train.hop_by_hop import LINKS_FILE, load

    rows, _ = _rows("distillation", tmp_path, num_train=4)
    out = rm.train_outer("distillation", rows=rows, save_dir=tmp_path / "outer", preset="tiny", task="qa",
                         num_recursive_rounds=1, schedule="hop_by_hop", rollout_latent_steps=2, max_steps=2,
                         batch_size=2, progress=False, cpus_per_worker=0.5, max_failures=0)
    saved = load(out / LINKS_FILE)
    assert set(saved) == {"expert->learner"} and float(saved["expert->learner"]["residual.weight"].abs().sum()) > 0
    assert (out / "config.json").exists() and (out / "log.json").exists()


def _refused(capsys, tmp_path, *flags):
    from jobs import train_outer
    from recmas_ray.train.synthetic import make_arithmetic_dataset, write_jsonl

    data = write_jsonl(make_arithmetic_dataset(4, seed=0), tmp_path / "train.jsonl")
    argv = ["--style", "sequential_light", "--preset", "tiny", "--dataset_name", str(data), "--save_dir",
            str(tmp_path / "out"), "--schedule", "hop_by_hop", "--num_recursive_rounds", "1",
            "--rollout_latent_steps", "2", *flags]
    assert train_outer.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not (tmp_path / "out").exists()  # refused before anything is written
    return err[0]


@pytest.mark.parametrize("flags, says", [
    (("--num_recursive_rounds", "2"), "one round whose decoder runs last"),
    (("--rollout_latent_steps", "0"), "needs --rollout_latent_steps m > 0"),
    (("--latent_norm", "embedding"), "--latent_norm embedding: not available with --schedule hop_by_hop"),
    (("--num_microbatches", "2", "--batch_size", "2"), "--num_microbatches 2: not available"),
])
def test_what_the_schedule_cannot_train_is_refused_in_one_line(capsys, tmp_path, nothing_heavy, flags, says):
    assert says in _refused(capsys, tmp_path, *flags)


def test_a_decoder_that_is_not_last_is_refused(capsys, tmp_path, nothing_heavy, monkeypatch):
    from recmas_ray.styles import get_style
    from recmas_ray.train import config

    planner_decodes = dataclasses.replace(get_style("sequential_light"), decoder="planner")
    monkeypatch.setattr(config, "get_style", lambda name: planner_decodes)
    line = _refused(capsys, tmp_path)
    assert "--style sequential_light with --num_recursive_rounds 1 runs planner -> critic (decoder planner)" in line
