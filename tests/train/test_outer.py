"""Outer-loop exactness: the pipeline stages, talking over torch.distributed gloo in separate processes, give
the same outer-link gradients (and post-step weights) as the single-process autograd reference.

Four processes run `PipelineStage` (train/stage.py, the code the Ray Train workers run: p2p sends/recvs with length headers,
the tape, recompute, summed fan-out grads, global clipping by all-reduce) for sequential (3 ranks, a
subgroup) and mixture (4 ranks), R = 1, 2, 3, with and without --recompute, 3 samples in 2 microbatches,
latents trimmed to K = 12 with some gold texts shorter than K (so latent lengths differ per sample).
The same runs give the per-worker saved-activation peaks (flat in R with recompute) and a bf16 run checks
the fp32 master weights. Also: the CLI flags of jobs/train_outer.py.
"""

import functools
import itertools
import json
import os
import time

import pytest
import torch

from recmas_ray.styles import get_style

STYLES = {"sequential": 3, "mixture": 4}
ROUNDS = (1, 2, 3)
K = 12
LR, CLIP, SEED = 1e-3, 0.05, 7


M = 3
"""Latent steps of the full-rollout runs (--rollout_latent_steps M --rollout_stages all)."""


def config_grid():
    """(style, R, recompute, non_last_loss_weight, rollout m): both recompute modes; R = 2 also supervises round 1;
    the full rollout through every agent (m = M, non-reference) at R = 1 and R = 2 (decoder feedback rolled out)."""
    return [(s, r, rc, 0.3 if r == 2 else 0.0, 0) for s, r, rc in itertools.product(STYLES, ROUNDS, (False, True))] + \
        [(s, r, r == 2, 0.3 if r == 2 else 0.0, M) for s, r in itertools.product(STYLES, (1, 2))]


def tag(s, r, rc, m):
    return f"{s}-R{r}-rc{int(rc)}" + (f"-roll{m}" if m else "")


def make_rows():
    """Three rows with every field of sequential and mixture; targets of very different lengths."""
    texts = [("ok", "Step 1: add 2 and 3.", "2 + 3 = 5. \\boxed{5}"),
             ("Step 1: multiply the numbers, then add the rest", "fix", "\\boxed{12}"),
             ("Plan: 4*4", "Step 1: 4 * 4 = 16, done.", "It is 16, so \\boxed{16}.")]
    rows = []
    for i, (a, b, c) in enumerate(texts):
        rows.append({"id": f"row{i}", "question": f"What is {i} + {2 * i}?", "plan": a, "refined_plan": b,
                     "answer": c, "hie_math_expert": b, "hie_code_expert": a, "hie_science_expert": c[:7],
                     "hie_summarizer": c})
    return rows


def _cfg(style, rounds, recompute, w, m=0):
    from recmas_ray.system.config import with_system
    from recmas_ray.train.config import OuterTrainConfig

    return with_system(OuterTrainConfig, style=style, num_recursive_rounds=rounds, recompute=recompute, non_last_loss_weight=w,
                       batch_size=3, num_microbatches=2, max_latent_tokens=K, lr=LR, warmup_steps=0,
                       max_grad_norm=CLIP, seed=SEED, max_steps=10, profile_memory=True,
                       rollout_latent_steps=m, rollout_stages="all" if m else "first")


