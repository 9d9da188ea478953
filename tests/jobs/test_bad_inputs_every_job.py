"""Bad inputs to every job, as data: every row exits 2 with one line naming the setting, no traceback,
nothing written anywhere under the test's folder, no model loaded, no Ray started.

Rows are (id, job, argv, fragment of the error line); `{name}` in argv is a file the `world` fixture built.
The jobs run in-process with model loading, agent start-up, Ray and Ray Train replaced by failures, and the
whole tmp folder is snapshotted around each row (names, sizes, mtimes), so a row that writes a config.json,
a fingerprint, a lock file or a folder fails as surely as one that loads a model.
"""

from __future__ import annotations

import importlib
import json
import os

import pytest
import torch

from tests.conftest import snapshot, write_jsonl

RUN = ["--style", "sequential_light", "--preset", "tiny", "--backend", "local", "--dataset", "{questions}",
       "--output_path", "{out}"]
TRAIN = ["--dataset_name", "{train}", "--save_dir", "{out}", "--max_steps", "2"]
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


def _ckpt(folder, *, inner=None, outer=None, manifest=None):
    from recmas_ray.system.checkpoints import LinkSet, save_links

    save_links(folder, LinkSet(inner=inner or {}, outer=outer or {}),
               manifest if manifest is not None else {"kind": "inner", "roles": {"planner": {
                   "base_model": "tiny:qwen3", "hidden_size": 64}}})
    return folder


@pytest.fixture
def world(tmp_path, tiny_cache):
    """Every file the rows name (inside tmp_path/in; outputs go to tmp_path/out, which must never appear)."""
    from recmas_ray.config.cli import parse_config
    from recmas_ray.config.tree import save_config
    from recmas_ray.train.config import InnerTrainConfig
    from recmas_ray.system.checkpoints import MANIFEST, WEIGHTS
    from recmas_ray.system.link_init import seeded_inner_link, seeded_outer_link
    from recmas_ray.train.synthetic import make_arithmetic_dataset
    from recmas_ray.train.synthetic import write_jsonl as write_rows

    d = tmp_path / "in"
    d.mkdir()
    f = {"out": str(tmp_path / "out"), "questions": str(write_jsonl(d / "questions.jsonl", [
        {"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 4 + 4?", "answer": "8"}]))}
    f["train"] = str(write_rows(make_arithmetic_dataset(4, seed=0), d / "train.jsonl"))

    def text(name, content, mode=None):
        p = d / name
        p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
        if mode is not None:
            os.chmod(p, mode)
        f[name.replace(".", "_")] = str(p)

    text("cfg_list.json", json.dumps([1, 2]))
    text("cfg_scalar.json", json.dumps({"recursion": 3}))
    text("cfg_items.json", json.dumps({"methods": [1]}))
    text("cfg_sweep.json", json.dumps({"sweep_rounds": ["a"]}))
    text("cfg_null.json", json.dumps({"system": {"role_models": None}}))
    text("cfg_ckpt_num.json", json.dumps({"system": {"ckpt_override": {"planner": 5}}}))
    text("cfg_flat.json", json.dumps({"models": "all=tiny:llama"}))  # a nested field given flat
    text("cfg_utf8.json", b'{"seed": "\xff\xfe"}')
    text("bomb.yaml", BOMB)
    text("model.bin", "not a model")
    text("bad_utf8.jsonl", b'{"question": "caf\xe9", "answer": "1"}\n')
    text("list_q.jsonl", json.dumps({"question": ["a", "b"], "answer": "1"}) + "\n")
    text("long_q.jsonl", json.dumps({"question": "x" * 200_000, "answer": "1"}) + "\n")
    text("dup_ids.jsonl", json.dumps({"id": "1", "question": "a", "answer": "1"}) + "\n"
         + json.dumps({"question": "b", "answer": "2"}) + "\n")
    text("keys_open.txt", "tvly-secret\n", mode=0o644)
    text("keys_ok.txt", "tvly-secret\n", mode=0o600)
    os.mkfifo(d / "fifo.jsonl")
    f["fifo"] = str(d / "fifo.jsonl")
    (d / "dir.jsonl").mkdir()
    f["dir_jsonl"] = str(d / "dir.jsonl")
    # checkpoints
    f["outer_other"] = str(_ckpt(d / "outer_other", outer={"math->summarizer": seeded_outer_link(64, 64, seed=0,
                                                                                               edge="math->summarizer")},
                                 manifest={"kind": "outer"}))
    nan = seeded_inner_link(64, seed=0, role="planner")
    with torch.no_grad():
        nan.proj1.weight[0, 0] = float("nan")
    f["ckpt_nan"] = str(_ckpt(d / "ckpt_nan", inner={"planner": nan}))
    inf = seeded_inner_link(64, seed=0, role="planner")
    with torch.no_grad():
        inf.proj1.weight[0, 0] = float("inf")
    f["ckpt_inf"] = str(_ckpt(d / "ckpt_inf", inner={"planner": inf}))
    fifo_ckpt = d / "ckpt_fifo"
    fifo_ckpt.mkdir()
    os.mkfifo(fifo_ckpt / WEIGHTS)
    (fifo_ckpt / MANIFEST).write_text(json.dumps({"kind": "inner"}))
    f["ckpt_fifo"] = str(fifo_ckpt)
    for name, manifest in (("ckpt_roles_list", {"kind": "inner", "roles": [1, 2]}),
                           ("ckpt_base_num", {"kind": "inner", "roles": {"planner": {"base_model": 7}}})):
        folder = _ckpt(d / name, inner={"planner": seeded_inner_link(64, seed=0, role="planner")})
        (folder / MANIFEST).write_text(json.dumps(manifest))
        f[name] = str(folder)
    rel = d / "ckpt_release_bad"
    rel.mkdir()
    torch.save(seeded_inner_link(64, seed=0, role="planner").state_dict(), rel / "adapter.pt")
    (rel / "innerlink_config.json").write_text(json.dumps({"tasks": {"math": 5}}))
    f["ckpt_release_bad"] = str(rel)
    outer_bad = d / "outer_bad"
    outer_bad.mkdir()
    (outer_bad / "outerlink_config.json").write_text(json.dumps({"adapters": [{"filename": 3}]}))
    f["outer_bad"] = str(outer_bad)
    # an evaluation folder whose fingerprint is corrupt, and a training folder of another seed
    fp_out = d / "fp_out"
    fp_out.mkdir()
    (fp_out / "samples_questions_20260101-000000.jsonl").write_text(json.dumps({"doc_id": "0"}) + "\n")
    (fp_out / "samples_questions_20260101-000000.fingerprint.json").write_text("{broken")
    f["fp_out"] = str(fp_out)
    resumed = d / "train_seed1"
    old = parse_config(InnerTrainConfig, ["--dataset_name", f["train"], "--save_dir", str(resumed), "--max_steps",
                                          "2", "--num_workers", "0", "--seed", "1"])[0]
    save_config(old, resumed)
    f["train_seed1"] = str(resumed)
    return f


