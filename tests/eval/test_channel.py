"""What crosses a token link (`recmas_ray/eval/channel.py`, `links.token_channel`): the figures a recursive_mas
run records per edge are in [0, 1] and equal a direct computation from the sender agent and its link."""

import pytest
import torch

from recmas_ray.config.recursion import DecodeConfig, RecursionConfig
from recmas_ray.eval.channel import channel_lines, channel_summary
from recmas_ray.engine.links import TokenLink, token_channel
from recmas_ray.engine.runner import run_batch
from recmas_ray.styles import render_prompt
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system
from tests.system.link_folders import STYLE, TASK, write_system_folder

QUESTIONS = ["x = 41. What is x?", "y = 17. What is y?"]
EDGE, SLOT = "critic->solver", "<<LATENT_PLANNER_SLOT>>"


def test_token_channel_is_the_links_own_softmax_and_residual():
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randn(12, 8, generator=gen), torch.randn(12, 6, generator=gen)
    link = TokenLink(src, dst, 0.1)
    with torch.no_grad():
        link.residual.weight.copy_(0.1 * torch.randn(6, 8, generator=gen))
    x = torch.randn(2, 5, 8, generator=gen)
    c = token_channel(link, x)
    p = torch.softmax(torch.nn.functional.normalize(x, dim=-1) @ torch.nn.functional.normalize(src, dim=-1).T / 0.1,
                      dim=-1)
    r = x @ link.residual.weight.detach().T
    assert torch.allclose(c["top1_BM"], p.max(-1).values, atol=1e-6)
    assert torch.equal(c["source_ids_BM"], p.argmax(-1))  # ids given as the table's rows: 0..K-1
    share = r.norm(dim=-1) / ((p @ dst).norm(dim=-1) + r.norm(dim=-1))
    assert torch.allclose(c["residual_share_BM"], share, atol=1e-6)
    assert torch.allclose(link(x), p @ dst + r, atol=1e-5)  # the figures describe what forward sends
    assert ((c["top1_BM"] > 0) & (c["top1_BM"] <= 1)).all() and ((share >= 0) & (share <= 1)).all()


def test_a_recursive_mas_run_records_what_its_token_link_sent(tmp_path, tiny_cache):
    folder = write_system_folder(tmp_path / "sys")
    plan = plan_system(STYLE, preset="tiny", seed=0, task=TASK, ckpt_override={"outer": str(folder / "outer")})
    pool = local_pool(plan)
    seen = []
    cfg = RecursionConfig(num_recursive_rounds=1, latent_steps=3, decode=DecodeConfig(max_new_tokens=4))
    res = run_batch(pool, plan.style, QUESTIONS, [TASK] * 2, cfg, capture=seen.append)
    step = next(t for t in res[0].trace if t["role"] == "critic")
    assert set(step["channel"]) == {EDGE}  # the token link's edge only; planner->critic is a release OuterLink
    # the direct computation: the critic's prompt with the planner's message, the uncached rollout, its link
    critic = pool.services["critic"].agent
    message = next(e["message"] for e in seen if e.get("edge") == "planner->critic")
    users = [render_prompt(plan.style, "critic", "base", TASK, q) for q in QUESTIONS]
    with torch.no_grad():
        h = critic.latent_rollout(*critic.embed_batch(users, {SLOT: message.to(critic.dtype)}), 3, use_cache=False)
        c = token_channel(critic.outer_links[EDGE], critic.inner_link(h))
    for b, r in enumerate(res):
        got = next(t for t in r.trace if t["role"] == "critic")["channel"][EDGE]
        assert got["top1"] == pytest.approx(float(c["top1_BM"][b].mean()), abs=1e-5)
        assert got["residual_share"] == pytest.approx(float(c["residual_share_BM"][b].mean()), abs=1e-5)
        assert got["nearest"] == critic.tokenizer.decode(c["source_ids_BM"][b].tolist())
        assert 0 <= got["top1"] <= 1 and 0 < got["residual_share"] < 1
    pool.shutdown()
    samples = [{"doc_id": str(b), "method": "recursive_mas", "rollout": 0, "trace": r.trace} for b, r in enumerate(res)]
    summary = channel_summary(samples)[EDGE]
    assert summary["num_messages"] == 2 and [n["doc_id"] for n in summary["nearest"]] == ["0", "1"]
    assert summary["mean_top1"] == pytest.approx(float(c["top1_BM"].mean()), abs=1e-5)
    assert channel_lines({EDGE: summary})[0].startswith(f"{EDGE}: mean top-1 probability ")


def test_summary_keeps_the_first_three_questions_and_ignores_other_methods():
    def sample(doc, method="recursive_mas", top1=0.5):
        return {"doc_id": doc, "method": method, "rollout": 0,
                "trace": [{"round": 1, "channel": {EDGE: {"top1": top1, "residual_share": 0.25, "nearest": doc}}}]}

    samples = [sample(d) for d in ("d", "a", "c", "b")] + [sample("z", "textmas", top1=0.0)]
    summary = channel_summary(samples)[EDGE]
    assert [n["text"] for n in summary["nearest"]] == ["a", "b", "c"]
    assert summary["mean_top1"] == 0.5 and summary["num_messages"] == 4 and summary["mean_residual_share"] == 0.25
    assert channel_summary([sample("a", "textmas")]) == {}
