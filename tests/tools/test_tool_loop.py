"""Deliberation tool loop: a scripted model (the next-token picker replaced) emits fixed tool calls.

Covers call order and splicing, the round limit and its note, the token budget across continuations, KV-cache
continuation (positions fed and logits equal to a full re-run), the trace, no key leaks in a full `jobs/run.py`
run (stdout, stderr, logs, output files), and an offline run where search reports itself unavailable.
"""
from __future__ import annotations

import glob
import json
import logging
from pathlib import Path

import pytest
import torch

import recmas_ray.engine.agent as agent_mod
import recmas_ray.tools.search as search_mod
from recmas_ray.engine.agent import Agent
from recmas_ray.config.recursion import DecodeConfig
from recmas_ray.engine.links import InnerLink
from recmas_ray.models.loader import load_frozen_model
from recmas_ray.tools import SearchKeyError
from recmas_ray.tools.loop import LIMIT_NOTE, Toolbox, ToolLoopConfig, _cut_after_tag, run_tool_loop
from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


class ScriptedPicker:
    """Stands in for `agent._pick`: returns the script's tokens in order, then EOS; records the logits it saw."""

    def __init__(self, tokenizer, text: str):
        self.ids = tokenizer(text, add_special_tokens=False).input_ids
        self.eos = tokenizer.eos_token_id
        self.pos = 0
        self.logits: list[torch.Tensor] = []

    def __call__(self, logits_BV, cfg, gen):
        self.logits.append(logits_BV.clone())
        tok = self.ids[self.pos] if self.pos < len(self.ids) else self.eos
        self.pos += 1
        return torch.tensor([tok] * logits_BV.shape[0], device=logits_BV.device)


class FakeSearch:
    """Search backend recording its queries."""

    def __init__(self):
        self.queries: list[str] = []

    def search(self, query, *, api_key, max_results):
        self.queries.append(query)
        return [{"title": f"About {query}", "url": "https://example.org/x", "content": "324 metres tall."}]


@pytest.fixture(scope="module")
def agent(tiny_cache):
    model, tok = load_frozen_model("tiny:llama", dtype=torch.float32)
    torch.manual_seed(0)
    return Agent(model, tok, InnerLink(model.config.hidden_size), role="toolcaller", model_name="tiny:llama")


def scripted_run(agent, monkeypatch, script, *, max_new_tokens=400, **tool_kw):
    picker = ScriptedPicker(agent.tokenizer, script)
    monkeypatch.setattr(agent_mod, "_pick", picker)
    monkeypatch.setenv("TAVILY_API_KEY", "fake-key")  # a key, so the fake backend is asked
    search = FakeSearch()
    toolbox = Toolbox(ToolLoopConfig(**tool_kw), search_backend=search)
    e, mask = agent.embed_batch(["What is 6 times 7?"])
    out = run_tool_loop(agent, e, mask, DecodeConfig(max_new_tokens=max_new_tokens), toolbox)
    return out, picker, search, (e, mask)


@pytest.mark.sandbox
def test_calls_run_in_order_and_results_are_spliced(agent, monkeypatch):
    script = ("First compute. <python>print(6*7)</python>Then look up. <search>Eiffel tower height</search>"
              "So \\boxed{42}")
    out, picker, search, _ = scripted_run(agent, monkeypatch, script)
    assert out.text == ("First compute. <python>print(6*7)</python> <result> 42 </result>Then look up. "
                        "<search>Eiffel tower height</search> <result> [1] About Eiffel tower height\n"
                        "https://example.org/x\n324 metres tall. </result>So \\boxed{42}")
    assert search.queries == ["Eiffel tower height"]
    assert [c["kind"] for c in out.tool_calls] == ["python", "search"]
    assert [c["input"] for c in out.tool_calls] == ["print(6*7)", "Eiffel tower height"]
    assert out.tool_calls[0]["result"] == "42" and all(c["ok"] for c in out.tool_calls)
    assert all(c["seconds"] >= 0 for c in out.tool_calls) and out.tool_calls[0]["seconds"] > 0
    assert out.num_tokens == len(picker.ids) + 1  # every scripted token plus EOS; results are not counted


