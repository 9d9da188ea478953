"""jobs/experiments/hop_by_hop.py on tiny models: the sweep's hop-by-hop recipe trains through the product's
`--schedule hop_by_hop` (Ray Train, the session cluster) in its own data order; the hops into the decoder train
on exactly what inference sends them, the earlier hops stay the pure translation, and the saved links come back
identical (checked on load)."""

import pytest
import torch

pytestmark = pytest.mark.timeout(600)

M = 3


@pytest.fixture()
def chain(tiny_cache):
    from jobs.experiments.sweep_recipe_measure import CapturePool
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.synthetic_facts import split_by_value

    torch.manual_seed(0)
    plan = plan_system("sequential_light", preset="tiny", seed=0, task="qa")
    train, seen, _ = split_by_value("recall", "sequential_light", num_train=8, num_seen=3, num_unseen=0, seed=0)
    return plan, (lambda: local_pool(plan, pool_cls=CapturePool)), train, seen


def _config(style, rows, save_dir, m=M, steps=3):
    """The sweep's hop-by-hop OuterTrainConfig for the tiny plan of `style` (seed 0: the fixtures' plans)."""
    from jobs.experiments.sweep_recipe import RECIPES
    from recmas_ray.system.config import with_system
    from recmas_ray.train.config import OuterTrainConfig
    from recmas_ray.train.synthetic import write_jsonl

    recipe = {k: m if v == "m" else v for k, v in RECIPES["token_hop_by_hop_r1"].items()}
    return with_system(OuterTrainConfig, style=style, preset="tiny", seed=0, task="qa", save_dir=str(save_dir),
                       dataset_name=str(write_jsonl(rows, save_dir.parent / f"{save_dir.name}.jsonl")),
                       max_steps=steps, batch_size=2, progress=False, cpus_per_worker=0.5, max_failures=0,
                       **{**recipe, "lr": 1e-2, "token_tau": 0.05})


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory):
    """One training of the chain for the module: the second test finds its links.pt and reuses it."""
    return tmp_path_factory.mktemp("chain") / "outer"


def _train(pool, plan, rows, save_dir, steps=3):
    from jobs.experiments import hop_by_hop

    done = hop_by_hop.train(_config(plan.style_name, rows, save_dir, steps=steps), len(rows))
    hop_by_hop.attach(pool, done["links"])
    return done


def test_the_last_hop_trains_on_the_message_inference_sends(ray_cluster, chain, shared_dir):
    from jobs.experiments import hop_by_hop
    from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
    from recmas_ray.engine.runner import run_batch
    from recmas_ray.styles import build_schedule
    from recmas_ray.train.data import question_text
    from recmas_ray.train.outer import prepare_samples

    plan, make_pool, train, seen = chain
    pool = make_pool()
    _train(pool, plan, train, shared_dir)
    agents = {r: s.agent for r, s in pool.services.items()}
    run_batch(pool, plan.style, [question_text(r) for r in seen], ["qa"] * len(seen),
              RecursionConfig(method="recursive_mas", num_recursive_rounds=1, latent_steps=M,
                              decode=DecodeConfig(max_new_tokens=2)))
    sent_BME = pool.messages["critic->solver"][-1]
    z_ND = hop_by_hop.sender_latents(agents, plan.style, build_schedule(plan.style, 1), "qa", M,
                                     prepare_samples(seen, plan.style, "qa"))["critic->solver"]
    with torch.no_grad():
        trained_BME = agents["critic"].outer_links["critic->solver"](z_ND).reshape(len(seen), M, -1)
    assert sent_BME.shape == trained_BME.shape
    torch.testing.assert_close(trained_BME.float(), sent_BME, atol=1e-5, rtol=1e-5)


def test_only_the_last_hop_changes_and_the_saved_links_reattach_identically(ray_cluster, chain, shared_dir,
                                                                           monkeypatch):
    from jobs.experiments import hop_by_hop
    from recmas_ray.styles import build_schedule
    from recmas_ray.train.outer import prepare_samples

    plan, make_pool, train, seen = chain
    pool = make_pool()
    done = _train(pool, plan, train, shared_dir)
    hop1, hop2 = (pool.services[r].agent.outer_links[e] for r, e in (("planner", "planner->critic"),
                                                                      ("critic", "critic->solver")))
    assert float(hop1.residual.weight.abs().sum() + hop1.residual.bias.abs().sum()) == 0.0
    assert float(hop2.residual.weight.abs().sum()) > 0.0
    assert len(done["log"]) == 3

    saved = hop_by_hop.load(shared_dir / hop_by_hop.LINKS_FILE)  # weights_only: tensors, no pickled objects
    assert set(saved) == {"planner->critic", "critic->solver"}
    again = make_pool()
    monkeypatch.setattr("recmas_ray.train.hop_by_hop_job.train_hop_by_hop", lambda *a, **k: pytest.fail("trained again"))
    reloaded = _train(again, plan, train, shared_dir)  # a finished training is reused, not repeated
    assert reloaded["log"] == done["log"]
    samples = prepare_samples(seen, plan.style, "qa")
    sched = build_schedule(plan.style, 1)
    z = [hop_by_hop.sender_latents({r: s.agent for r, s in p.services.items()}, plan.style, sched, "qa", M,
                                   samples)["critic->solver"] for p in (pool, again)]
    with torch.no_grad():
        msgs = [p.services["critic"].agent.outer_links["critic->solver"](zz) for p, zz in zip((pool, again), z)]
    torch.testing.assert_close(msgs[1], msgs[0])