def _worker(rank, world, store, out_dir, rows):
    # One process = one role, exactly what a Ray Train worker builds, minus Ray.
    import torch.distributed as dist

    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.outer import prepare_samples
    from recmas_ray.train.pipeline import _build_stage

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    for style_name, n in STYLES.items():
        group = dist.new_group(list(range(n)))
        if rank >= n:
            continue
        style = get_style(style_name)
        role = style.roles[rank]
        plan = plan_system(style_name, preset="tiny", seed=SEED)
        system = {"role_models": plan.role_models, "hidden_sizes": plan.hidden_sizes}
        samples = prepare_samples(rows, style, "math")
        for s, r, rc, w, m in config_grid():
            if s != style_name:
                continue
            stage = _build_stage(_cfg(s, r, rc, w, m), style, role, system, plan.service_args(role)[1:],
                                 torch.device("cpu"), group=group)
            before = stage.frozen_digest()
            held_out = stage.evaluate(samples)  # no grad, no tape: must leave nothing behind
            assert not stage.tape and all(p.grad is None for m in stage.masters.values() for p in m.parameters())
            stats = stage.accumulate(samples)
            grads = stage.grads()
            stats = stage.update(stats)
            torch.save({"grads": grads, "masters": {e: m.state_dict() for e, m in stage.masters.items()},
                        "round_losses": stats.round_losses, "grad_norm": stats.grad_norm,
                        "eval_round_losses": held_out.round_losses,
                        "frozen_unchanged": stage.frozen_digest() == before, "peak_saved": stage.meter.peak},
                       os.path.join(out_dir, f"{tag(s, r, rc, m)}-{role}.pt"))
        if style_name == "sequential":  # bf16 models: p2p in bf16, AdamW on fp32 masters
            cfg = _cfg(style_name, 2, False, 0.0)
            cfg.system.dtype = "bfloat16"
            stage = _build_stage(cfg, style, role, system, plan.service_args(role)[1:], torch.device("cpu"), group=group)
            stats = stage.accumulate(samples)
            grads = stage.grads()
            stage.update(stats)
            torch.save({"grads": grads, "master_dtypes": {str(p.dtype) for m in stage.masters.values()
                                                          for p in m.parameters()},
                        "working_dtypes": {str(p.dtype) for m in stage.agent.outer_links.values() for p in m.parameters()},
                        "adam_dtypes": {str(v.dtype) for st in stage.opt.state.values() for v in st.values()
                                        if torch.is_tensor(v) and v.dim() > 0}},
                       os.path.join(out_dir, f"bf16-{role}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def pipeline_results(tiny_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("exact")
    rows = make_rows()
    ctx = torch.multiprocessing.spawn(_worker, args=(4, str(out / "store"), str(out), rows), nprocs=4, join=False)
    deadline = time.monotonic() + 420
    while not ctx.join(timeout=5):  # a p2p deadlock must fail the test, not hang it
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.terminate()
            pytest.fail("pipeline stages did not finish in 420 s (deadlock?)")
    return out, rows


@functools.lru_cache(maxsize=None)
def _reference(style_name, rounds, w, m=0):
    rows = make_rows()
    from recmas_ray.system.plan import plan_system
    from recmas_ray.train.reference import build_reference, reference_backward, reference_step

    plan = plan_system(style_name, preset="tiny", seed=SEED)
    agents, outer = build_reference(plan)
    losses = reference_backward(agents, outer, plan.style, rows, task="math", num_rounds=rounds,
                                max_latent_tokens=K, non_last_loss_weight=w, rollout_latent_steps=m,
                                rollout_stages="all" if m else "first")
    grads = {e: {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None} for e, m in outer.items()}
    opt = torch.optim.AdamW([p for m in outer.values() for p in m.parameters()], lr=LR, betas=(0.9, 0.95),
                            weight_decay=0.0)
    norm = reference_step(outer, opt, CLIP)
    return grads, {e: m.state_dict() for e, m in outer.items()}, losses, norm


@pytest.mark.timeout(600)
@pytest.mark.parametrize("style_name", list(STYLES))
def test_pipeline_grads_equal_single_process_reference(pipeline_results, style_name):
    out, rows = pipeline_results
    style = get_style(style_name)
    report = {}
    for s, r, rc, w, m in config_grid():
        if s != style_name:
            continue
        ref_grads, ref_masters, ref_losses, ref_norm = _reference(s, r, w, m)
        got = {role: torch.load(out / f"{tag(s, r, rc, m)}-{role}.pt", weights_only=False) for role in style.roles}
        max_diff = 0.0
        for role, res in got.items():
            assert res["frozen_unchanged"], f"{role}: base model or inner link changed"
            own = [e for e in style.edges if e.split("->")[0] == role]
            assert sorted(res["grads"]) == sorted(own)
            for edge in own:
                ref = ref_grads[edge]
                if r == 1 and edge in style.feedback_edges:  # unused feedback links get no gradient at R = 1
                    assert not ref and not res["grads"][edge]
                    continue
                assert sorted(res["grads"][edge]) == sorted(ref), edge
                for name, g in res["grads"][edge].items():
                    assert g.abs().max() > 0, f"{edge}.{name} got a zero gradient"
                    torch.testing.assert_close(g, ref[name], rtol=1e-4, atol=1e-6, msg=f"{s} R={r} rc={rc} {edge}.{name}")
                    max_diff = max(max_diff, float((g - ref[name]).abs().max()))
                for name, v in res["masters"][edge].items():
                    want, g = ref_masters[edge][name], ref.get(name)
                    # AdamW's first step is lr * g / (|g| + eps): where |g| is near eps (1e-8) the gradient's
                    # allowed error (atol 1e-6 above) swings the step by up to lr, so those elements are only
                    # held to one step's size; where the gradient is well above eps the step is determined
                    determined = g.abs() > 1e-5 if g is not None else torch.ones_like(v, dtype=torch.bool)
                    torch.testing.assert_close(v[determined], want[determined], rtol=1e-5, atol=1e-5)
                    assert float((v - want).abs().max()) <= 2 * LR + 1e-6, f"{edge}.{name}: more than one step apart"
        decoder = got[style.decoder]
        mean_final = sum(x[-1] for x in ref_losses) / len(rows)
        assert decoder["round_losses"][-1] == pytest.approx(mean_final, rel=1e-5)
        # held-out evaluation runs the same loss without gradients
        assert decoder["eval_round_losses"] == pytest.approx(decoder["round_losses"], rel=1e-6)
        assert decoder["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
        assert ref_norm > CLIP or m  # clipping was active, so the global norm mattered (rollout grads are smaller)
        report[tag(s, r, rc, m)] = max_diff
    print(f"\n[exactness] {style_name} max |grad - ref|: {json.dumps(report)}")


@pytest.mark.parametrize("style_name", list(STYLES))
def test_recompute_keeps_stage_memory_flat(pipeline_results, style_name):
    """Peak bytes saved for backward per worker: grows with R without --recompute, flat with it."""
    out, _ = pipeline_results
    style = get_style(style_name)
    peaks = {}
    for role in style.roles:
        p = {(r, rc): torch.load(out / f"{style_name}-R{r}-rc{int(rc)}-{role}.pt", weights_only=False)["peak_saved"]
             for r in ROUNDS for rc in (False, True)}
        peaks[role] = {f"R{r}{'-rc' if rc else ''}": round(v / 2**20, 3) for (r, rc), v in p.items()}
        assert p[(3, False)] > 1.5 * p[(1, False)], (role, p)  # the tape holds one graph per round
        assert p[(3, True)] <= 1.02 * p[(2, True)], (role, p)  # recompute: one stage graph at a time
        assert p[(3, True)] < p[(3, False)] / 1.5, (role, p)
        if any(e in style.forward_edges for _, e in style.slots.get(role, {}).items()):
            # roles fed in round 1 already run a full stage graph at R = 1: flat from R = 1 on
            assert p[(3, True)] <= 1.02 * p[(1, True)], (role, p)
    print(f"\n[memory] {style_name} peak saved MiB per worker: {json.dumps(peaks)}")


def test_bf16_models_keep_fp32_master_links(pipeline_results):
    """bf16 base models: latents and grads travel in bf16, but grads accumulate and AdamW steps in fp32 masters."""
    out, _ = pipeline_results
    ref_grads = _reference("sequential", 2, 0.0)[0]
    for role in get_style("sequential").roles:
        res = torch.load(out / f"bf16-{role}.pt", weights_only=False)
        assert res["master_dtypes"] == {"torch.float32"} and res["adam_dtypes"] == {"torch.float32"}
        assert res["working_dtypes"] == {"torch.bfloat16"}
        for edge, grads in res["grads"].items():
            for name, g in grads.items():
                assert g.dtype == torch.float32
                cos = torch.nn.functional.cosine_similarity(g.flatten(), ref_grads[edge][name].flatten(), dim=0)
                assert cos > 0.9, (edge, name, float(cos))


def test_cli_flags_map_onto_the_config(tmp_path):
    from recmas_ray.config.cli import parse_config
    from recmas_ray.config.checks import ConfigError
    from recmas_ray.train.config import OuterTrainConfig

    def parse(*argv):
        return parse_config(OuterTrainConfig, list(argv))[0]

    m, c = tmp_path / "m", tmp_path / "c"
    m.mkdir(), c.mkdir()
    cfg = parse("--style", "mixture", "--ckpt_override", f"math={m}", f"code={c}", "--dataset_name", "synthetic:8",
                "--dataset_json_field", "data", "--save_dir", str(tmp_path / "s"), "--num_recursive_rounds", "2",
                "--max_latent_tokens", "16", "--max_steps", "5", "--batch_size", "4", "--num_microbatches", "2",
                "--lr", "1e-4", "--warmup_steps", "1", "--max_grad_norm", "0.5", "--non_last_loss_weight", "0.1",
                "--seed", "3", "--resume", "--recompute", "--role_model", "math=tiny:llama", "--max_length", "512",
                "--eval_every", "2", "--eval_dataset", "synthetic:4")
    assert cfg.system.ckpt_override == {"math": str(m), "code": str(c)} and cfg.system.style == "mixture"
    assert (cfg.num_recursive_rounds, cfg.max_latent_tokens, cfg.max_steps, cfg.batch_size) == (2, 16, 5, 4)
    assert (cfg.num_microbatches, cfg.lr, cfg.warmup_steps, cfg.max_grad_norm) == (2, 1e-4, 1, 0.5)
    assert cfg.non_last_loss_weight == 0.1 and cfg.resume and cfg.recompute and not cfg.use_gpu
    assert cfg.system.role_models == {"math": "tiny:llama"} and (cfg.max_length, cfg.eval_every) == (512, 2)
    assert parse("--mas_design", "mixture") == parse("--style", "mixture")
    defaults = parse("--style", "sequential", "--save_dir", str(tmp_path / "s"))
    assert (defaults.num_recursive_rounds, defaults.max_latent_tokens, defaults.non_last_loss_weight) == (3, 80, 0.0)
    with pytest.raises(ConfigError, match="num_microbatches"):
        parse("--style", "sequential", "--batch_size", "1", "--num_microbatches", "2")


def test_left_truncation_keeps_the_gold_turn_and_is_counted(tiny_cache):
    """Stages longer than --max_length lose the START of their prompt: the assistant turn survives intact."""
    from recmas_ray.models.loader import load_frozen_model
    from recmas_ray.engine.agent import Agent
    from recmas_ray.system.link_init import seeded_inner_link
    from recmas_ray.styles import build_schedule
    from recmas_ray.train.outer import encode_stage, prepare_samples, truncate_left

    e, ids, asst = torch.zeros(10, 2), torch.arange(10), torch.tensor([False] * 6 + [True] * 4)
    e2, ids2, asst2, cut = truncate_left(e, ids, asst, 5)
    assert cut and ids2.tolist() == [5, 6, 7, 8, 9] and asst2.tolist() == [False, True, True, True, True]
    assert truncate_left(e, ids, asst, 10)[3] is False
    style = get_style("sequential")
    model, tok = load_frozen_model("tiny:qwen3", dtype=torch.float32)
    agent = Agent(model, tok, seeded_inner_link(64, seed=0, role="planner"), role="planner", model_name="tiny:qwen3",
                  system_prompt=style.system_prompt)
    samples = prepare_samples(make_rows(), style, "math")
    step = build_schedule(style, 1)[0]
    kw = dict(task="math", num_rounds=1, max_latent_tokens=K, non_last_loss_weight=0.0, batch_size=3)
    full = encode_stage(agent, style, step, samples, {}, **kw)
    turn = [len(tok(s.targets["planner"] + agent.assistant_turn_end()).input_ids) for s in samples]
    short = encode_stage(agent, style, step, samples, {}, max_length=max(turn) + 2, **kw)
    assert full.truncated == [False] * 3 and short.truncated == [True] * 3
    assert short.lengths == full.lengths  # the first K latents come from the intact gold turn
