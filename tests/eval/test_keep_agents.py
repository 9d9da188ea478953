"""Agents kept across the evaluations of one job (`recmas_ray/eval/batch_runner.py`, `keep_agents`): rows whose
agents would start identically share one start-up, a row whose links or prompts differ gets its own, every row
gives the predictions it gives run alone, and the block leaves no agent running."""

import json

import pytest

import recmas_ray.eval.batch_runner as batch_runner
from recmas_ray.eval.batch_runner import keep_agents
from tests.conftest import write_jsonl
from tests.system.link_folders import STYLE, write_system_folder

QUESTIONS = ["x = 41. What is x?", "y = 17. What is y?", "What is 7 * 8?"]
FAST = ["--num_recursive_rounds", "1", "--latent_steps", "3", "--max_new_tokens", "6"]
ROWS = {  # name -> the jobs.run arguments that make the row (as the main job's product rows)
    "own": ["--method", "recursive_mas"],
    "shuffled": ["--method", "recursive_mas", "--latent_ablation", "shuffle"],
    "floor": ["--method", "single_agent"],
    "format_help": ["--method", "single_agent", "--format_help"],  # the decoder's prompts differ: new agents
    "untrained": ["--method", "recursive_mas", "--outer_init", "untrained"],  # other outer links: new agents
}


def _row(folder, data, out, backend, extra):
    from jobs import run as run_job

    assert run_job.main(["--style", STYLE, "--preset", "tiny", "--links", str(folder), "--dataset", str(data),
                         "--backend", backend, "--output_path", str(out), "--no_format_retry", "--batch_size", "3",
                         "--no_progress", "--seed", "0", *FAST, *extra]) == 0
    return [(r["method"], r["doc_id"], r["prediction"])
            for r in sorted((json.loads(line) for f in out.glob("samples_*.jsonl") for line in open(f)),
                            key=lambda r: int(r["doc_id"]))]


def _rows(tmp_path, backend, *, kept: bool):
    """Every row of ROWS (inside keep_agents when `kept`); returns (predictions per row, agent start-ups, the
    agents started)."""
    folder = write_system_folder(tmp_path / "sys")
    data = write_jsonl(tmp_path / "q.jsonl", [{"question": q, "answer": "0"} for q in QUESTIONS])
    started = []
    real = batch_runner.start_agents

    def counting(plan, **settings):
        started.append(real(plan, **settings))
        return started[-1]

    batch_runner.start_agents = counting
    try:
        out = tmp_path / ("kept" if kept else "alone") / backend
        if kept:
            with keep_agents():
                got = {name: _row(folder, data, out / name, backend, extra) for name, extra in ROWS.items()}
        else:
            got = {name: _row(folder, data, out / name, backend, extra) for name, extra in ROWS.items()}
    finally:
        batch_runner.start_agents = real
    return got, started


def test_rows_of_one_system_share_its_agents_and_give_their_own_predictions(tmp_path, tiny_cache):
    kept, started_kept = _rows(tmp_path, "local", kept=True)
    alone, started_alone = _rows(tmp_path, "local", kept=False)
    assert kept == alone  # each row as `python -m jobs.run` alone gives it
    assert len(started_alone) == len(ROWS)
    # own, shuffled and floor share one start-up; format help (prompts) and untrained links (weights) start their own
    assert len(started_kept) == 3


def test_keep_agents_is_one_block_and_frees_what_it_kept(tmp_path, tiny_cache):
    with keep_agents():
        with pytest.raises(RuntimeError, match="already open"):
            with keep_agents():
                pass
    with pytest.raises(ValueError, match="max_systems=0"):
        with keep_agents(max_systems=0):
            pass
    assert batch_runner._KEPT.entries is None  # closed: a later evaluation owns (and ends) its own agents


@pytest.mark.integration  # five jobs.run rows on Ray actors, twice: ~1-2 min on a busy 2-core machine
@pytest.mark.timeout(900)
def test_rows_share_ray_actors_and_match_running_alone(tmp_path, ray_cluster, tiny_cache):
    import ray

    kept, started_kept = _rows(tmp_path, "ray", kept=True)
    alone, _ = _rows(tmp_path, "ray", kept=False)
    assert kept == alone and len(started_kept) == 3
    for system in started_kept:  # the block shut every kept system down: no actor of theirs is left
        for replica in system.systems:
            for actor in replica.actors().values():
                with pytest.raises(ray.exceptions.RayActorError):
                    ray.get(actor.__ray_ready__.remote(), timeout=60)