def test_a_links_file_with_other_entries_is_refused(tmp_path):
    from jobs.experiments import hop_by_hop

    bad = {"a->b": {"residual.weight": torch.zeros(2, 2), "residual.bias": torch.zeros(2), "tau": torch.tensor(0.1),
                    "source_ids": torch.arange(2), "target_ids": torch.arange(2), "extra": torch.zeros(1)}}
    torch.save(bad, tmp_path / "links.pt")
    with pytest.raises(ValueError, match="should hold exactly"):
        hop_by_hop.load(tmp_path / "links.pt")


def test_the_trained_edges_are_those_into_the_decoder(tiny_cache):
    from jobs.experiments.hop_by_hop import decoder_edges
    from recmas_ray.styles import build_schedule, get_style

    got = {name: decoder_edges(get_style(name), build_schedule(get_style(name), 1))
           for name in ("sequential_light", "distillation", "mixture")}
    assert got == {"sequential_light": ["critic->solver"], "distillation": ["expert->learner"],
                   "mixture": ["math->summarizer", "code->summarizer", "science->summarizer"]}
    style = get_style("sequential_light")
    with pytest.raises(ValueError, match="one round"):
        decoder_edges(style, build_schedule(style, 2))  # every role twice: the solver's round-1 message goes on


def test_the_demo_runs_two_hop_tasks_with_the_two_hop_recipe(tmp_path):
    from jobs.experiments.demo.config import DemoConfig
    from jobs.experiments.demo.facts import sweep_config

    assert DemoConfig().fact_task_pairs() == [("distillation", "recall")]  # the default: one hop
    cfg = DemoConfig(tasks=["distillation:recall", "sequential_light:recall"])
    one, two = (sweep_config(cfg, s, t, tmp_path) for s, t in cfg.fact_task_pairs())
    assert one.recipes == [cfg.facts.recipe] and one.inner_steps == cfg.facts.inner_steps and one.role_models == {}
    assert two.recipes == ["token_hop_by_hop_r1"] and (two.inner_steps, two.inner_schedule) == (300, "constant")
    assert two.role_models == {"planner": "pkg:gemma3-270m"}
    tiny = DemoConfig()
    tiny.system.preset = "tiny"
    assert sweep_config(tiny, "sequential_light", "recall", tmp_path).role_models == {}  # tiny keeps random families


@pytest.mark.integration
def test_mixture_trains_every_expert_edge_into_the_summarizer(ray_cluster, tiny_cache, tmp_path):
    from jobs.experiments import hop_by_hop
    from recmas_ray.system.launch import local_pool
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.synthetic_facts import split_by_value

    torch.manual_seed(0)
    plan = plan_system("mixture", preset="tiny", seed=0, task="qa")
    train, _, _ = split_by_value("mixture", "mixture", num_train=6, num_seen=2, num_unseen=0, seed=0)
    pool = local_pool(plan)
    hop_by_hop.attach(pool, hop_by_hop.train(_config("mixture", train, tmp_path / "out", m=2, steps=2), len(train))["links"])
    for expert in ("math", "code", "science"):
        link = pool.services[expert].agent.outer_links[f"{expert}->summarizer"]
        assert float(link.residual.weight.detach().abs().sum()) > 0.0, expert
    assert set(hop_by_hop.load(tmp_path / "out" / hop_by_hop.LINKS_FILE)) == {"math->summarizer", "code->summarizer",
                                                                              "science->summarizer"}


def test_the_sweep_keeps_its_data_order():
    """The main job's two-hop links depend on it (pinned: what the in-process trainer drew before the move)."""
    from jobs.experiments.hop_by_hop import legacy_batches

    got = legacy_batches(5, 5, 2, 0)
    assert got == PINNED_ORDER
    for epoch in (got[0:2], got[2:4]):
        assert len({i for b in epoch for i in b}) == 4  # no row twice within an epoch


PINNED_ORDER = [[2, 1], [0, 4], [2, 0], [1, 4], [0, 2]]
"""random.Random(0) shuffling range(5) in place each epoch of 2 steps, as the old in-process loop did."""


def test_the_trained_token_links_load_in_the_product_as_they_ran(ray_cluster, chain, shared_dir):
    """hop_by_hop saves through the product's checkpoint layout: a plan built from the folder gives each sender the
    very link (kind, ids, tau, residual, tables) that trained, so jobs.run / jobs.serve / the API run it."""
    from recmas_ray.engine.links import link_state
    from recmas_ray.engine.service import AgentService
    from recmas_ray.system.plan import plan_system
    from recmas_ray.system.provenance import link_origin
    from recmas_ray.system.trained import trained_task

    plan, make_pool, train, _ = chain
    pool = make_pool()
    _train(pool, plan, train, shared_dir)
    assert link_origin(str(shared_dir))["known"] and trained_task({"outer": str(shared_dir)}) == "qa"
    loaded = plan_system("sequential_light", preset="tiny", seed=0, task="qa", ckpt_override={"outer": str(shared_dir)})
    x = torch.randn(2, M, plan.hidden_sizes["critic"])
    for edge in ("planner->critic", "critic->solver"):
        src = edge.split("->")[0]
        ran = pool.services[src].agent.outer_links[edge]
        assert all(torch.equal(a, b) for a, b in zip(link_state(ran).values(), link_state(loaded.links.outer[edge]).values()))
        rebuilt = AgentService(*loaded.service_args(src)).agent.outer_links[edge]
        if src == "critic":
            with torch.no_grad():
                assert torch.equal(rebuilt(x), ran(x))