def test_continuation_reuses_the_kv_cache(agent, monkeypatch):
    fed = {"embeds": 0, "ids": []}
    forward = agent.model.forward

    def counting_forward(*args, **kw):
        if kw.get("inputs_embeds") is not None:
            fed["embeds"] += kw["inputs_embeds"].shape[1]
        else:
            fed["ids"] += kw["input_ids"][0].tolist()
        return forward(*args, **kw)

    monkeypatch.setattr(agent.model, "forward", counting_forward)
    script = "a <search>one</search>b <search>two</search>done"
    out, picker, _, (e, mask) = scripted_run(agent, monkeypatch, script)
    monkeypatch.setattr(agent.model, "forward", forward)
    result_ids = sum((agent.tokenizer(f" <result> {c['result']} </result>", add_special_tokens=False).input_ids
                      for c in out.tool_calls), [])
    assert len(out.tool_calls) == 2
    # One prefill of the prompt, then only new tokens: generated (EOS is never fed) plus the results.
    assert fed["embeds"] == e.shape[1]
    assert len(fed["ids"]) == (out.num_tokens - 1) + len(result_ids)
    # The cached continuation sees the same logits as one full forward over the whole sequence.
    full = torch.cat([e[0], agent._embed_ids(fed["ids"])])[None]
    with torch.no_grad():
        ref = agent.model(inputs_embeds=full, attention_mask=torch.ones(1, full.shape[1], dtype=torch.long)).logits
    assert torch.allclose(picker.logits[-1][0], ref[0, -1], atol=1e-4)


def test_round_limit_adds_a_visible_note_and_stops(agent, monkeypatch):
    script = "<search>q1</search><search>q2</search><search>q3</search> never shown"
    out, _, search, _ = scripted_run(agent, monkeypatch, script, max_tool_rounds=2)
    assert search.queries == ["q1", "q2"] and len(out.tool_calls) == 2
    assert out.text.endswith("<search>q3</search>" + LIMIT_NOTE) and "never shown" not in out.text


def test_token_budget_counts_all_continuations(agent, monkeypatch):
    call = "<search>q</search>"
    out, _, search, _ = scripted_run(agent, monkeypatch, call + "0123456789" * 5, max_new_tokens=len(call) + 7)
    assert search.queries == ["q"] and out.num_tokens == len(call) + 7
    assert out.text.endswith("</result>0123456")


def test_unmatched_closing_tag_is_skipped_and_decoding_continues(agent, monkeypatch):
    out, _, search, _ = scripted_run(agent, monkeypatch, "oops </python> then <search>ok</search>end")
    assert search.queries == ["ok"] and [c["input"] for c in out.tool_calls] == ["ok"]
    assert out.text.startswith("oops </python> then <search>ok</search> <result>") and out.text.endswith("end")


def test_text_after_the_tag_in_the_same_token_is_cut():
    class StubTok:
        def __call__(self, text, **kw):
            return type("Enc", (), {"input_ids": [ord(c) for c in text]})

    class StubAgent:
        tokenizer = StubTok()
        pieces = {1: "<search>q", 2: "</search", 3: ">\nmore", 4: "</search>"}

        def detokenize(self, toks):
            return "".join(self.pieces[t] for t in toks)

    text, tail = _cut_after_tag(StubAgent(), [1, 2, 3], "<search>q</search>\nmore")
    assert text == "<search>q</search>" and tail == [ord(">")]
    assert _cut_after_tag(StubAgent(), [1, 4], "<search>q</search>") == ("<search>q</search>", None)


def test_bad_tool_settings_are_rejected():
    from recmas_ray.config.checks import check_tree

    with pytest.raises(ValueError, match="max_tool_rounds"):
        check_tree(ToolLoopConfig(max_tool_rounds=-1))
    with pytest.raises(ValueError, match="python_timeout"):
        check_tree(ToolLoopConfig(python_timeout_s=0))
    with pytest.raises(ValueError, match="not a file"):
        Toolbox(ToolLoopConfig(tavily_keys_file="/nonexistent/keys.txt"))


# ------------------------------------------------------------------------------------------ jobs/run.py end to end
KEY_FILE_KEY = "tv" "ly-FILEKEY-0123456789abcdef"
ENV_KEY = "tv" "ly-ENVKEY-fedcba9876543210"
RUN_SCRIPT = ("<search>who wrote hamlet</search>"
              "<python>import os\nprint(os.environ.get('TAVILY_API_KEY'))\nprint(sorted(os.environ))\n"
              "print(open(KEYS).read())</python>So \\boxed{3}")

class LeakyBackend:
    """Fake Tavily: rejects the file key with an error quoting it, answers with the env key and echoes it back."""

    calls: list[str] = []

    def __init__(self, **kw):
        pass

    def search(self, query, *, api_key, max_results):
        LeakyBackend.calls.append("file" if api_key == KEY_FILE_KEY else "env" if api_key == ENV_KEY else "?")
        if api_key == KEY_FILE_KEY:
            raise SearchKeyError(f"rate limit for key {api_key}")
        return [{"title": "Hamlet", "url": "https://example.org/" + api_key, "content": f"Shakespeare {api_key}"}]


