"""lm-eval-style outputs: append-only samples with resume, summaries, results file, table, plot."""

import dataclasses
import json
import math
import re

import pytest

from recmas_ray.eval import plots as P
from recmas_ray.eval import results as R
from recmas_ray.eval import samples as S


def test_sample_writer_appends_durably_and_resume_skips_done(tmp_path):
    path = tmp_path / "run" / "samples_math500_t.jsonl"
    with S.SampleWriter(path) as w:
        w.write({"doc_id": "a", "method": "recursive_mas", "correct": True, "question": "\u00e9t\u00e9"})
        w.write({"doc_id": "b", "method": "recursive_mas", "correct": False})
    assert S.load_done_ids(path) == {"recursive_mas::a", "recursive_mas::b"}
    # A crash mid-write leaves a torn line; it is not counted and the next writer cuts it off.
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"doc_id": "c", "method": "recursive_mas", "corr')
    assert S.load_done_ids(path) == {"recursive_mas::a", "recursive_mas::b"}
    with S.SampleWriter(path) as w:
        w.write({"doc_id": "c", "method": "recursive_mas", "correct": True})
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and all(json.loads(ln) for ln in lines)
    assert "\u00e9t\u00e9" in lines[0]
    assert S.load_done_ids(tmp_path / "missing.jsonl") == set()


def test_read_samples_keeps_one_record_per_key(tmp_path):
    path = tmp_path / "s.jsonl"
    with S.SampleWriter(path) as w:
        for rec in ({"doc_id": 1, "rollout": 0, "correct": False}, {"doc_id": 1, "rollout": 1, "correct": True},
                    {"doc_id": 1, "rollout": 0, "correct": True}):
            w.write(rec)
    recs = S.read_samples(path)
    assert len(recs) == 2 and all(r["correct"] for r in recs)
    assert S.sample_key({"doc_id": 3}) == "3"
    with pytest.raises(ValueError, match="doc_id"):
        S.sample_key({"method": "x"})


def test_summarize_accuracy_stderr_and_costs():
    samples = [{"doc_id": str(i), "correct": i < 7, "correct_reference": i < 8, "tokens": 100 + i,
                "latency_s": 2.0, "parse_failed": i == 9,
                "trace": [{"role": "planner", "round": 0, "latent_steps": 16},
                          {"role": "solver", "round": 0, "latent_steps": 0}]} for i in range(10)]
    out = R.summarize(samples, correct_fields={"strict": "correct", "reference": "correct_reference"},
                      wall_seconds=5.0)
    assert out["accuracy,strict"] == pytest.approx(0.7)
    assert out["accuracy_stderr,strict"] == pytest.approx(math.sqrt(0.7 * 0.3 / 9))
    assert out["accuracy,reference"] == pytest.approx(0.8)
    assert out["tokens_per_sample,none"] == pytest.approx(104.5)
    assert out["latent_steps_per_sample,none"] == 16
    assert out["latency_s,none"] == 2.0
    assert out["throughput_samples_per_s,none"] == 2.0
    assert out["parse_failure_rate,none"] == pytest.approx(0.1)
    assert not any(k.startswith("pass@") for k in out) and out["n_docs"] == 10


def test_summarize_pass_at_k_over_rollouts():
    # doc a: 1 of 4 rollouts correct, doc b: none correct.
    samples = [{"doc_id": "a", "rollout": r, "correct": r == 0, "tokens": {"planner": 3, "solver": 7}}
               for r in range(4)] + [{"doc_id": "b", "rollout": r, "correct": False} for r in range(4)]
    out = R.summarize(samples)
    assert out["pass@4,strict"] == pytest.approx(0.5)
    assert out["pass@1,strict"] == pytest.approx(0.125) == out["accuracy,strict"]
    assert out["tokens_per_sample,none"] == 10 and out["rollouts_per_doc"] == 4
    assert R.summarize(samples, k_values=[2])["pass@2,strict"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="pass@8"):
        R.summarize(samples, k_values=[8])
    with pytest.raises(ValueError, match="no samples"):
        R.summarize([])
    with pytest.raises(ValueError, match="'correct'"):
        R.summarize([{"doc_id": "x"}])


@dataclasses.dataclass
class _Cfg:
    style: str = "sequential_light"
    num_recursive_rounds: int = 2


def test_write_results_lm_eval_layout(tmp_path):
    res = {"math500/recursive_mas": {"benchmark": "math500", "method": "recursive_mas",
                                     "accuracy,strict": 0.5, "accuracy_stderr,strict": 0.1, "n_docs": 8}}
    path = R.write_results(tmp_path, "demo", res, _Cfg(), total_evaluation_time_seconds=12.5)
    assert path.parent == tmp_path / "demo"
    assert re.fullmatch(r"results_\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{6}\.json", path.name)
    data = json.loads(path.read_text())
    # metric rows hold numbers only; the strings sit in `metadata`, and read_results joins them again
    assert data["results"] == {"math500/recursive_mas": {"accuracy,strict": 0.5, "accuracy_stderr,strict": 0.1,
                                                         "n_docs": 8}}
    assert data["metadata"] == {"math500/recursive_mas": {"benchmark": "math500", "method": "recursive_mas"}}
    assert R.read_results(path) == res and R.read_results(data) == res
    assert data["config"] == {"style": "sequential_light", "num_recursive_rounds": 2}
    assert {"torch", "transformers", "ray"} <= set(data["versions"])
    assert data["git_hash"] is None or re.fullmatch(r"[0-9a-f]{4,40}", data["git_hash"])
    assert data["n-samples"] == {"math500/recursive_mas": {"original": 8, "effective": 8}}
    assert data["total_evaluation_time_seconds"] == 12.5 and isinstance(data["date"], float)
    assert data["machine"]["cpu_count"] >= 1 and len(data["machine"]["load_avg"]) == 3  # every results file
    assert not list(tmp_path.rglob("*.tmp"))