ROWS = [
    # config files: a list, a scalar section, items of the wrong type, nulls, numbers for paths, bombs, codecs
    ("config_list", "run", ["--config", "{cfg_list_json}"], "holds a list; expected a mapping"),
    ("config_scalar_section", "run", ["--config", "{cfg_scalar_json}", "--latent_steps", "4"],
     "section 'recursion' is a int"),
    ("config_scalar_section_alone", "run", ["--config", "{cfg_scalar_json}"], "expected a mapping of settings"),
    ("config_list_item_type", "run", ["--config", "{cfg_items_json}"], "--methods item 0 1: expected a string"),
    ("config_range_item_type", "run", ["--config", "{cfg_sweep_json}"], "--sweep_rounds item 0 'a'"),
    ("config_models_null", "run", ["--config", "{cfg_null_json}"], "--models is required (got null)"),
    ("config_ckpt_number", "run", ["--config", "{cfg_ckpt_num_json}"], "--ckpt_override planner=5"),
    ("config_flat_key", "run", ["--config", "{cfg_flat_json}"], "unknown setting(s) ['models']"),
    ("config_not_utf8", "run", ["--config", "{cfg_utf8_json}"], "cfg_utf8.json' is not UTF-8"),
    ("config_yaml_bomb", "run", ["--config", "{bomb_yaml}"], "anchors and aliases"),
    ("config_is_fifo", "run", ["--config", "{fifo}"], "is a FIFO"),
    ("config_is_dir", "run", ["--config", "{dir_jsonl}"], "is a directory"),
    ("prompt_set_yaml_bomb", "run", ["--prompt_set", "{bomb_yaml}"], "--prompt_set"),
    # models and checkpoints
    ("role_model_missing_offline", "run", ["--role_model", "planner=./no/such/model"], "--models planner="),
    ("role_model_is_file", "run", ["--role_model", "planner={model_bin}"], "is a file"),
    ("outer_other_style", "run", ["--ckpt_override", "outer={outer_other}"], "of another style"),
    ("ckpt_nan", "run", ["--ckpt_override", "planner={ckpt_nan}"], "NaN/Inf"),
    ("ckpt_inf", "run", ["--ckpt_override", "planner={ckpt_inf}"], "NaN/Inf"),
    ("ckpt_fifo", "run", ["--ckpt_override", "planner={ckpt_fifo}"], "is a FIFO"),
    ("ckpt_roles_list", "run", ["--ckpt_override", "planner={ckpt_roles_list}"], "malformed configuration JSON"),
    ("ckpt_base_model_number", "run", ["--ckpt_override", "planner={ckpt_base_num}"], "malformed configuration"),
    ("ckpt_release_entry_number", "run", ["--ckpt_override", "planner={ckpt_release_bad}"], "malformed"),
    ("outer_config_types", "run", ["--ckpt_override", "outer={outer_bad}"], "malformed configuration"),
    # datasets
    ("dataset_not_utf8", "run", ["--dataset", "{bad_utf8_jsonl}"], "bad_utf8.jsonl: not UTF-8"),
    ("dataset_fifo", "run", ["--dataset", "{fifo}"], "is a FIFO"),
    ("dataset_dir", "run", ["--dataset", "{dir_jsonl}"], "is a directory"),
    ("dataset_list_question", "run", ["--dataset", "{list_q_jsonl}"], "field 'question' holds a list"),
    ("dataset_long_question", "run", ["--dataset", "{long_q_jsonl}"], "characters; expected at most"),
    ("dataset_duplicate_missing_id", "run", ["--dataset", "{dup_ids_jsonl}"], "duplicate doc_id '1' in rows 0 and 1"),
    ("dataset_path_with_file", "run", ["--dataset_path", "{questions}"], "drop --dataset_path"),
    ("dataset_path_unknown_bench", "run", ["--dataset", "nobench", "--dataset_path", "{questions}"],
     "no known benchmark"),
    ("dataset_path_fifo", "run", ["--dataset", "gsm8k", "--dataset_path", "{fifo}"], "--dataset_path"),
    # combinations, outputs, keys, devices
    ("local_with_replicas", "run", ["--num_replicas", "4"], "--num_replicas 4 needs --backend ray"),
    ("keys_file_no_tools", "run", ["--tavily_keys_file", "{keys_ok_txt}"], "apply to a style with tools (deliberation) only"),
    ("tool_rounds_no_tools", "run", ["--max_tool_rounds", "3"], "--max_tool_rounds"),
    ("output_empty", "run", ["--output_path", ""], "--output_path is empty"),
    ("keys_file_mode", "run", ["--style", "deliberation", "--tavily_keys_file", "{keys_open_txt}"], "chmod 600"),
    ("keys_file_fifo", "run", ["--style", "deliberation", "--tavily_keys_file", "{fifo}"], "is a FIFO"),
    ("device_cuda_no_gpu", "run", ["--device", "cuda"], "--device cuda: torch sees no CUDA GPU"),
    ("nccl_cpu_placement", "run", ["--backend", "ray", "--transport", "rdt:nccl"], "--placement cpu"),
    ("resume_corrupt_fingerprint", "run", ["--output_path", "{fp_out}", "--resume"], "fingerprint"),
    # training
    ("train_resume_other_seed", "train_inner", ["--save_dir", "{train_seed1}", "--seed", "2", "--resume"],
     "differing fields: seed: 1 -> 2"),
    ("train_resume_other_lr", "train_inner", ["--save_dir", "{train_seed1}", "--seed", "1", "--lr", "0.01",
                                              "--resume"], "lr: 0.0005 -> 0.01"),
    ("train_save_dir_empty", "train_inner", ["--save_dir", ""], "--save_dir is empty"),
    ("train_use_gpu", "train_inner", ["--use_gpu"], "--use_gpu: torch sees no CUDA GPU"),
    ("train_role_model_missing", "train_inner", ["--role_model", "planner=./no/such/model"], "--role_model planner="),
    ("train_model_name_file", "train_inner", ["--model_name_or_path", "{model_bin}"], "is a file"),
    ("train_dataset_fifo", "train_inner", ["--dataset_name", "{fifo}"], "is a FIFO"),
    ("train_dataset_dir", "train_inner", ["--dataset_name", "{dir_jsonl}"], "is a directory"),
    ("train_config_bomb", "train_inner", ["--config", "{bomb_yaml}"], "anchors and aliases"),
    ("train_ckpt_nan", "train_inner", ["--ckpt_override", "critic={ckpt_nan}"], "NaN/Inf"),
    ("outer_ckpt_fifo", "train_outer", ["--ckpt_override", "planner={ckpt_fifo}"], "is a FIFO"),
    ("outer_use_gpu", "train_outer", ["--use_gpu"], "--use_gpu"),
    ("outer_save_dir_empty", "train_outer", ["--save_dir", ""], "--save_dir is empty"),
    ("outer_other_style_train", "train_outer", ["--ckpt_override", "outer={outer_other}"], "of another style"),
    # other jobs
    ("bench_outer_dataset_first", "bench.outer", ["--dataset_name", "{fifo}"], "is a FIFO"),
    ("bench_outer_use_gpu", "bench.outer", ["--use_gpu"], "--use_gpu"),
    ("bench_backend_dead_address", "bench.backend", ["--address", "127.0.0.1:1"], "no Ray cluster answers"),
    ("bench_backend_device", "bench.backend", ["--device", "cuda"], "--device cuda"),
    ("bench_backend_role_model", "bench.backend", ["--role_model", "all=./no/such/model"], "--role_model all="),
    ("demo_empty_rounds", "demo", ["--rounds", ""], "--rounds is empty"),
    ("outer_keep_best_alone", "train_outer", ["--keep_best"], "--keep_best needs --eval_every"),
    ("calibrate_task", "experiments.calibrate_collaboration", ["--tasks", "recall"], "--tasks 'recall'"),
    ("calibrate_decoder", "experiments.calibrate_collaboration", ["--decoders", "qwen"], "--decoders 'qwen'"),
    ("calibrate_questions", "experiments.calibrate_collaboration", ["--num_questions", "4"], "--num_questions"),
]
if os.geteuid() != 0:  # root reads any file: the permission row needs a normal user
    ROWS.append(("dataset_unreadable", "run", ["--dataset", "{unreadable}"], "not readable"))