def load_run_job():
    from jobs import run

    return run


@pytest.mark.sandbox
def test_keys_never_leak_from_a_full_run(tmp_path, tiny_cache, monkeypatch, capfd, caplog):
    caplog.set_level(logging.DEBUG)
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# tavily keys\n{KEY_FILE_KEY}\n")
    keys.chmod(0o600)
    monkeypatch.setenv("TAVILY_API_KEY", ENV_KEY)
    monkeypatch.setattr(search_mod, "TavilyBackend", LeakyBackend)
    monkeypatch.setattr(LeakyBackend, "calls", [])
    tok = load_frozen_model("tiny:llama", dtype=torch.float32)[1]
    monkeypatch.setattr(agent_mod, "_pick", ScriptedPicker(tok, RUN_SCRIPT.replace("KEYS", repr(str(keys)))))
    qfile = write_jsonl(tmp_path / "q.jsonl", [{"question": "How many witches are in Macbeth?", "answer": "3"}])
    out = tmp_path / "out"
    assert load_run_job().main([
        "--style", "deliberation", "--preset", "tiny", "--dataset", str(qfile), "--backend", "local",
        "--num_recursive_rounds", "1", "--latent_steps", "2", "--max_new_tokens", "400", "--no_progress",
        "--output_path", str(out), "--tavily_keys_file", str(keys), "--python_timeout", "5"]) == 0
    assert LeakyBackend.calls == ["file", "env"]  # both keys really were loaded and used
    std = capfd.readouterr()
    written = {p: p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()}
    assert any(p.name.startswith("samples_") for p in written) and any(p.name.startswith("results_") for p in written)
    assert "rotating to the next key" in caplog.text  # the key error was logged, redacted
    for secret in (KEY_FILE_KEY, ENV_KEY):
        assert secret not in std.out and secret not in std.err and secret not in caplog.text
        assert not [p for p, text in written.items() if secret in text]
    sample = json.loads(next(p for p in written if p.name.startswith("samples_") and p.suffix == ".jsonl")
                        .read_text().splitlines()[0])
    calls = sample["trace"][-1]["tool_calls"]
    assert [c["kind"] for c in calls] == ["search", "python"]
    assert "Shakespeare [REDACTED]" in calls[0]["result"] and calls[0]["ok"]
    lines = calls[1]["result"].split("\n")
    assert lines[0] == "None" and "TAVILY_API_KEY" not in lines[1] and not calls[1]["ok"]  # key file unreadable
    assert "[REDACTED]" in sample["prediction"] and sample["prediction"].endswith("\\boxed{3}")


def test_run_job_offline_reports_search_unavailable(tmp_path, tiny_cache, monkeypatch, capsys):
    run_job = load_run_job()
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    tok = load_frozen_model("tiny:llama", dtype=torch.float32)[1]
    monkeypatch.setattr(agent_mod, "_pick", ScriptedPicker(tok, "<search>capital of France</search>\\boxed{Paris}"))
    qfile = write_jsonl(tmp_path / "q.jsonl", [{"question": "Capital of France?", "answer": "Paris"}])
    out = tmp_path / "out"
    assert run_job.main(["--style", "deliberation", "--preset", "tiny", "--dataset", str(qfile), "--backend", "local",
                         "--num_recursive_rounds", "1", "--latent_steps", "2", "--max_new_tokens", "200",
                         "--no_progress", "--output_path", str(out), "--max_tool_rounds", "3"]) == 0
    sample = json.loads(open(glob.glob(f"{out}/samples_*.jsonl")[0]).readline())
    (call,) = sample["trace"][-1]["tool_calls"]
    assert call["kind"] == "search" and not call["ok"] and call["result"].startswith("search unavailable")
    assert "<result> search unavailable" in sample["prediction"] and sample["prediction"].endswith("\\boxed{Paris}")
    results = json.load(open(glob.glob(f"{out}/results_*.json")[0]))
    assert results["config"]["tools"]["max_tool_rounds"] == 3
    capsys.readouterr()


def test_tool_flags_are_refused_outside_deliberation(tiny_cache):
    from recmas_ray.system.plan import plan_system

    with pytest.raises(ValueError, match=r"style with tools \(deliberation\) only"):
        plan_system("sequential_light", preset="tiny", tools=ToolLoopConfig())
    plan = plan_system("deliberation", preset="tiny", tools=ToolLoopConfig(max_tool_rounds=2))
    assert plan.specs["toolcaller"].tools.max_tool_rounds == 2 and plan.specs["reflector"].tools is None
