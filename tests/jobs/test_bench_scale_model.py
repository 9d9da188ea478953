"""jobs/bench/scale_model.py: the discrete-event model gives known throughputs exactly on simple cases, routes
with the production RoleGroup, reads busy time by device and by host apart, and the dilation check flags a
run whose ratios move; the steady window reads the true rate."""

import pytest

from jobs.bench.call_logs import steady_window, summarize
from jobs.bench.scale_model import (batch_calls, dilation_check, expected_role_ms, model_run, pool_caps, project,
                                    simulate)
from recmas_ray.models.sim import call_device_ms, paper_sim_models, parse_sim_name
from recmas_ray.styles import get_style
from recmas_ray.system.presets import role_models

LIGHT = role_models("sequential_light", "paper")
"""The paper light system's base model per role (its costs are proportional to their parameters)."""

STYLE = get_style("sequential_light")
KW = dict(rounds=1, latent_steps=10, max_new_tokens=20, batch_size=1)


def _params(planner_ms: float, critic_ms: float, solver_ms: float) -> dict:
    """One row, no prefill, no EOS spread: a planner or critic rollout costs 10 x step, a decode 20 x token."""
    return {"planner": parse_sim_name(f"sim:step_ms={planner_ms}"),
            "critic": parse_sim_name(f"sim:step_ms={critic_ms}"),
            "solver": parse_sim_name(f"sim:step_ms=1,token_ms={solver_ms},tokens=20")}


def test_one_batch_at_a_time_takes_the_sum_of_its_calls():
    params = _params(1, 2, 3)  # 10 + 20 + 60 ms per batch
    run = model_run(STYLE, params, [{"planner": 1, "critic": 1, "solver": 1}], num_batches=8, depth=1, **KW)
    assert run["throughput_batches_per_s"] == pytest.approx(1 / 0.090, rel=1e-9)
    assert run["busy_by_role"]["solver"] == pytest.approx(60 / 90, rel=1e-9)


def test_a_full_pipeline_runs_at_its_slowest_role():
    params = _params(1, 2, 3)
    run = model_run(STYLE, params, [{"planner": 1, "critic": 1, "solver": 1}], num_batches=30, depth=3, **KW)
    assert run["throughput_batches_per_s"] == pytest.approx(1 / 0.060, rel=1e-9)
    assert run["busy_by_role"] == pytest.approx({"planner": 1 / 6, "critic": 2 / 6, "solver": 1.0}, rel=1e-9)


def test_least_queued_routing_spreads_the_slow_role_over_its_copies():
    params = _params(1, 1, 3)
    one = model_run(STYLE, params, [{"planner": 1, "critic": 1, "solver": 1}], num_batches=40, depth=4, **KW)
    two = model_run(STYLE, params, [{"planner": 1, "critic": 1, "solver": 2}], num_batches=40, depth=4, **KW)
    assert two["throughput_batches_per_s"] == pytest.approx(2 * one["throughput_batches_per_s"], rel=1e-9)
    assert two["busy_by_role"]["solver"] == pytest.approx(1.0, rel=1e-9)  # both copies always busy


def test_host_time_is_not_counted_as_device_time():
    params = _params(1, 2, 3)
    run = model_run(STYLE, params, [{"planner": 1, "critic": 1, "solver": 1}], num_batches=30, depth=3,
                    agent_host_s_per_call=0.020, **KW)
    assert run["throughput_batches_per_s"] == pytest.approx(1 / 0.080, rel=1e-9)  # 60 ms device + 20 ms host
    assert run["host_busy_by_role"]["solver"] == pytest.approx(1.0, rel=1e-9)
    assert run["busy_by_role"]["solver"] == pytest.approx(60 / 80, rel=1e-9)


def test_costs_times_k_scale_time_and_keep_every_ratio():
    params = {r: parse_sim_name(m) for r, m in paper_sim_models(LIGHT, ms_per_gparam=5).items()}
    double = {r: parse_sim_name(m) for r, m in paper_sim_models(LIGHT, ms_per_gparam=10).items()}
    kw = dict(rounds=3, latent_steps=8, max_new_tokens=32, batch_size=4, num_batches=60, depth=12)
    layout = [{"planner": 2, "critic": 1, "solver": 3}]
    a, b = model_run(STYLE, params, layout, **kw), model_run(STYLE, double, layout, **kw)
    assert b["throughput_batches_per_s"] * 2 == pytest.approx(a["throughput_batches_per_s"], rel=1e-6)
    assert b["busy_by_role"] == pytest.approx(a["busy_by_role"], rel=1e-6)


def test_the_batch_walks_the_style_schedule_with_its_inputs():
    calls = batch_calls(STYLE, 2, 8, 32)
    assert [(c.role, c.kind) for c in calls] == [("planner", "rollout"), ("critic", "rollout"), ("solver", "rollout"),
                                                 ("planner", "rollout"), ("critic", "rollout"), ("solver", "decode")]
    assert calls[0].inputs == [] and calls[1].inputs == [0] and calls[3].inputs == [2]  # feedback from round 1


