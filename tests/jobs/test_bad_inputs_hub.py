"""Names that need the Hugging Face Hub fail at once with one line: an unknown model id or benchmark dataset (one
request, never retried), an unreachable Hub, and an offline machine without a cached copy. The Hub here is a server
on 127.0.0.1 (or a closed port there); nothing leaves the machine."""

import http.server
import socket
import threading

import pytest

from jobs import run as run_job

ARGS = ["--style", "sequential_light", "--preset", "tiny", "--backend", "local", "--num_samples", "1"]


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """A Hub that knows no repository; yields the list of paths it was asked for. Online mode, empty caches."""
    from huggingface_hub import constants

    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            asked.append(self.path)
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "Repository not found"}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _online(monkeypatch, tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    yield asked
    server.shutdown()


def _online(monkeypatch, tmp_path, endpoint: str) -> None:
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)


@pytest.fixture
def nothing_heavy(monkeypatch):
    import recmas_ray.models.loader as loader

    def boom(*a, **k):
        raise AssertionError("bad input got past validation")

    monkeypatch.setattr(loader, "load_frozen_model", boom)


def _one_line(capsys, rc) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_unknown_model_id_is_one_request_and_one_line(fake_hub, question_file, tmp_path, capsys, nothing_heavy):
    rc = run_job.main(ARGS + ["--models", "solver=no-such-org/no-such-model", "--dataset", str(question_file),
                              "--output_path", str(tmp_path / "out")])
    line = _one_line(capsys, rc)
    assert "--models solver=no-such-org/no-such-model: is no model on the Hugging Face Hub" in line, line
    assert [p for p in fake_hub if "no-such-model" in p] == ["/api/models/no-such-org/no-such-model"]  # no retry
    assert not (tmp_path / "out").exists()


def test_unreachable_hub_is_one_line(monkeypatch, question_file, tmp_path, capsys, nothing_heavy):
    with socket.socket() as s:  # a port nobody listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _online(monkeypatch, tmp_path, f"http://127.0.0.1:{port}")
    rc = run_job.main(ARGS + ["--models", "critic=some-org/some-model", "--dataset", str(question_file),
                              "--output_path", str(tmp_path / "out")])
    line = _one_line(capsys, rc)
    assert "critic=some-org/some-model" in line and "cannot be reached" in line and "HF_HUB_OFFLINE=1" in line


def test_named_benchmark_offline_names_dataset_path(monkeypatch, tmp_path, capsys, nothing_heavy):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("RECMAS_MATH500_PATH", raising=False)
    rc = run_job.main(ARGS + ["--dataset", "math500", "--output_path", str(tmp_path / "out")])
    line = _one_line(capsys, rc)
    assert "'math500' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in line
    assert "--dataset_path" in line and not (tmp_path / "out").exists()


def test_named_benchmark_unknown_to_the_hub_is_one_request(fake_hub, monkeypatch, tmp_path, capsys, nothing_heavy):
    monkeypatch.delenv("RECMAS_GSM8K_PATH", raising=False)
    rc = run_job.main(ARGS + ["--dataset", "gsm8k", "--output_path", str(tmp_path / "out")])
    line = _one_line(capsys, rc)
    assert "was not found" in line and "--dataset_path" in line, line
    assert len([p for p in fake_hub if p.startswith("/api/datasets/")]) == 1, fake_hub  # asked once, no retry
