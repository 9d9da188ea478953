"""The demo job: every figure of its report computed on tiny models, the run plan, the CLI's errors and recipes,
the --quick run on the tiny preset, and the plot."""

import json
import math
import re

import pytest

from jobs import demo as demo_job
from jobs.experiments.demo import compare
from jobs.experiments.demo.config import DemoConfig
from recmas_ray.train.synthetic import make_arithmetic_dataset

HIDDEN_FIELDS = ("question", "answer", "gold", "role_context", "facts")


def _hidden_rows(n: int, first_x: int = 10) -> list[dict]:
    """An in-test stand-in of hidden-operand rows (the generator lives in train.synthetic): only the
    planner's view holds x."""
    rows = []
    for i in range(n):
        x, b = first_x + i, 1 + i % 7
        rows.append({"question": f"What is x - {b}?", "role_context": {"planner": f"x = {x}."},
                     "answer": f"{x} - {b} = {x - b}. \\boxed{{{x - b}}}", "gold": str(x - b),
                     "facts": {"x": x, "b": b}})
    return rows


@pytest.mark.parametrize("family", ["arithmetic", "hidden_operand"])
def test_every_figure_of_the_report_is_computed(tmp_path, tiny_cache, family):
    """Tiny random models, every method and ablation at R = 1, 2: each figure of the table, the information
    flow and the paired tests is present and finite where it must be (not that it is good)."""
    from jobs.experiments.demo import report, verdicts
    from jobs.experiments.demo.pipeline import hidden_facts_of, role_questions_of
    from jobs.experiments.probe import question_facts
    from recmas_ray.system.plan import plan_system

    rows_ = _hidden_rows(10) if family == "hidden_operand" else make_arithmetic_dataset(10, difficulty="arith")
    plans = {k: plan_system("sequential_light", preset="tiny", seed=s, task="qa")
             for k, s in (("fresh", 0), ("inner", 1), ("trained", 2))}
    agents = compare.Agents(plans, "local", torch_threads=1)
    items = [{"doc_id": f"q{i}", "question": r["question"], "gold": r["gold"], "task_type": "qa"}
             for i, r in enumerate(rows_)]
    targets = {i["doc_id"]: r["answer"] for i, r in zip(items, rows_)}
    facts = {i["doc_id"]: question_facts(r) for i, r in zip(items, rows_)}
    views = {i["doc_id"]: role_questions_of(r) for i, r in zip(items, rows_)}
    hidden = tuple(sorted({k for i, r in zip(items, rows_) for k in hidden_facts_of(r, facts[i["doc_id"]])}))
    assert hidden == (("x",) if family == "hidden_operand" else ())
    role_questions = views if any(views.values()) else None
    plan = compare.plan_runs([1, 2], [2], [1], hidden_fact=role_questions is not None)
    rows = [compare.run_one(agents, compare.BY_KEY[k], r, items, targets, latent_steps=2, max_new_tokens=2,
                            batch_size=5, seed=0, samples_path=tmp_path / f"{k.replace('/', '_')}_{r}.jsonl",
                            facts=facts, role_questions=role_questions, hidden_facts=hidden) for k, r in plan]
    compare.add_comparisons(rows)
    classes = {"result", "operand", "wording"} | ({"fact"} if hidden else set())
    for row in rows:
        assert row["n"] == 10 and 0 <= row["ci_low"] <= row["accuracy"] <= row["ci_high"] <= 1
        assert math.isfinite(row["nll"])
        by_class = row["flow"]["nll_by_class"]
        assert {c for c, v in by_class.items() if v is not None} == classes, (row["variant"], by_class)
        assert all(math.isfinite(v) for v in by_class.values() if v is not None)
        edges = row["flow"]["edges"]
        if row["method"] != "recursive_mas" or row["variant"] == "ablation/empty":
            assert edges == {}, row["variant"]
            continue
        want = {"planner->critic R1", "critic->solver R1"} | (
            {"solver->planner R1", "planner->critic R2", "critic->solver R2"} if row["rounds"] == 2 else set())
        assert set(edges) == want, row["variant"]
        for e in edges.values():
            assert all(math.isfinite(e[k]) for k in ("mean_cosine", "variance_ratio", "mean_vector_norm"))
            expected = {"x", "b", "answer"} if hidden else {"operation", "operand_a", "operand_b", "answer"}
            assert set(e["probe"]) == expected
            assert all(math.isfinite(p["score"]) and math.isfinite(p["baseline"]) for p in e["probe"].values())
    if hidden:  # the ceiling row read the planner's view: the fact, which the floor row never saw
        ceiling = json.loads((tmp_path / "single_agent_fact_1.jsonl").read_text().splitlines()[0])
        assert ceiling["variant"] == "single_agent/fact"
    tests = verdicts.paired_tests(rows)
    others = {(t["other"], t["rounds"]) for t in tests}
    expect = {("recursive_mas/fresh", 1), ("recursive_mas/inner", 1), ("textmas", 1), ("single_agent", 1),
              ("textmas", 2), ("recursive_textmas", 2), ("single_agent", 2)} | {
        (f"ablation/{a}", 2) for a in compare.ABLATIONS}
    if hidden:
        expect |= {("single_agent/fact", 1), ("single_agent/fact", 2)}
    assert others == expect
    for t in tests:
        assert 0 <= t["mcnemar"]["p"] <= 1 and t["mcnemar"]["n"] == 10
        assert math.isfinite(t["nll_diff"]["mean"]) and math.isfinite(t["nll_diff"]["se"])
        assert set(t["nll_diff_by_class"]) == classes
    lines = verdicts.paired_verdicts(tests) + verdicts.flow_verdicts(rows, tests)
    channel = verdicts.channel_verdicts(rows, tests)
    assert len(channel) == (2 if hidden else 0)  # trained vs fresh (R = 1) and vs shuffled (R = 2)
    assert all("not shown at p < 0.01 with n >= 128" in ln for ln in channel)  # n = 10 can never show it
    assert len([ln for ln in lines if ln.startswith("paired:")]) == len(tests)
    # trained edges at R = 1 and 2 (present in the message), and the shuffle gap at R = 2 (used by the decoder)
    assert len([ln for ln in lines if ln.startswith("flow: ")]) == 2 + 5 + 1
    assert any("question-specific" in ln for ln in lines)
    for text in (report.table(rows), report.flow_table(rows), report.paired_table(tests)):
        assert text.count("\n") >= 3 and "nan" not in text
    assert report.plot(rows, tmp_path / "p.png").stat().st_size > 10_000
    json.dumps([compare.public_row(r) for r in rows])  # the results file's rows serialise


