"""--protocol: the reference recipe is the release's table for every (style, benchmark) pair, flags and
--config files override it and both values are recorded, the headline metric is applied (pass@k),
and the sampler's top-k (-1: the model's generation config)."""

import dataclasses
import glob
import json

import pytest
import torch

from jobs import run as run_job
from recmas_ray.engine.agent import _pick
from recmas_ray.engine.decoding import HF_DEFAULT_TOP_K, model_top_k
from recmas_ray.eval.config import EvalConfig
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.eval import protocol as P
from recmas_ray.tasks.benchmarks import BENCHMARKS
from recmas_ray.styles import STYLES
from recmas_ray.system.config import SystemConfig

# The release's recommendations, written out independently of protocol.py (docs/reproducing.md#sources): the
# cells named there, and what every other pair falls back to.
EXPECTED = {
    ("sequential_light", "math500"): (32, 3), ("sequential_light", "medqa"): (32, 2),
    ("sequential_light", "gpqa_diamond"): (48, 3), ("sequential_light", "mbppplus"): (16, 3),
    ("sequential_light", "aime2025"): (32, 3), ("sequential_light", "aime2026"): (32, 2),
    ("sequential_scaled", "math500"): (64, 2), ("sequential_scaled", "medqa"): (48, 3),
    ("sequential_scaled", "gpqa_diamond"): (48, 3), ("sequential_scaled", "mbppplus"): (16, 3),
    ("sequential_scaled", "aime2026"): (64, 3), ("sequential_scaled", "livecodebench_v6"): (48, 2),
    ("distillation", "math500"): (64, 3), ("distillation", "medqa"): (64, 2),
    ("distillation", "gpqa_diamond"): (64, 3), ("distillation", "livecodebench_v6"): (64, 2),
    ("distillation", "aime2025"): (32, 3), ("distillation", "aime2026"): (32, 3),
    ("distillation", "mbppplus"): (16, 2), ("mixture", "livecodebench_v6"): (16, 3),
    ("deliberation", "hotpotqa"): (32, 2), ("deliberation", "bamboogle"): (16, 3),
}
TEMPERATURE = {("sequential_scaled", "livecodebench_v6"): 0.2, ("mixture", "livecodebench_v6"): 0.2}
STYLE_KEYS = {"sequential": "sequential_light"}
"""The tables name the light system sequential_light; this project also calls it sequential."""


def expected(style, bench):
    key = STYLE_KEYS.get(style, style)
    m, r = EXPECTED.get((key, bench), (16, 3) if key == "deliberation" else (32, 3))
    temp = TEMPERATURE.get((key, bench), 0.2 if bench == "mbppplus" else 0.6)
    tokens = (1000 if key == "sequential_light" else 2000) if bench == "math500" else 4000
    rollouts = 10 if bench.startswith("aime") else 3
    return m, r, temp, tokens, rollouts


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("bench", sorted(BENCHMARKS))
def test_reference_recipe_is_the_table(style, bench):
    cfg = P.reference(style, bench)
    res = P.resolution(cfg)
    m, r, temp, tokens, rollouts = expected(style, bench)
    d = cfg.recursion.decode
    assert (cfg.recursion.latent_steps, cfg.recursion.num_recursive_rounds) == (m, r)
    assert (d.do_sample, d.temperature, d.top_p, d.top_k, d.max_new_tokens) == (True, temp, 0.95, -1, tokens)
    assert (cfg.num_rollouts, cfg.grader, cfg.format_retry) == (rollouts, "reference", True)
    assert cfg.recursion.decode_every_round is (STYLE_KEYS.get(style, style) == "mixture")
    assert res.metric == BENCHMARKS[bench].metric
    assert all(s["source"] == "protocol" and s["cite"] for s in res.settings.values())


