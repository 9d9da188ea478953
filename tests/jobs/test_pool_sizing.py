"""jobs/bench/pool_sizing.py: pools sized in proportion to measured costs; the online rule moves copies from
the idlest role to the busiest only outside its band, keeps the total and one copy per role, and, repeated on
the model's busy figures, converges on the split the costs give and raises throughput."""

import pytest

from jobs.bench.pool_sizing import resize_pools, size_pools
from jobs.bench.scale_model import expected_role_ms, model_run
from recmas_ray.models.sim import parse_sim_name
from recmas_ray.styles import get_style

STYLE = get_style("sequential_light")
KW = dict(rounds=1, latent_steps=10, max_new_tokens=20, batch_size=1)
PARAMS = {"planner": parse_sim_name("sim:step_ms=1"), "critic": parse_sim_name("sim:step_ms=2"),
          "solver": parse_sim_name("sim:step_ms=1,token_ms=1.5,tokens=20")}  # 10 / 20 / 30 ms per batch


def test_pools_are_sized_in_proportion_to_measured_costs():
    assert size_pools({"planner": 10, "critic": 20, "solver": 30}, 6) == {"planner": 1, "critic": 2, "solver": 3}
    assert size_pools(expected_role_ms(STYLE, PARAMS, 1, 10, 20, 1), 6) == \
        {"planner": 1, "critic": 2, "solver": 3}


def test_the_rule_moves_a_copy_from_idle_to_busy_only_outside_its_band():
    copies = {"planner": 2, "critic": 2, "solver": 2}
    moved = resize_pools(copies, {"planner": 0.3, "critic": 0.6, "solver": 0.95})
    assert moved == {"planner": 1, "critic": 2, "solver": 3}
    assert resize_pools(copies, {"planner": 0.7, "critic": 0.8, "solver": 0.85}) == copies  # inside the band
    assert resize_pools({"planner": 1, "critic": 1, "solver": 4}, {"planner": 0.95, "critic": 1.0, "solver": 0.1}) \
        == {"planner": 1, "critic": 2, "solver": 3}
    assert resize_pools({"planner": 1, "critic": 1, "solver": 1}, {"planner": 0.1, "critic": 0.2, "solver": 1.0}) \
        == {"planner": 1, "critic": 1, "solver": 1}  # one copy each at least
    with pytest.raises(ValueError, match="busy names roles"):
        resize_pools(copies, {"planner": 0.5})


def test_a_move_that_would_overshoot_is_not_made():
    # the solver at 0.95 with 1 copy, the planner at 0.55 with 2: moving makes the planner 1.1 busy, the solver
    # 0.475: worse than before
    assert resize_pools({"planner": 2, "solver": 1}, {"planner": 0.55, "solver": 0.95}) == {"planner": 2, "solver": 1}


def test_repeated_on_measured_busy_the_rule_converges_on_the_cost_split():
    copies = {"planner": 2, "critic": 2, "solver": 2}
    first = model_run(STYLE, PARAMS, [copies], num_batches=240, depth=12, **KW)["throughput_batches_per_s"]
    for _ in range(6):
        busy = model_run(STYLE, PARAMS, [copies], num_batches=240, depth=12, **KW)["busy_by_role"]
        copies = resize_pools(copies, busy)
    assert copies == size_pools({"planner": 10, "critic": 20, "solver": 30}, 6)
    last = model_run(STYLE, PARAMS, [copies], num_batches=240, depth=12, **KW)["throughput_batches_per_s"]
    assert last > 1.3 * first
