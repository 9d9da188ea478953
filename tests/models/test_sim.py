"""Simulated agents' cost: it grows with the batch (row_share) and rows stop at different tokens
(eos_spread); the defaults keep the flat table."""

import time

import pytest
import torch

from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.models.sim import SimulatedAgent, call_device_ms, parse_sim_name


def _seconds(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def test_a_bigger_batch_takes_longer_when_rows_cost_something():
    agent = SimulatedAgent("sim:hidden=8,step_ms=20,row_share=0.5", role="planner")
    one, _ = _seconds(lambda: agent.latent_rollout(torch.zeros(1, 1, 1), None, 2))
    eight, h = _seconds(lambda: agent.latent_rollout(torch.zeros(8, 1, 1), None, 2))
    assert h.shape == (8, 2, 8)
    assert eight >= 0.040 * 4.5 and eight > 2 * one  # 40 ms x (1 + 0.5 x 7)


def test_rows_stop_at_different_tokens_and_the_call_lasts_for_the_longest():
    agent = SimulatedAgent("sim:hidden=8,token_ms=5,tokens=40,eos_spread=0.5", role="solver")
    seconds, out = _seconds(lambda: agent.decode(torch.zeros(6, 1, 1), None, DecodeConfig(max_new_tokens=64),
                                                 seeds=[11, 12, 13, 14, 15, 16]))
    counts = [d.num_tokens for d in out]
    assert len(set(counts)) > 1 and all(20 <= n <= 40 for n in counts)
    assert counts == [agent.row_tokens(64, s) for s in (11, 12, 13, 14, 15, 16)]  # the same draw every time
    assert seconds >= max(counts) * 0.005
    flat = SimulatedAgent("sim:hidden=8,token_ms=0,tokens=40", role="solver")
    assert [d.num_tokens for d in flat.decode(torch.zeros(3, 1, 1), None, DecodeConfig(max_new_tokens=64))] == [40] * 3
    assert parse_sim_name("sim:")["row_share"] == 0.0 and parse_sim_name("sim:")["eos_spread"] == 0.0


def test_a_zero_cost_call_does_not_wait_at_all(monkeypatch):
    """Zero cost (the control-plane benchmark's agents) never sleeps: even sleep(0) hands the GIL to the actor's
    other threads and waits to get it back."""
    from recmas_ray.models import sim

    def no_sleep(seconds):
        raise AssertionError(f"slept {seconds}")

    monkeypatch.setattr(sim.time, "sleep", no_sleep)
    agent = SimulatedAgent("sim:hidden=8,step_ms=0,token_ms=0,tokens=2,prefill_ms=0", role="solver")
    assert agent.latent_rollout(torch.zeros(2, 1, 1), None, 3).shape == (2, 3, 8)
    assert [d.num_tokens for d in agent.decode(torch.zeros(2, 1, 1), None, DecodeConfig(max_new_tokens=4))] == [2, 2]


def test_the_cost_table_prices_prefill_per_row_token_and_rows_leaving_at_eos():
    p = parse_sim_name("sim:token_ms=1,row_share=0.5,prefill_ms=1,prompt_tokens=10,prefill_token_ms=0.1")
    # prefill 1 + 10 x 0.1 x 2 rows = 3; tokens 0-1 with 2 rows at 1.5 each, tokens 2-3 with 1 row at 1
    assert call_device_ms(p, "decode", 2, 4, [2, 4]) == pytest.approx(3 + 2 * 1.5 + 2 * 1.0)
    assert call_device_ms(p, "rollout", 2, 4) == pytest.approx(3 + 4 * 5.0 * 1.5)  # step_ms default 5


def test_each_call_reports_its_device_time():
    agent = SimulatedAgent("sim:hidden=8,step_ms=1,token_ms=1,tokens=6,eos_spread=0.5,row_share=0.25", role="solver")
    agent.latent_rollout(torch.zeros(3, 1, 1), None, 4)
    assert agent.device_s_total == pytest.approx(call_device_ms(agent.params, "rollout", 3, 4) / 1000)
    before = agent.device_s_total
    out = agent.decode(torch.zeros(3, 1, 1), None, DecodeConfig(max_new_tokens=64), seeds=[1, 2, 3])
    counts = [d.num_tokens for d in out]
    assert agent.device_s_total - before == pytest.approx(
        call_device_ms(agent.params, "decode", 3, max(counts), counts) / 1000)


def test_a_simulated_agent_reads_every_latent_it_receives():
    """Before, the latents were only received (a mapped object-store buffer never touched), so a transport
    figure measured with simulated agents left out reading what was delivered."""
    agent = SimulatedAgent("sim:hidden=8", role="critic")
    a, b = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8), torch.full((2, 1, 8), 0.25).bfloat16()
    agent.embed_batch(["q1", "q2"], {"<<A>>": a, "<<B>>": b})
    assert agent.latent_checksum == pytest.approx(float(a.sum()) + 2 * 8 * 0.25)
    assert agent.bytes_read_total == a.numel() * 4 + b.numel() * 2