def test_flags_override_the_recipe_and_both_values_are_recorded(tmp_path):
    argv = ["--style", "sequential_light", "--dataset", "aime25", "--protocol", "reference",
            "--latent_length", "8", "--temperature", "0.3"]
    cfg = run_job.parse(argv)
    res = P.resolution(cfg)
    assert cfg.recursion.latent_steps == 8 and cfg.recursion.decode.temperature == 0.3
    assert cfg.recursion.num_recursive_rounds == 3 and cfg.num_rollouts == 10  # the table's, for aime2025
    lat = res.settings["recursion.latent_steps"]
    assert (lat["source"], lat["value"], lat["protocol_value"], lat["explicit_value"]) == ("explicit", 8, 32, 8)
    assert res.settings["recursion.num_recursive_rounds"]["source"] == "protocol"
    # A --config file overrides the recipe too; the run's config is the recipe plus the user's settings.
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"recursion": {"num_recursive_rounds": 1}, "batch_size": 3}))
    cfg = run_job.parse(["--style", "sequential_light", "--dataset", "math500", "--protocol", "reference",
                         "--config", str(conf)])
    assert (cfg.recursion.num_recursive_rounds, cfg.batch_size, cfg.recursion.latent_steps) == (1, 3, 32)
    recipe = P.reference("sequential_light", "math500")
    assert cfg == dataclasses.replace(recipe, batch_size=3, recursion=dataclasses.replace(
        recipe.recursion, num_recursive_rounds=1))
    assert P.resolution(cfg).settings["batch_size"]["source"] == "explicit"
    # greedy (the default) sets nothing.
    base = EvalConfig(system=SystemConfig(style="mixture"), dataset="math500")
    assert run_job.parse(["--style", "mixture", "--dataset", "math500"]) == base
    assert P.resolution(base).settings == {}


def test_results_record_the_protocol_and_apply_pass_at_k(tmp_path, tiny_cache, question_file, monkeypatch):
    monkeypatch.setattr(P, "headline_metric", lambda bench: "pass@2")  # a local file, scored like AIME
    out = tmp_path / "out"
    argv = ["--style", "sequential_light", "--preset", "tiny", "--dataset", str(question_file), "--backend", "local",
            "--protocol", "reference", "--num_recursive_rounds", "1", "--latent_steps", "2", "--max_new_tokens", "3",
            "--num_samples", "2", "--num_rollouts", "2", "--output_path", str(out), "--no_progress"]
    assert run_job.main(argv) == 0
    (path,) = glob.glob(f"{out}/results_*.json")
    data = json.loads(open(path).read())
    rec = data["protocol"]
    assert rec["protocol"] == "reference" and rec["metric"] == "pass@2"
    assert rec["settings"]["recursion.decode.temperature"]["source"] == "protocol"
    assert rec["settings"]["num_rollouts"] == {**rec["settings"]["num_rollouts"], "source": "explicit", "value": 2}
    assert data["config"]["recursion"]["decode"]["do_sample"] is True and data["config"]["grader"] == "reference"
    entry = data["results"][f"{question_file.stem}/recursive_mas"]
    assert all(not isinstance(v, str) for v in entry.values())  # strings live in the metadata section
    meta = data["metadata"][f"{question_file.stem}/recursive_mas"]
    assert meta["headline"] == "pass@2,reference" and entry["headline_value"] == entry["pass@2,reference"]
    assert meta["method"] == "recursive_mas" and meta["grader"] == "reference"
    assert len(entry["accuracy_runs,strict"]) == 2 and "accuracy_runs_std,reference" in entry
    assert data["prompt_set"]["sha256"] == data["config"]["system"]["prompt_set_hash"]


def test_top_k_sampling_and_the_models_generation_config():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0]])
    top1 = DecodeConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=1)
    gen = torch.Generator().manual_seed(0)
    assert all(int(_pick(logits, top1, gen)) == 1 for _ in range(20))
    top2 = DecodeConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=2)
    assert {int(_pick(logits, top2, gen)) for _ in range(200)} == {1, 2}

    class Model:
        class generation_config:
            top_k = 20

    assert model_top_k(Model) == 20 and model_top_k(object()) == HF_DEFAULT_TOP_K == 50


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
