"""jobs/bench/scale_fit.py: the cost-table fit recovers known coefficients from synthetic measurements, its
`sim:` table prices calls as those lines do, and it reads gpu_check.sh's JSON."""

import json
import random

import pytest

from jobs.bench.scale_fit import QUANTITIES, fit_line, fit_model, fitted_sim_name, load_fit
from recmas_ray.models.sim import call_device_ms, parse_sim_name

TRUE = {"prefill_ms": (12.0, 3.1), "latent_step_ms": (20.0, 1.5), "decoded_token_ms": (25.0, 0.8)}
"""ms = a + b x rows per quantity."""


def _measured(noise: float = 0.0, seed: int = 0) -> dict:
    rng = random.Random(seed)
    points = []
    for rows in (1, 2, 4, 8, 16):
        p = {"rows": rows, "prompt_tokens": 40}
        for q, (a, b) in TRUE.items():
            samples = [(a + b * rows) * (1 + noise * rng.uniform(-1, 1)) for _ in range(5)]
            p[q], p[f"{q}_samples"] = sorted(samples)[2], samples
        points.append(p)
    return {"model": "pkg:smollm2-135m-instruct", "points": points}


def test_a_line_through_exact_points_is_recovered():
    line = fit_line([1, 2, 4, 8], [3 + 2 * x for x in (1, 2, 4, 8)])
    assert line["a"] == pytest.approx(3) and line["b"] == pytest.approx(2) and line["r2"] == pytest.approx(1)
    with pytest.raises(ValueError, match="two distinct"):
        fit_line([4, 4], [1, 2])


@pytest.mark.parametrize("noise", [0.0, 0.02])
def test_fit_recovers_the_known_coefficients(noise):
    fit = fit_model(_measured(noise))
    for q, (a, b) in TRUE.items():
        assert fit["lines"][q]["a"] == pytest.approx(a, rel=0.05 if noise else 1e-9)
        assert fit["lines"][q]["b"] == pytest.approx(b, rel=0.1 if noise else 1e-9)
    p = fit["sim_params"]
    assert p["step_ms"] == pytest.approx(21.5, rel=0.05) and p["token_ms"] == pytest.approx(25.8, rel=0.05)
    assert p["prompt_tokens"] == 40


def test_the_fitted_table_prices_calls_as_the_measured_lines():
    params = parse_sim_name(fitted_sim_name(fit_model(_measured()), hidden=576, tokens=30))
    for rows in (1, 3, 16):
        pre = TRUE["prefill_ms"][0] + TRUE["prefill_ms"][1] * rows
        step = TRUE["latent_step_ms"][0] + TRUE["latent_step_ms"][1] * rows
        token = TRUE["decoded_token_ms"][0] + TRUE["decoded_token_ms"][1] * rows
        assert call_device_ms(params, "rollout", rows, 10) == pytest.approx(pre + 10 * step, rel=1e-4)
        assert call_device_ms(params, "decode", rows, 30) == pytest.approx(pre + 30 * token, rel=1e-4)


def test_a_negative_slope_is_noise_and_is_clamped():
    m = _measured()
    for p in m["points"]:
        p["latent_step_ms"] = 30.0 - 0.1 * p["rows"]
    params = fit_model(m)["sim_params"]
    assert params["row_share"] == 0 and params["step_ms"] == pytest.approx(30.0 - 0.1 * 31 / 5)  # the mean


def test_gpu_check_json_is_accepted(tmp_path):
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({"steps": {"costs": {"status": "ok", "result": {"measurements": [_measured()]}}}}))
    fit = load_fit(str(path))
    assert set(fit) == {"pkg:smollm2-135m-instruct"}
    assert set(fit["pkg:smollm2-135m-instruct"]["lines"]) == set(QUANTITIES)
    (tmp_path / "empty.json").write_text(json.dumps({"steps": {"costs": {"status": "timeout"}}}))
    with pytest.raises(ValueError, match="no measurements"):
        load_fit(str(tmp_path / "empty.json"))
