"""The lm-eval backend: lm-eval's own CLI runs local tasks through a RecursiveMAS system and writes its files;
our results file renders in lm-eval's table; the LM's calls behave (stop strings, likelihoods, clear refusals)."""

import glob
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

ROOT = Path(__file__).resolve().parents[2]
MODEL_ARGS = ("style=sequential_light,role_models=planner:tiny:qwen3|critic:tiny:llama|solver:tiny:qwen3,"
              "num_recursive_rounds=1,latent_steps=2,max_new_tokens=4")  # the default backend: Ray actors


def _tasks(tmp_path):
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b), "choices": [str(a + b + 1), str(a + b)],
             "label": 1} for a, b in [(2, 3), (1, 1), (4, 2)]]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              "doc_to_text: \"Question: {{question}}\\nAnswer:\"\n")
    (tasks / "gen.yaml").write_text(
        "task: recmas_toy_gen\n" + common + "output_type: generate_until\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\\n\"]\n  max_gen_toks: 4\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
    (tasks / "mc.yaml").write_text(
        "task: recmas_toy_mc\n" + common + "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{label}}\"\nmetric_list:\n  - metric: acc\n")
    return tasks


def _lm_eval_command() -> str:
    """lm-eval's own console script, installed next to this interpreter (not our wrapper module)."""
    path = Path(sys.executable).parent / "lm_eval"
    assert path.exists(), f"no lm_eval script next to {sys.executable}: pip install -e '.[test]'"
    return str(path)


def _startup_probe(code: str, **env) -> str:
    """Run `code` in a fresh interpreter (so the installed .pth hook runs) and return its stdout."""
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_startup_hook_registers_the_model_lazily_and_leaves_other_programs_alone():
    # Python starting: neither lm-eval nor torch nor recmas_ray itself gets imported by the hook (so a
    # checkout put on sys.path after startup, e.g. the tests' own, is the recmas_ray that imports later).
    loaded = _startup_probe("import sys; print(sorted(m for m in ('lm_eval', 'torch', 'recmas_ray', "
                            "'recmas_ray.lmeval') if m in sys.modules))")
    assert loaded == "[]", f"the .pth hook imported {loaded} at startup (or is not installed: pip install -e .)"
    # lm-eval's registry: our model is a lazy placeholder beside lm-eval's own, loaded only when asked for.
    probe = ("import sys; import lm_eval.models; from lm_eval.api.registry import get_model, model_registry; "
             "names = set(model_registry.keys()); lazy = 'recmas_ray.lmeval' not in sys.modules; "
             "cls = get_model('recmas_ray'); print('recmas_ray' in names, 'hf' in names, lazy, cls.__name__)")
    assert _startup_probe(probe) == "True True True RecMASLM"
    off = _startup_probe("from lm_eval.api.registry import model_registry; import lm_eval.models; "
                         "print('recmas_ray' in model_registry.keys())", RECMAS_RAY_LMEVAL_HOOK="0")
    assert off == "False"


def test_pth_line_is_silent_where_recmas_ray_cannot_be_imported(tmp_path):
    # the code sandbox runs the same interpreter over the same site-packages without the project's
    # files: the hook line must neither fail nor print there (the sandbox tests compare exact output)
    line = (ROOT / "recmas_ray_lmeval.pth").read_text().strip()
    assert line.startswith("import ") and "\n" not in line  # site.py runs a .pth line only in this form
    proc = subprocess.run([sys.executable, "-S", "-c", line + "\nprint('alive')"], cwd=tmp_path,
                          env={"PATH": os.environ.get("PATH", "")}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "alive\n" and proc.stderr == "", proc.stderr


@pytest.mark.integration  # a fresh interpreter importing lm-eval, torch and three models: ~30-80 s here
def test_lm_eval_cli_runs_local_tasks_and_writes_its_files(tmp_path, tiny_cache):
    tasks, out = _tasks(tmp_path), tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_DATASETS_CACHE": str(tmp_path / "ds_cache"), "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [_lm_eval_command(), "--model", "recmas_ray", "--model_args", MODEL_ARGS,
           "--tasks", "recmas_toy_gen", "recmas_toy_mc", "--include_path", str(tasks), "--output_path", str(out),
           "--log_samples", "--batch_size", "4"]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = glob.glob(f"{out}/**/results_*.json", recursive=True)
    assert len(results) == 1, proc.stderr[-2000:]
    data = json.load(open(results[0]))
    assert set(data["results"]) == {"recmas_toy_gen", "recmas_toy_mc"}
    assert "exact_match,none" in data["results"]["recmas_toy_gen"] and "acc,none" in data["results"]["recmas_toy_mc"]
    assert data["config"]["model"] == "recmas_ray"
    assert data["config"]["recmas_ray_system"]["roles"]["critic"]["base_model"] == "tiny:llama"
    for task in ("recmas_toy_gen", "recmas_toy_mc"):
        (samples,) = glob.glob(f"{out}/**/samples_{task}_*.jsonl", recursive=True)
        lines = [json.loads(line) for line in open(samples)]
        assert len(lines) == 3 and {"doc_id", "resps", "filtered_resps", "doc_hash"} <= set(lines[0])
    mc = [json.loads(line) for line in open(glob.glob(f"{out}/**/samples_recmas_toy_mc_*.jsonl", recursive=True)[0])]
    # lm-eval logs (logprob, is_greedy) pairs as strings
    assert all(math.isfinite(float(r[0][0])) and float(r[0][0]) < 0 for line in mc for r in line["resps"])
    assert "recmas_toy_gen" in proc.stdout  # lm-eval's own table


BAD_MODEL_ARGS = [  # (model_args as lm-eval parses them, fragment of the one-line error)
    ({"style": "sequential_light", "bogus": 1}, "unknown ['bogus']"),
    ({}, "style is required"),
    ({"style": "pipeline"}, "model_args style 'pipeline': expected one of"),
    ({"style": "sequential_light", "latent_steps": -3.0}, "model_args latent_steps -3: expected an integer in [0, 4096]"),
    ({"style": "sequential_light", "latent_steps": "many"}, "latent_steps='many': expected an integer"),
    ({"style": "sequential_light", "num_recursive_rounds": 0}, "num_recursive_rounds 0"),
    ({"style": "sequential_light", "backend": "cloud"}, "model_args backend 'cloud': expected one of ray, local"),
    ({"style": "sequential_light", "role_models": "writer:tiny:qwen3"}, "role_models names ['writer']"),
    ({"style": "sequential_light", "role_models": "planner=tiny:qwen3"}, "is not ROLE:VALUE"),
    ({"style": "sequential_light", "ckpt_override": "critic:"}, "is not ROLE:VALUE"),
    ({"style": "sequential_light", "pretrained": "a", "links": "b"}, "pretrained and links are the same setting"),
    ({"style": "sequential_light", "seed": True}, "model_args seed True"),
]


@pytest.mark.parametrize("values,fragment", BAD_MODEL_ARGS)
def test_model_args_are_checked_with_one_line_naming_the_argument(values, fragment):
    from recmas_ray.lmeval import check_model_args

    with pytest.raises(ValueError) as e:
        check_model_args(values)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_model_args_take_lm_eval_typed_values_and_list_in_help():
    from recmas_ray.lmeval import check_model_args, model_args_help

    args = check_model_args({"style": "hie", "pretrained": 123, "latent_steps": 4.0, "batch_size": 8,
                             "device": "cpu"})
    assert (args.pretrained, args.latent_steps, args.links_source()) == ("123", 4, "123")
    assert check_model_args({"style": "sequential_light", "pretrained": "fresh"}).links_source() is None
    help_text = model_args_help()
    for name in ("style", "pretrained", "role_models", "ckpt_override", "backend", "latent_steps", "max_new_tokens"):
        assert f"  {name} " in help_text, name


def test_lm_eval_cli_refuses_bad_model_args_before_loading_tasks(tmp_path):
    # lm-eval's own script: the startup hook checks model_args as soon as lm-eval's CLI module loads, so no
    # task is indexed and no model built; one line and exit status 2 (no traceback)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_DATASETS_OFFLINE": "1"}
    for extra, fragment in ((["--model_args", "style=sequential_light,bogus=1"], "unknown ['bogus']"),
                            (["--model_args", "style=sequential_light", "latent_steps=-3"], "latent_steps -3")):
        proc = subprocess.run([_lm_eval_command(), "--model", "recmas_ray", *extra, "--tasks", "no_such_task"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], proc.stderr[-2000:]
    help_out = subprocess.run([sys.executable, "-m", "recmas_ray.lmeval", "--help"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    assert help_out.returncode == 0 and "  pretrained " in help_out.stdout and "--model_args" in help_out.stdout


@pytest.fixture(scope="module")
def lm(tiny_cache):
    from recmas_ray.lmeval import RecMASLM

    model = RecMASLM(style="sequential_light", role_models="solver:tiny:qwen3", backend="local",
                     num_recursive_rounds=2, latent_steps=2, max_new_tokens=6)
    yield model
    model.system.close()


def _req(*args):
    from lm_eval.api.instance import Instance

    return Instance(request_type="x", doc={}, arguments=args, idx=0)


def test_generate_until_cuts_at_stop_strings(lm):
    full = lm.generate_until([_req("What is 2 + 2?", {"max_gen_toks": 6})])[0]
    assert full == lm.system.generate(["What is 2 + 2?"], num_recursive_rounds=2, latent_steps=2,
                                      max_new_tokens=6)[0][0].prediction
    if len(full) > 1:
        cut = lm.generate_until([_req("What is 2 + 2?", {"max_gen_toks": 6, "until": [full[1:]]})])[0]
        assert cut == full[:1]


def test_loglikelihood_scores_in_the_final_agent(lm):
    (short, g1), (long, _), (other, _) = lm.loglikelihood(
        [_req("What is 2 + 2?", " 4"), _req("What is 2 + 2?", " 4 4 4"), _req("What is 9 + 9?", " 4")])
    assert math.isfinite(short) and long < short < 0 and isinstance(g1, bool)
    assert other != short  # the context reaches the final agent


@pytest.mark.integration  # three agent actors on the session's Ray cluster (~1 min here)
def test_loglikelihood_on_the_ray_backend_equals_the_local_one(lm, ray_cluster):
    from recmas_ray.lmeval import RecMASLM

    reqs = [_req("What is 2 + 2?", " 4"), _req("What is 9 + 9?", " 18"), _req("What is 9 + 9?", " 4 4")]
    ray_lm = RecMASLM(style="sequential_light", role_models="solver:tiny:qwen3", num_recursive_rounds=2,
                      latent_steps=2, max_new_tokens=6)  # backend: the default, ray
    try:
        assert ray_lm.args.backend == "ray"
        for (lp_ray, g_ray), (lp_local, g_local) in zip(ray_lm.loglikelihood(reqs), lm.loglikelihood(reqs)):
            assert abs(lp_ray - lp_local) < 1e-4 and g_ray == g_local
    finally:
        ray_lm.system.close()


def test_unsupported_requests_are_refused_clearly(lm):
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([_req("text")])
    from recmas_ray.lmeval import parse_pairs

    assert parse_pairs("planner:tiny:qwen3|outer:org/links:outer", what="x") == {"planner": "tiny:qwen3",
                                                                               "outer": "org/links:outer"}
    with pytest.raises(ValueError, match="ROLE:VALUE"):
        parse_pairs("planner=tiny:qwen3", what="role_models")


def test_our_results_file_renders_in_lm_eval_table(tmp_path, tiny_cache, question_file):
    from lm_eval.utils import make_table

    from jobs import run as run_job

    out = tmp_path / "out"
    assert run_job.main(["--style", "sequential_light", "--dataset", str(question_file), "--backend", "local",
                         "--num_recursive_rounds", "1", "--latent_steps", "2", "--max_new_tokens", "4",
                         "--num_samples", "2", "--output_path", str(out), "--no_progress",
                         "--method", "recursive_mas,recursive_textmas"]) == 0
    data = json.load(open(glob.glob(f"{out}/results_*.json")[0]))
    assert {"n-shot", "configs", "versions", "higher_is_better", "n-samples"} <= set(data)
    table = make_table(data)
    assert "questions/recursive_mas" in table and "accuracy" in table and "↑" in table
    (samples,) = glob.glob(f"{out}/samples_*.jsonl")
    line = json.loads(open(samples).readline())
    assert {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics", "doc_hash",
            "prompt_hash", "target_hash", "prediction", "trace"} <= set(line)
    assert line["filtered_resps"] == [line["prediction"]] and line["metrics"] == ["accuracy"]


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
