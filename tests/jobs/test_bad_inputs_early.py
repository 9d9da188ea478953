"""Bad inputs whose checks used to run late (after Ray started, a model loaded or a file was written) and messages
that named the wrong cause: each row now exits 2 with one line, before anything starts or is written.

Same mechanism as test_bad_inputs_every_job.py (its `world`, the shared `nothing_heavy` and folder snapshot).
"""

from __future__ import annotations

import importlib
import json
import os

import pytest

from tests.conftest import snapshot
from tests.jobs.test_bad_inputs_every_job import BASES, world  # noqa: F401 (a fixture)

ROWS = [
    # resume of a damaged samples file: refused when resuming starts, not after the agents loaded
    ("resume_damaged_samples", "run", ["--output_path", "{damaged_out}", "--resume"],
     "line 1 is not a sample record; the samples file is damaged"),
    ("resume_binary_samples", "run", ["--output_path", "{binary_out}", "--resume"], "is not UTF-8 text"),
    # GPU placement on a machine without CUDA: before Ray starts
    ("gpu_placement_cpu_host", "run", ["--backend", "ray", "--placement", "one_gpu_per_agent"],
     "--placement one_gpu_per_agent places agents on GPUs: torch sees no CUDA GPU"),
    ("serve_gpu_placement_cpu_host", "serve", ["--placement", "colocated"], "--placement colocated places agents"),
    # a batch larger than the data: before Ray starts (workers) or the config is saved (all roles)
    ("train_batch_larger_than_data", "train_inner", ["--batch_size", "64", "--num_workers", "2"],
     "rows cannot fill one step of 128 rows"),
    ("train_all_roles_batch_larger_than_data", "train_inner", ["--mas_role", "all", "--batch_size", "64"],
     "rows cannot fill one step of 64 rows"),
    ("train_outer_batch_larger_than_data", "train_outer", ["--batch_size", "64"], "rows cannot fill one step of 64"),
    # serve with missing links, and a file where a folder belongs
    ("serve_links_missing", "serve", ["--links", "{in_dir}/no_such_links"], "no_such_links: no such folder"),
    ("serve_ckpt_missing", "serve", ["--ckpt_override", "planner={in_dir}/nope"], "planner=", ),
    ("serve_links_is_file", "serve", ["--links", "{model_bin}"], "is a file; expected a folder of links"),
    ("run_ckpt_is_file", "run", ["--ckpt_override", "planner={model_bin}"], "is a file; expected a folder of links"),
    # a keys file with the wrong content is named for its content, whatever its mode
    ("keys_file_binary_open_mode", "run", ["--style", "deliberation", "--tavily_keys_file", "{keys_binary}"],
     "is not UTF-8 text"),
    ("keys_file_no_key_open_mode", "run", ["--style", "deliberation", "--tavily_keys_file", "{keys_comments}"],
     "holds no key"),
    ("keys_file_prose", "run", ["--style", "deliberation", "--tavily_keys_file", "{keys_prose}"],
     "key line 1 holds spaces"),
]
BASES = {**BASES, "serve": ["--style", "sequential_light", "--preset", "tiny"]}


@pytest.fixture
def more(world, tmp_path):
    d = tmp_path / "in"
    f = dict(world, in_dir=str(d))
    damaged = d / "damaged_out"
    damaged.mkdir()
    (damaged / "samples_questions_20260101-000000.jsonl").write_text(
        "this line is not JSON\n" + json.dumps({"doc_id": "1", "method": "recursive_mas", "rollout": 0}) + "\n")
    binary = d / "binary_out"
    binary.mkdir()
    (binary / "samples_questions_20260101-000000.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    f["damaged_out"], f["binary_out"] = str(damaged), str(binary)
    for name, content in (("keys_binary", b"\x89PNG\r\n\x1a\n\x00\x00"), ("keys_comments", b"# no keys here\n\n"),
                          ("keys_prose", b"my tavily key is tvly-123\n")):
        (d / name).write_bytes(content)
        os.chmod(d / name, 0o644)  # also readable by others: the content is still what gets named
        f[name] = str(d / name)
    return f


@pytest.mark.parametrize("name,job,argv,fragment", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_refused_before_anything_starts(name, job, argv, fragment, more, tmp_path, capsys,
                                                      nothing_heavy):
    import ray

    before, ray_before = snapshot(tmp_path), ray.is_initialized()
    main = importlib.import_module(f"jobs.{job}").main
    rc = main([a.format(**more) for a in BASES[job] + argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("WARNING")
             and "warning" not in line.split(":")[0].lower()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]
    assert snapshot(tmp_path) == before, "something was written"
    assert not os.path.exists(more["out"])
    assert ray.is_initialized() == ray_before