BASES = {"run": RUN, "train_inner": TRAIN + ["--num_workers", "0"], "train_outer": TRAIN,
         "bench.outer": ["--output_path", "{out}"], "bench.backend": ["--output_path", "{out}"],
         "demo": ["--output_path", "{out}"], "experiments.calibrate_collaboration": ["--output_path", "{out}"]}


@pytest.mark.parametrize("name,job,argv,fragment", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_exits_2_with_one_line_and_touches_nothing(name, job, argv, fragment, world, tmp_path, capsys, nothing_heavy):
    import ray

    if name == "dataset_unreadable":
        p = tmp_path / "in" / "secret.jsonl"
        p.write_text('{"question": "q", "answer": "1"}\n')
        p.chmod(0)
        world["unreadable"] = str(p)
    before, ray_before = snapshot(tmp_path), ray.is_initialized()
    main = importlib.import_module(f"jobs.{job}").main
    rc = main([a.format(**world) for a in BASES[job] + argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("WARNING")
             and "warning" not in line.split(":")[0].lower()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]
    assert snapshot(tmp_path) == before, "something was written"
    assert not os.path.exists(world["out"])
    assert ray.is_initialized() == ray_before


def test_a_second_run_into_a_locked_folder_is_refused(world, tmp_path, capsys, nothing_heavy):
    """Two runs into one output folder: the second stops at once, naming the first one's PID."""
    from jobs import run
    from recmas_ray.config.inputs import OutputLock

    with OutputLock(world["out"]):
        before = snapshot(tmp_path)
        rc = run.main([a.format(**world) for a in RUN])
        err = capsys.readouterr().err
        assert snapshot(tmp_path) == before
    assert rc == 2 and f"in use by another run (PID {os.getpid()})" in err, err
    assert len(err.strip().splitlines()) == 1


def test_table_holds_every_kind_of_bad_input():
    assert len(ROWS) >= 60
