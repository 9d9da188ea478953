"""Shared fixtures: offline environment, the tiny model cache, one session-wide local Ray cluster.

Environment variables are set at import time, before any Ray process starts, so every Ray worker
inherits them (no auth token, no usage stats, no hub access, small progress output).
"""

import os
import tempfile

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RECMAS_CACHE", os.path.join(tempfile.gettempdir(), "recmas_ray_test_cache"))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# Ray workers import this checkout (not whichever copy is pip-installed), like the tests themselves.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # small tensors: a second thread costs more than it gives on 2 busy cores


@pytest.fixture(scope="session")
def tiny_cache():
    """Build the four tiny model families once (milliseconds each) and return the cache root."""
    from recmas_ray.models.cache import cache_root
    from recmas_ray.models.tiny import TINY_FAMILIES, ensure_tiny_model

    for family in TINY_FAMILIES:
        ensure_tiny_model(family)
    return cache_root()


@pytest.fixture(scope="session")
def ray_cluster(tiny_cache):
    """One local Ray cluster for the whole session: no dashboard, small object store, 8 logical CPUs.

    Logical CPUs exceed the 2 physical cores on purpose: agent actors and Ray Train workers ask for
    fractions, and Ray Data needs free CPUs for its read tasks.
    """
    import ray

    from recmas_ray.distributed.cluster import init_local_ray

    started = not ray.is_initialized()
    if started:  # auth is off for tests (above), so the cluster listens on 127.0.0.1 only
        init_local_ray(num_cpus=8, num_gpus=0, include_dashboard=False, object_store_memory=384 * 2**20,
                       namespace="recmas-tests", log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


def write_jsonl(path, rows):
    """Write rows as JSON lines (shared by tests that need a question file)."""
    import json

    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture
def question_file(tmp_path):
    """A 4-question JSONL file in the plain `question`/`answer` format."""
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(2, 3), (10, 7), (4, 4), (21, 5)]]
    return write_jsonl(tmp_path / "questions.jsonl", rows)


# Tests marked `sandbox` run model-written code under bubblewrap. A new user's machine may lack it: there they
# skip, with one line in the summary saying why; CI installs bwrap and sets RECMAS_REQUIRE_SANDBOX=1, which
# turns the skip into a failure so that no sandbox test can silently stop running.
REQUIRE_SANDBOX = os.environ.get("RECMAS_REQUIRE_SANDBOX", "") == "1"
_SANDBOX_SKIP = "sandbox unavailable: "


@pytest.fixture
def nothing_heavy(monkeypatch):
    """Model loads, agent start-up, Ray and Ray Train fail the row (AssertionError is not a user error)."""
    import ray
    import ray.train.torch

    import recmas_ray.distributed.cluster as cluster
    import recmas_ray.eval.batch_runner as batch_runner
    import recmas_ray.eval.run as driver
    import recmas_ray.models.loader as loader

    def boom(*a, **k):
        raise AssertionError("a model loaded or Ray started before the input was rejected")

    for mod, name in ((loader, "load_frozen_model"), (driver, "BatchRunner"), (batch_runner, "start_agents"), (ray, "init"),
                      (ray.train.torch, "TorchTrainer"), (cluster, "init_ray"), (cluster, "start_ray")):
        monkeypatch.setattr(mod, name, boom)


def snapshot(root) -> dict:
    """Every path under `root` with its mode, size and mtime (a test compares two to see that nothing was written)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(folder, name))
            out[os.path.join(folder, name)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


EVERY_ATTEMPT = 10**9


@pytest.fixture
def inject_faults(monkeypatch):
    """Failures the runs this test starts meet, undone after it: `inject_faults(fail_docs={"1": 2})` fails the
    first two attempts of the batch holding doc 1 (`EVERY_ATTEMPT`: all), `client_exit_after=N` makes a Ray Data
    client exit before its (N+1)-th batch, `agent_exit_after={"critic": 1}` the critic's actor before its 2nd call."""
    from recmas_ray.eval import stream

    def inject(*, fail_docs=None, client_exit_after=None, agent_exit_after=None):
        monkeypatch.setattr(stream, "FAULTS", stream.Faults(fail_docs=dict(fail_docs or {}),
                                                            client_exit_after=client_exit_after))
        if agent_exit_after:
            from recmas_ray.distributed import actors

            for role, n in agent_exit_after.items():
                monkeypatch.setitem(actors.AGENT_EXIT_AFTER, role, n)

    return inject


def _sandbox_unavailable() -> str:
    """Why the sandbox cannot run here, or "" when it can (the package's own probe, once per process)."""
    from recmas_ray.sandbox import bwrap

    try:
        bwrap._probe()
    except bwrap.SandboxUnavailable as exc:
        return str(exc)
    return ""


def pytest_collection_modifyitems(config, items):
    needing = [item for item in items if item.get_closest_marker("sandbox")]
    reason = _sandbox_unavailable() if needing else ""
    if not reason or REQUIRE_SANDBOX:
        return
    skip = pytest.mark.skip(reason=_SANDBOX_SKIP + reason)
    for item in needing:
        item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    reasons = [str(rep.longrepr[-1]) for rep in terminalreporter.stats.get("skipped", ())
               if isinstance(rep.longrepr, tuple) and _SANDBOX_SKIP in str(rep.longrepr[-1])]
    if reasons:  # one line for all of them, instead of one per test with -rs
        reason = reasons[0].split(_SANDBOX_SKIP, 1)[1]
        terminalreporter.write_line(f"{len(reasons)} sandbox tests skipped: {reason}. Install bubblewrap to run "
                                    "them (RECMAS_REQUIRE_SANDBOX=1 makes a missing sandbox fail the run).")


def tiny_planner_agents() -> dict:
    """One planner `Agent` per tiny family (fp32, inner link seeded 0): the engine tests' common subjects."""
    from recmas_ray.engine.agent import Agent
    from recmas_ray.engine.links import InnerLink
    from recmas_ray.models.loader import load_frozen_model
    from recmas_ray.models.tiny import TINY_FAMILIES

    out = {}
    for family in TINY_FAMILIES:
        model, tok = load_frozen_model(f"tiny:{family}", dtype=torch.float32)
        torch.manual_seed(0)
        out[family] = Agent(model, tok, InnerLink(model.config.hidden_size), role="planner",
                            model_name=f"tiny:{family}")
    return out