def test_run_plan_covers_every_method_and_r():
    runs = compare.plan_runs([1, 2, 3], [3])
    assert ("single_agent", 1) in runs and ("textmas", 1) in runs and ("recursive_textmas", 1) not in runs
    for links in ("fresh", "inner", "trained"):
        assert {r for k, r in runs if k == f"recursive_mas/{links}"} == {1, 2, 3}
    assert {k for k, r in runs if k.startswith("ablation/")} == {"ablation/shuffle", "ablation/zero", "ablation/empty"}
    assert ("single_agent/fact", 1) not in runs and ("single_agent/fact", 1) in compare.plan_runs([1], [1], hidden_fact=True)
    # --link_rounds: fresh and inner-only rows at those R only, the trained row still at every R
    runs = compare.plan_runs([1, 2], [1], [1])
    assert {(k, r) for k, r in runs if k.startswith("recursive_mas/")} == {
        ("recursive_mas/fresh", 1), ("recursive_mas/inner", 1), ("recursive_mas/trained", 1),
        ("recursive_mas/trained", 2)}
    assert DemoConfig(rounds=[1, 2], link_rounds=[1]).ablation_r() == [1]


# ----------------------------------------------------------------------------- CLI
def test_user_errors_exit_2_before_anything_runs(tmp_path, capsys):
    assert demo_job.main(["--quick", "--full"]) == 2
    assert demo_job.main(["--num_eval", "0", "--output_path", str(tmp_path)]) == 2
    assert demo_job.main(["--ablation_rounds", "5", "--output_path", str(tmp_path)]) == 2
    assert demo_job.main(["--rounds", "1,2", "--link_rounds", "3", "--output_path", str(tmp_path)]) == 2
    assert demo_job.main(["--outer_options", "no_such_field=1", "--output_path", str(tmp_path)]) == 2
    assert demo_job.main(["--outer_options", "lr=1e-3", "--output_path", str(tmp_path)]) == 2
    assert demo_job.main(["--outer_options", "weight_decay=lots", "--output_path", str(tmp_path)]) == 2
    assert demo_job.main(["--seed", "2147483647", "--facts.num_seeds", "2", "--output_path", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--num_eval 0" in err and "exclude each other" in err and len(err.strip().splitlines()) == 8
    assert "--facts.num_seeds 2: seeds 2147483647..2147483648 pass 2147483647" in err
    assert "--outer_options no_such_field: not a field of OuterTrainConfig" in err
    assert "--outer_options lr: set by the demo's own flag (--inner_lr / outer_lr)" in err
    assert "--outer_options weight_decay='lots': expected a number" in err
    assert "--link_rounds [3] are not among --rounds [1, 2]" in err
    assert not list(tmp_path.iterdir())


def test_hidden_operand_family_checks_its_size_and_uses_every_view(tmp_path, capsys, monkeypatch):
    from jobs.experiments.demo import pipeline
    from jobs.experiments.demo.pipeline import full_question, make_data

    # more questions than the recall family holds: one line, nothing written
    assert demo_job.main(["--task_family", "hidden_operand", "--num_train", "1000", "--num_eval", "100",
                          "--output_path", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--num_train 1000: the hidden_recall family has only" in err and not (tmp_path / "o").exists()
    # the split is checked on what the best-informed agent sees: "What is x - 3?" repeats
    monkeypatch.setattr(pipeline, "make_hidden_operand_dataset",  # test rows from other x values, as the splits do
                        lambda n, seed=0, question_kind="", split="": _hidden_rows(n, 50 if split == "test" else 10))
    cfg = DemoConfig(task_family="hidden_operand", num_train=6, num_eval=4, output_path=str(tmp_path))
    cfg.validate()
    _, _, heldout = make_data(cfg, tmp_path)
    assert len(heldout) == 4 and all(full_question(r).startswith("x = ") for r in heldout)
    # the default question kind is recall ("What is x?"), the arithmetic one on request
    monkeypatch.undo()
    for kind, pattern in (("recall", r"What is [a-z]\?"), ("arithmetic", r"What is [a-z] [+-] \d\?")):
        cfg = DemoConfig(task_family="hidden_operand", hidden_question=kind, num_train=6, num_eval=4,
                         output_path=str(tmp_path / kind))
        cfg.validate()
        _, _, heldout = make_data(cfg, tmp_path / kind)
        assert all(re.fullmatch(pattern, r["question"]) for r in heldout), kind


def test_quick_and_full_are_recipes_flags_still_win(capsys):
    assert demo_job.main(["--quick", "--num_eval", "5", "--print_config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["num_eval"] == 5 and cfg["inner_steps"] == 6
    assert demo_job.main(["--full", "--print_config"]) == 0
    assert json.loads(capsys.readouterr().out)["num_eval"] >= 64
    assert DemoConfig().num_eval >= 64


# ----------------------------------------------------------------------------- end to end
@pytest.mark.integration
@pytest.mark.timeout(1800)  # a hang guard only: four Ray Train start-ups take minutes on a loaded 2-core machine
def test_demo_quick_on_tiny_preset(tmp_path, ray_cluster, capsys):
    out = tmp_path / "demo"
    assert demo_job.main(["--preset", "tiny", "--quick", "--backend", "local", "--output_path", str(out),
                          "--no_progress", "--role_model", "critic=tiny:mistral", "--tasks", "arithmetic"]) == 0
    captured = capsys.readouterr()
    printed = captured.out  # results (tables, verdicts, paths); what the job is doing goes to stderr
    phases = [ln for ln in captured.err.splitlines() if ln.strip() and not ln.endswith(" ...")]  # final lines
    data = json.loads((out / "demo_results.json").read_text())
    rows, n = data["rows"], data["heldout_size"]
    assert n == len((out / "heldout.jsonl").read_text().splitlines()) == 16
    keys = {(r["variant"], r["rounds"]) for r in rows}
    cfg = json.loads((out / "demo_config.json").read_text())
    expected = {("single_agent", 1), ("textmas", 1)} | {("recursive_textmas", r) for r in cfg["rounds"]} | {
        ("recursive_mas/trained", r) for r in cfg["rounds"]} | {
        (f"recursive_mas/{k}", r) for r in (cfg["link_rounds"] or cfg["rounds"]) for k in ("fresh", "inner")}
    abl = cfg["ablation_rounds"] or [max(cfg["link_rounds"] or cfg["rounds"])]
    expected |= {(f"ablation/{a}", r) for r in abl for a in compare.ABLATIONS}
    assert keys == expected and len(cfg["rounds"]) >= 2
    for r in rows:
        assert r["n"] == n and 0 <= r["ci_low"] <= r["accuracy"] <= r["ci_high"] <= 1, r
        assert math.isfinite(r["nll"]) and r["nll"] > 0, r
        assert r["tokens_per_sample"] > 0 and r["seconds_per_sample"] > 0
        assert r["speedup"] is not None and r["token_reduction"] is not None
    by = {(r["variant"], r["rounds"]): r for r in rows}
    for r in cfg["rounds"]:  # fewer generated tokens than text recursion at every R, on the same questions
        assert by[("recursive_mas/trained", r)]["token_reduction"] > 0
    assert by[("recursive_textmas", 1)]["accuracy"] == by[("textmas", 1)]["accuracy"]
    # paired tests of the trained system against every other method, and the verdicts they support
    tests = {(t["other"], t["rounds"]) for t in data["paired_tests"]}
    assert {("ablation/shuffle", r) for r in abl} <= tests and ("recursive_mas/fresh", 1) in tests
    assert ("textmas", 1) in tests and ("single_agent", 1) in tests
    assert all(0 <= t["mcnemar"]["p"] <= 1 and math.isfinite(t["nll_diff"]["mean"]) for t in data["paired_tests"])
    assert sum(v.startswith("paired:") for v in data["verdicts"]) == len(data["paired_tests"])
    assert sum(v.startswith("flow: trained") for v in data["verdicts"]) >= 2
    for r in rows:  # information flow: NLL by token class everywhere, geometry + probes on every latent edge
        assert r["flow"]["nll_by_class"]["result"] is not None and r["flow"]["nll_by_class"]["wording"] is not None
        if r["method"] == "recursive_mas" and r["variant"] != "ablation/empty":
            assert "critic->solver R1" in r["flow"]["edges"], r["variant"]
            assert all(math.isfinite(e["mean_cosine"]) for e in r["flow"]["edges"].values())
    # the console: phase lines, the tables and the verdicts, nothing else
    lines = [ln for ln in printed.splitlines() if ln.strip()]
    table = [ln for ln in lines if ln.startswith("|")]
    assert table[0].startswith("|Method|R|n|Accuracy (strict)|95% CI|Lenient|NLL|Tokens/sample|s/sample @ load/cores|"
                               "Token reduction|NLL result|NLL operand|NLL wording|")
    # the answer first: one headline per R with own, shuffled and fresh links, before any table
    heads = [i for i, ln in enumerate(lines) if ln.startswith("sequential_light / arithmetic, R=")]
    assert len(heads) == len(abl) and heads[-1] < lines.index(table[0]) and data["headline"] == [lines[i] for i in heads]
    assert all(re.search(r"\d+/16 own vs \d+/16 shuffled vs \d+/16 fresh \(McNemar p", lines[i]) for i in heads)
    for r in rows:  # graded both ways, every prediction kept
        assert r["correct_lenient"] >= r["correct"] and len(data["per_question"][f"{r['variant']} R={r['rounds']}"]["prediction"]) == n
    origins = data["training"]["link_origins"]
    assert set(origins) == {"planner", "critic", "solver", "outer"} and all(o["known"] for o in origins.values())
    assert any(ln.startswith("|Method|R|Edge|Cosine|") for ln in table)
    assert any(ln.startswith("|Trained vs|R|") for ln in table)
    assert len([ln for ln in table if ln.startswith("|---")]) == 3
    other = [ln for ln in lines if not ln.startswith("|")]
    assert all(ln.startswith(("sequential_light / ", "channel:", "paired:", "flow:", "plot:", "results:"))
               for ln in other), other
    assert all(ln.startswith(("checking inputs", "starting Ray", "data:", "preparing models", "inner training",
                              "outer training", "starting agents", "evaluate ")) for ln in phases), phases
    assert sum(ln.startswith("evaluate ") for ln in phases) == len(rows) - 1  # R=1 text recursion is TextMAS
    assert (out / "demo_results.png").stat().st_size > 1000 and (out / "logs" / "demo.log").exists()
    for role in ("planner", "critic", "solver"):
        assert (out / "inner" / role / "links.safetensors").exists()
    assert (out / "outer" / "links.safetensors").exists()
    # --role_model replaced the preset's critic everywhere: results, inner manifest, outer manifest
    assert data["role_models"] == {"planner": "tiny:qwen3", "critic": "tiny:mistral", "solver": "tiny:gemma3"}
    assert json.loads((out / "inner" / "critic" / "manifest.json").read_text())["base_model"] == "tiny:mistral"
    assert "tiny:mistral" in (out / "outer" / "manifest.json").read_text()


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_demo_leads_with_the_fact_answer_on_tiny_preset(tmp_path, ray_cluster, capsys):
    """The hidden-fact phase: its answer line per style, task and held-out split comes first, then the tables;
    the PNG leads with own vs shuffled vs fresh links of each split."""
    import re

    out = tmp_path / "demo"
    assert demo_job.main(["--preset", "tiny", "--quick", "--output_path", str(out), "--no_progress",
                          "--tasks", "distillation:recall,distillation:compare", "--facts.pipeline", "experiment"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    answers = [ln for ln in lines if ln.startswith("distillation / ") and "McNemar p" in ln]
    assert len(answers) == 6, lines  # two tasks x (seen values, unseen values, all held-out)
    assert re.match(r"distillation / recall \(seen values\), R=1: trained links (carry the fact|do not show the fact): "
                    r"\d+/8 own vs \d+/8 shuffled vs \d+/8 fresh \(McNemar p [\d.e+-]+ vs shuffled, [\d.e+-]+ vs fresh; "
                    r"Holm [\d.e+-]+, [\d.e+-]+; alpha 0.01\)$", answers[0]), answers[0]
    assert re.match(r"distillation / recall \(all held-out\), R=1: .* \d+/12 own vs", answers[2]), answers[2]
    assert re.match(r"distillation / compare \(unseen values\), R=1: trained RecursiveMAS \d+/4 vs single agent \d+/4 "
                    r"vs TextMAS \d+/4 ", answers[4]), answers[4]
    first_table = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    assert first_table > lines.index(answers[-1])  # the answers come before every table
    assert (out / "demo_results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "facts" / "summary.json").read_text())
    assert summary["lines"] == answers


@pytest.mark.parametrize("rounds", [[1], [1, 2]])
def test_plot_draws_one_or_several_rounds(tmp_path, rounds):
    from jobs.experiments.demo import report

    per_doc = {f"q{k}": k % 4 == 0 for k in range(8)}
    rows = [dict(variant=v.key, label=v.label, rounds=r, n=8, correct=2, correct_per_doc=per_doc, accuracy=0.25,
                 accuracy_lenient=0.375, ci_low=0.1, ci_high=0.4, nll=1.2 + 0.01 * i, nll_stderr=0.01,
                 tokens_per_sample=20.0, seconds_per_sample=1.0)
            for i, v in enumerate(compare.VARIANTS) for r in rounds]
    path = report.plot(rows, tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
