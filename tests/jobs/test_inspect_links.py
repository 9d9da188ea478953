"""`python -m jobs.inspect_links`: prints the channel figures a recursive_mas run of the folder records."""

import json

from tests.conftest import write_jsonl
from tests.system.link_folders import STYLE, write_system_folder


def test_inspect_links_prints_each_token_links_figures(tmp_path, tiny_cache, capsys):
    from jobs import inspect_links

    folder = write_system_folder(tmp_path / "sys")
    data = write_jsonl(tmp_path / "q.jsonl", [{"question": q, "answer": "0"} for q in ("x = 4. What is x?",
                                                                                     "What is 2 + 3?")])
    out = tmp_path / "out"
    assert inspect_links.main(["--style", STYLE, "--preset", "tiny", "--links", str(folder), "--dataset", str(data),
                               "--backend", "local", "--output_path", str(out), "--no_progress", "--no_format_retry",
                               "--num_recursive_rounds", "1", "--latent_steps", "3", "--max_new_tokens", "2"]) == 0
    printed = capsys.readouterr().out
    results = json.loads(next(out.glob("results_*.json")).read_text())
    c = results["channel"]["critic->solver"]
    assert f"critic->solver: mean top-1 probability {c['mean_top1']:.3f}" in printed
    assert printed.count("  question ") == 2 and "planner->critic:" not in printed  # a release link: no figures
    assert all(k.endswith("/recursive_mas") for k in results["results"])
