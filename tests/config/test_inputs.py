"""The shared validation layer: path kinds, alias-free YAML, one-line errors of any exception, the output lock,
training --resume by field, and a full disk that leaves the samples file valid."""

from __future__ import annotations

import errno
import json
import os

import pytest

from recmas_ray.config import inputs
from recmas_ray.config.checks import ConfigError
from recmas_ray.config.cli import describe_error, run_job


def test_path_kinds_are_named(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "empty.txt").write_text("")
    os.mkfifo(tmp_path / "pipe")
    assert inputs.path_problem(tmp_path / "f.txt") is None
    assert inputs.path_problem(tmp_path / "nope") == "does not exist"
    assert "FIFO" in inputs.path_problem(tmp_path / "pipe")
    assert "directory" in inputs.path_problem(tmp_path)
    assert inputs.path_problem(tmp_path / "empty.txt", non_empty=True) == "is empty"
    assert "bytes" in inputs.path_problem(tmp_path / "f.txt", max_bytes=0)
    assert inputs.path_problem(tmp_path, kind="dir") is None
    with pytest.raises(ConfigError, match="--x .*pipe' is a FIFO"):
        inputs.read_text_file("--x", tmp_path / "pipe")  # and never blocks


def test_yaml_refuses_anchors_and_aliases_but_reads_plain_yaml():
    assert inputs.load_yaml("a: [1, 2]\nb: {c: x}\n", "f") == {"a": [1, 2], "b": {"c": "x"}}
    for text in ("a: &x 1\nb: *x\n", "base: &b {k: 1}\nother:\n  <<: *b\n"):
        with pytest.raises(ConfigError, match="anchors and aliases"):
            inputs.load_yaml(text, "f")


def test_question_checks():
    assert inputs.check_question("question", "2 + 2?") == "2 + 2?"
    with pytest.raises(TypeError, match="question: expected a string, got list"):
        inputs.check_question("question", ["a"])
    with pytest.raises(ValueError, match="characters; expected at most"):
        inputs.check_question("question", "x" * (inputs.MAX_QUESTION_CHARS + 1))


def test_dead_ray_address_is_one_line_quickly():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(ConfigError, match="no Ray cluster answers"):
        inputs.check_ray_address("--address", f"127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        inputs.check_ray_address("--address", "nowhere")


def test_output_lock_is_exclusive_and_released(tmp_path):
    with inputs.OutputLock(tmp_path / "o"):
        with pytest.raises(ConfigError, match=f"PID {os.getpid()}"):
            inputs.OutputLock(tmp_path / "o").__enter__()
    with inputs.OutputLock(tmp_path / "o"):  # released on exit
        pass


@pytest.mark.parametrize("exc,fragment,rc", [
    (OSError(errno.ENOSPC, "No space left on device", "/x/samples.jsonl"), "no space left on the device "
     "(/x/samples.jsonl); what finished is on disk", 1),
    (MemoryError(), "out of memory", 1),
    (KeyError("code"), "KeyError: 'code' (rerun with --debug", 1),
    (TypeError("bad type"), "bad type", 2),
    (RuntimeError("ray failed\nTraceback (most recent call last):\n  File x\nValueError: the real cause"),
     "ray failed ValueError: the real cause", 1),
])
def test_run_job_turns_any_exception_into_one_line(exc, fragment, rc, capsys):
    from dataclasses import dataclass

    @dataclass
    class Cfg:
        n: int = 1

    def main(cfg):
        raise exc

    assert run_job(main, Cfg, []) == rc
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err and "Traceback" not in err, err
    with pytest.raises(type(exc)):
        run_job(main, Cfg, ["--debug"])


def test_ray_style_cause_is_unwrapped():
    class Wrapped(RuntimeError):
        cause = ValueError("--mas_role all: role critic: bad rows")

    assert describe_error(Wrapped("long\nTraceback (most recent call last):\n ...")) == \
        "--mas_role all: role critic: bad rows"


def test_training_resume_refuses_other_settings_by_field(tmp_path):
    from recmas_ray.config.tree import save_config
    from recmas_ray.config.resume import check_training_resume
    from recmas_ray.system.config import with_system
    from recmas_ray.train.config import InnerTrainConfig

    cfg = with_system(InnerTrainConfig, dataset_name="synthetic:4", save_dir=str(tmp_path), seed=1, num_workers=0)
    check_training_resume(cfg, tmp_path)  # no earlier run: fine
    save_config(cfg, tmp_path)
    check_training_resume(cfg, tmp_path)
    import dataclasses

    check_training_resume(dataclasses.replace(cfg, log_every=1, resume=True, stop_at_step=3), tmp_path)
    with pytest.raises(ValueError, match=r"seed: 1 -> 2; .*w_mse: 0.0 -> 0.5"):
        check_training_resume(dataclasses.replace(cfg, system=dataclasses.replace(cfg.system, seed=2), w_mse=0.5),
                              tmp_path)
    with pytest.raises(ValueError, match="dataset_name"):
        check_training_resume(dataclasses.replace(cfg, dataset_name="synthetic:8"), tmp_path)
    (tmp_path / "config.json").write_text("{torn")
    with pytest.raises(ValueError, match="config.json is unreadable"):
        check_training_resume(cfg, tmp_path)


def test_full_disk_leaves_whole_lines_and_the_writer_goes_on(tmp_path, monkeypatch):
    from recmas_ray.eval import samples

    path = tmp_path / "samples.jsonl"
    real = samples.write_whole
    calls = {"n": 0}

    def fill_disk(fd, data):
        calls["n"] += 1
        if calls["n"] == 2:  # half the line reaches the disk, then it is full
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(samples, "write_whole", fill_disk)
    with samples.SampleWriter(path) as w:
        w.write({"doc_id": "0", "method": "m", "rollout": 0, "question": "q", "prediction": "p", "correct": True})
        with pytest.raises(OSError) as info:
            w.write({"doc_id": "1", "method": "m", "rollout": 0, "question": "q", "prediction": "p",
                     "correct": False})
        assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
        assert [json.loads(line)["doc_id"] for line in path.read_text().splitlines()] == ["0"]
        w.write({"doc_id": "1", "method": "m", "rollout": 0, "question": "q", "prediction": "p", "correct": False})
    assert [r["doc_id"] for r in samples.read_samples(path)] == ["0", "1"]
    assert path.read_text().endswith("\n")