def test_read_results_reads_files_without_a_metadata_section(tmp_path):
    """Files written before the split kept strings inside the rows: they read the same."""
    row = {"benchmark": "gsm8k", "method": "recursive_mas", "rounds": 2, "accuracy,strict": 0.25}
    old = tmp_path / "results_old.json"
    old.write_text(json.dumps({"results": {"gsm8k/recursive_mas": row}, "config": {}}))
    assert R.read_results(old) == {"gsm8k/recursive_mas": row}
    assert R.split_metadata(row) == ({"rounds": 2, "accuracy,strict": 0.25},
                                     {"benchmark": "gsm8k", "method": "recursive_mas"})


def test_markdown_table_adds_speedup_from_throughput_and_token_reduction():
    base = {"benchmark": "math500", "method": "recursive_textmas", "accuracy,strict": 0.6,
            "accuracy_stderr,strict": 0.05, "tokens_per_sample,none": 1000.0, "latency_s,none": 4.0,
            "throughput_samples_per_s,none": 0.5}
    ours = {**base, "method": "recursive_mas", "accuracy,strict": 0.7, "tokens_per_sample,none": 250.0,
            "latency_s,none": 3.0, "throughput_samples_per_s,none": 1.0, "latent_steps_per_sample,none": 96.0}
    table = R.markdown_table({"math500/recursive_textmas": base, "math500/recursive_mas": ours})
    header, sep, row_base, row_ours = table.splitlines()
    assert "Speedup" in header and "Token reduction" in header and set(sep) <= set("|-")
    assert "|3.000|1.000|2.00x|75.0%|" in row_ours and "|4.000|0.500|1.00x|0.0%|" in row_base
    assert "|0.7000|+-|0.0500|" in row_ours
    single = R.markdown_table({"math500/recursive_mas": ours})
    assert "Speedup" not in single and len(single.splitlines()) == 3
    assert table.isascii()
    resumed = {k: {m: v for m, v in e.items() if not m.startswith("throughput")}  # no fresh wall time
               for k, e in {"a/recursive_textmas": base, "a/recursive_mas": ours}.items()}
    assert "|1.33x|" in R.markdown_table(resumed).splitlines()[3]


def test_timing_columns_are_marked_unreliable_when_load_exceeds_the_cores():
    row = {"math500/recursive_mas": {"benchmark": "math500", "method": "recursive_mas", "accuracy,strict": 0.5,
                                     "latency_s,none": 1.0, "throughput_samples_per_s,none": 2.0}}
    idle = R.markdown_table(row, machine={"cpu_count": 2, "load_avg": [1.5, 1.0, 1.0]})
    busy = R.markdown_table(row, machine={"cpu_count": 2, "load_avg": [5.25, 4.0, 3.0]})
    assert "*" not in idle and len(idle.splitlines()) == 3
    head, *_, note = busy.splitlines()
    assert "Latency s*" in head and "Samples/s*" in head
    assert note == "* unreliable: load average 5.25 > 2 cores (other work shared the CPUs)"
    machine = R.machine_load()
    assert machine["cpu_count"] >= 1 and len(machine["load_avg"]) == 3


def test_plot_vs_rounds_writes_a_png(tmp_path):
    rows = [{"method": m, "rounds": r, "accuracy": 0.5 + 0.1 * r, "tokens_per_sample": 100 * r,
             "seconds_per_sample": 1.0 * r} for m in ("recursive_mas", "recursive_textmas") for r in (1, 2, 3)]
    out = P.plot_vs_rounds(rows, tmp_path / "plots" / "rounds.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    with pytest.raises(ValueError, match="no rows"):
        P.plot_vs_rounds([], tmp_path / "x.png")


def test_sampled_runs_report_mean_and_spread():
    # 2 documents x 3 runs: run accuracies 1.0, 0.5, 0.0 -> mean 0.5, sample std 0.5.
    samples = [{"doc_id": d, "rollout": r, "correct": ok}
               for r, oks in enumerate([(True, True), (True, False), (False, False)]) for d, ok in zip("ab", oks)]
    out = R.summarize(samples)
    assert out["accuracy_runs,strict"] == [1.0, 0.5, 0.0] and out["accuracy,strict"] == pytest.approx(0.5)
    assert out["accuracy_runs_std,strict"] == pytest.approx(0.5)
    assert "accuracy_runs,strict" not in R.summarize([s for s in samples if s["rollout"] == 0])