def test_expected_costs_are_the_cost_table_per_batch():
    params = {r: parse_sim_name(m) for r, m in paper_sim_models(LIGHT, ms_per_gparam=10, eos_spread=0).items()}
    costs = expected_role_ms(STYLE, params, 1, 8, 32, 4)
    assert costs["planner"] == pytest.approx(call_device_ms(params["planner"], "rollout", 4, 8))
    assert costs["solver"] == pytest.approx(call_device_ms(params["solver"], "decode", 4, 32))


def test_dilation_check_flags_a_run_whose_ratios_move():
    def run(x_whole, x_pools, busy):
        return {"rounds": 3, "per_gpu_ratio": x_pools / x_whole,
                "whole_system": {"throughput_batches_per_s": x_whole, "min_role_busy": busy},
                "per_role_pools": {"throughput_batches_per_s": x_pools, "min_role_busy": busy}}

    device_bound = dilation_check(run(1.0, 1.6, 0.8), run(0.5, 0.8, 0.8), 2.0, 0.02)
    assert not device_bound["host_bound"] and device_bound["largest_change"] == pytest.approx(0.0)
    host_bound = dilation_check(run(1.0, 1.4, 0.7), run(0.5, 0.8, 0.8), 2.0, 0.02)  # host overhead shrank
    assert host_bound["host_bound"] and host_bound["largest_change"] == pytest.approx(1.6 / 1.4 - 1)


def test_projection_saturates_where_one_orchestrator_runs_out():
    params = _params(1, 2, 3)
    out = project(STYLE, params, {"planner": 1, "critic": 1, "solver": 1}, [3, 30], depth=3, batches_per_depth=10,
                  orchestrator_s_per_call=0.004, router_s_per_batch=0.0, agent_host_s_per_call=0.0, **KW)
    # 3 calls x 4 ms of orchestrator time per batch: one orchestrator carries 83 batches/s, 10 replicas ask 167
    sharded, shared = out["rows"][1]["orchestrator_per_replica"], out["rows"][1]["one_orchestrator"]
    assert sharded["efficiency"] == pytest.approx(1.0, abs=0.02) and sharded["bound"] == "devices"
    assert shared["throughput_batches_per_s"] == pytest.approx(1 / 0.012, rel=0.02) and shared["bound"] == "orchestrator"
    assert out["saturates_at_gpus"]["one_orchestrator"] == pytest.approx(3 * (1 / 0.012) / (1 / 0.060), rel=0.02)


def test_summary_reads_device_time_from_the_logs():
    # one batch, so no steady window: the decode's span [1, 2] is read; the planner's call covers half of it
    logs = [{"planner": [{"method": "rollout", "t0": 0.5, "t1": 1.5, "device_s": 0.5}],
             "solver": [{"method": "decode", "t0": 1.0, "t1": 2.0, "device_s": 0.8}]}]
    out = summarize(logs, [0.5])
    assert out["busy_by_role"] == pytest.approx({"planner": 0.25, "solver": 0.8})
    assert out["host_busy_by_role"] == pytest.approx({"planner": 0.5, "solver": 1.0})


def test_steady_rate_is_the_true_rate_however_completions_bunch():
    """Six whole systems, 2 batches in flight each, finish in bunches of six every 8 s: the steady-state
    rate is 6 / 8 per s wherever the window's edges fall (a count of whole completions jumps by six as an edge
    crosses a bunch)."""
    # 6 replicas x 12 batches; batch i of a replica enters when batch i - 2 finishes (0 and 1 at once)
    decodes = [(8.0 * i + 0.5, 8.0 * i + 8.5) for i in range(12) for _ in range(6)]
    entries = [0.0 if i < 2 else 8.0 * (i - 2) + 8.5 for i in range(12) for _ in range(6)]
    t_a, t_b, done = steady_window(decodes, entries)
    assert (t_a, t_b) == (16.5, 80.5)  # the 12th end (the burst's last batch) to the last entry
    assert abs(done / (t_b - t_a) - 6 / 8) < 1e-9
    # the same with the replicas out of step by 1 s each (a role's copies)
    decodes = [(8.0 * i + 0.5 + r, 8.0 * i + 8.5 + r) for i in range(12) for r in range(6)]
    entries = [(0.0 if i < 2 else 8.0 * (i - 2) + 8.5) + r for i in range(12) for r in range(6)]
    t_a, t_b, done = steady_window(decodes, entries)
    assert (t_a, t_b) == (21.5, 85.5) and abs(done / (t_b - t_a) - 6 / 8) < 1e-9


def test_without_a_steady_state_the_whole_run_counts():
    decodes = [(0.0, 8.0), (0.0, 8.0)]  # both batches entered at once: no window
    assert steady_window(decodes, [0.0, 0.0]) == (0.0, 8.0, 2.0)


def test_as_built_a_call_is_routed_when_its_inputs_exist_which_feeds_the_pools_at_r3():
    """The default is the production path's routing (when a call's inputs exist). On the R = 3 pools of the
    docs' table (5 / 3 / 10 copies, two batches per actor in flight) it keeps the least busy role above 0.8,
    where picking every copy at submission counted work that could not run and left copies idle (< 0.76)."""
    params = {r: parse_sim_name(m) for r, m in paper_sim_models(LIGHT).items()}
    kw = dict(rounds=3, latent_steps=32, max_new_tokens=256, batch_size=4, num_batches=10 * 36, depth=36)
    layout = [{"planner": 5, "critic": 3, "solver": 10}]
    built, ready = model_run(STYLE, params, layout, **kw), model_run(STYLE, params, layout, route_when="ready", **kw)
    earlier = model_run(STYLE, params, layout, route_when="submitted", **kw)
    assert built == ready
    assert built["min_role_busy"] > 0.8 > 0.76 > earlier["min_role_busy"]
    assert built["throughput_batches_per_s"] > 1.05 * earlier["throughput_batches_per_s"]


def test_pool_caps_are_what_a_perfect_scheduler_gets_from_the_copies_and_from_any_split():
    """Two roles costing 1 and 3 per batch on 4 GPUs (2 whole systems, paced by the slow role): any split gives
    4 / (1 + 3) batches per cost unit against 2 / 3, i.e. 1.5x; copies 1 / 3 reach it, 2 / 2 leave the slow role
    short (2 copies / 3) and give 1.0x."""
    costs = {"fast": 1.0, "slow": 3.0}
    assert pool_caps(costs, {"fast": 1, "slow": 3}, 2) == pytest.approx(
        {"ideal_per_gpu_ratio": 1.5, "ideal_ratio_for_these_copies": 1.5})
    assert pool_caps(costs, {"fast": 2, "slow": 2}, 2)["ideal_ratio_for_these_copies"] == pytest.approx(1.0)


def test_a_runs_own_decode_times_reproduce_it_and_a_short_list_is_refused():
    """The model of a Ray run is given that run's decode times in the order its batches entered: fed a model
    run's own, it must replay that run exactly (and differ from another draw's)."""
    params = {r: parse_sim_name(m) for r, m in paper_sim_models(LIGHT, ms_per_gparam=5, tokens=32,
                                                                         eos_spread=0.5).items()}
    kw = dict(rounds=3, latent_steps=8, max_new_tokens=32, batch_size=4, num_batches=40, depth=6)
    layout = [{"planner": 1, "critic": 1, "solver": 1}]  # the solver paces: its decode times set the rate
    sim = simulate(STYLE, params, layout, seed=3, **kw)
    calls = [c for log in sim["logs"] for cs in log.values() for c in cs]
    decode_by_batch = {c["batch"]: c["device_s"] for c in calls if c["method"] == "decode"}
    entered = sorted(sim["batches"], key=lambda b: sim["batches"][b][0])
    replay = model_run(STYLE, params, layout, decode_s=[decode_by_batch[b] for b in entered], **kw)
    drawn, other = model_run(STYLE, params, layout, seed=3, **kw), model_run(STYLE, params, layout, seed=4, **kw)
    assert replay["throughput_batches_per_s"] == pytest.approx(drawn["throughput_batches_per_s"], rel=1e-12)
    assert other["throughput_batches_per_s"] != pytest.approx(drawn["throughput_batches_per_s"], rel=1e-6)
    with pytest.raises(ValueError, match="decode_s has 39 times; expected one per batch"):
        simulate(STYLE, params, layout, decode_s=[0.1] * 39, **kw)


def test_shared_devices_serve_every_call_from_one_processor_pool():
    """Agents on one host's cores: with one core a full pipeline runs at the sum of its calls (no overlap); with
    as many cores as copies, as if each had its own device; with two cores, busy role time adds to 2 per unit."""
    params = _params(1, 2, 3)  # 10 + 20 + 60 ms per batch
    layout = [{"planner": 1, "critic": 1, "solver": 1}]
    one = model_run(STYLE, params, layout, num_batches=40, depth=3, shared_devices=1, **KW)
    assert one["throughput_batches_per_s"] == pytest.approx(1 / 0.090, rel=1e-6)
    own = model_run(STYLE, params, layout, num_batches=40, depth=3, **KW)
    wide = model_run(STYLE, params, layout, num_batches=40, depth=3, shared_devices=3, **KW)
    assert wide["throughput_batches_per_s"] == pytest.approx(own["throughput_batches_per_s"], rel=1e-6)
    two = model_run(STYLE, params, [{"planner": 1, "critic": 1, "solver": 2}], num_batches=60, depth=4,
                    shared_devices=2, **KW)
    assert 1 / 0.090 < two["throughput_batches_per_s"] <= 2 / 0.090 + 1e-6


def test_other_load_takes_its_fair_share_of_the_cores():
    """One core shared with one other runnable process: a lone call runs at half speed, so one batch at a time
    takes twice the sum of its calls."""
    params = _params(1, 2, 3)  # 90 ms per batch
    run = model_run(STYLE, params, [{"planner": 1, "critic": 1, "solver": 1}], num_batches=8, depth=1,
                    shared_devices=1, other_load=1, **KW)
    assert run["throughput_batches_per_s"] == pytest.approx(1 / 0.180, rel=1e-6)
