"""Tests of the web search tool with a fake backend (no network): rotation, unavailability, and no key leaks."""
from __future__ import annotations

import base64
import json
import logging
import sys

import pytest

from recmas_ray.sandbox import SandboxConfig
from recmas_ray.tools import (
    SearchConfig,
    SearchKeyError,
    SearchUnavailableError,
    TavilyBackend,
    WebSearchTool,
    format_results,
    load_keys,
    redact,
    run_python_tool,
)

RESULTS = [{"title": "Water", "url": "https://example.org/water", "content": "Boils at 100 C. " * 40},
           {"title": "Ice", "url": "https://example.org/ice", "content": "Melts at 0 C."}]


class FakeBackend:
    """Per-key scripted behaviour: an exception to raise or a result list; records the keys it was called with."""

    def __init__(self, behaviour: dict):
        self.behaviour = behaviour
        self.calls: list[str] = []

    def search(self, query: str, *, api_key: str, max_results: int) -> list[dict]:
        self.calls.append(api_key)
        outcome = self.behaviour[api_key]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome[:max_results]


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)


def test_results_are_formatted_like_the_reference() -> None:
    text = format_results(RESULTS, 320)
    first, second = text.split("\n\n[2] ")
    assert first.startswith("[1] Water\nhttps://example.org/water\nBoils at 100 C.")
    assert len(first.split("\n", 2)[2]) == 320
    assert second == "Ice\nhttps://example.org/ice\nMelts at 0 C."
    assert format_results([]) == "no results"


def test_rotates_to_next_key_on_rate_limit() -> None:
    backend = FakeBackend({"key-a": SearchKeyError("rate limit or quota exceeded"), "key-b": RESULTS})
    tool = WebSearchTool(["key-a", "key-b"], backend)
    out = tool("boiling point")
    assert out.ok and out.text.startswith("[1] Water") and backend.calls == ["key-a", "key-b"]
    assert tool("again").ok and backend.calls == ["key-a", "key-b", "key-b"], "stays on the working key"


def test_rejected_key_is_skipped_for_good() -> None:
    backend = FakeBackend({"key-a": SearchKeyError("key rejected", permanent=True), "key-b": RESULTS})
    tool = WebSearchTool(["key-a", "key-b"], backend)
    assert tool("q1").ok and tool("q2").ok
    backend.behaviour["key-b"] = SearchKeyError("rate limit")
    out = tool("q3")
    assert not out.ok and out.text.startswith("search unavailable: all 1 API keys failed")
    assert backend.calls == ["key-a", "key-b", "key-b", "key-b"]


def test_unavailable_without_keys_network_or_package(monkeypatch: pytest.MonkeyPatch) -> None:
    out = WebSearchTool([], FakeBackend({}))("q")
    assert not out.ok and out.text.startswith("search unavailable: no Tavily API key")

    backend = FakeBackend({"key-a": ConnectionError("Name or service not known")})
    tool = WebSearchTool(["key-a"], backend)
    assert tool("q").text.startswith("search unavailable: network error")
    assert tool("q").text.startswith("search unavailable") and backend.calls == ["key-a"], "cool-down: no retry"

    monkeypatch.setitem(sys.modules, "tavily", None)  # import tavily -> ImportError, before any network use
    out = WebSearchTool(["key-a"], TavilyBackend())("q")
    assert not out.ok and "tavily-python is not installed" in out.text


def test_backend_bugs_do_not_raise() -> None:
    out = WebSearchTool(["key-a"], FakeBackend({"key-a": KeyError("results")}))("q")
    assert not out.ok and out.text.startswith("search error: KeyError")
    assert not WebSearchTool(["key-a"], FakeBackend({}))("   ").ok


def test_load_keys(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# team keys\n\nkey-one\n  key-two  \nkey-one\n")
    keys_file.chmod(0o644)
    with pytest.raises(ValueError, match=f"readable by group or others .*chmod 600 {keys_file}"):
        load_keys(str(keys_file))
    keys_file.chmod(0o600)
    monkeypatch.setenv("TAVILY_API_KEY", "key-env")
    assert load_keys(str(keys_file)) == ["key-one", "key-two", "key-env"]
    assert load_keys(None) == ["key-env"]
    with pytest.raises(ValueError, match="not a file"):
        load_keys(str(tmp_path / "missing.txt"))


def test_redact() -> None:
    assert redact("a key-long and key", ["key", "key-long", ""]) == "a [REDACTED] and [REDACTED]"


def leaked_forms(text: str, key: str) -> list[str]:
    """Forms of ``key`` found in ``text`` once all whitespace is gone (computed independently of ``redact``)."""
    flat = "".join(text.split()).lower()
    forms = {"plain": key, "reversed": key[::-1], "hex": key.encode().hex(), "hex reversed": key[::-1].encode().hex()}
    for name, value in (("b64", key), ("b64 reversed", key[::-1])):
        enc = base64.b64encode(value.encode()).decode().rstrip("=")
        forms[name] = enc[:-2]  # the last characters depend on what follows the key
    return [name for name, form in forms.items() if form.lower() in flat]


ADVERSARIAL_PRINTS = ("import base64\nk = KEY\nprint(k[::-1])\nprint(base64.b64encode(k.encode()).decode())\n"
                      "print(base64.b64encode((k + '\\n').encode()).decode())\nprint(k.encode().hex())\n"
                      "print('\\n'.join(k[i:i + 3] for i in range(0, len(k), 3)))\nprint(' '.join(k))\n"
                      "print(base64.b64encode(k[::-1].encode()).decode())\n")


@pytest.mark.sandbox
def test_adversarial_key_leak_variants_are_redacted(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from recmas_ray.config.recursion import ToolLoopConfig
    from recmas_ray.tools.loop import Toolbox

    key, env_key = "tv" "ly-ADVERSARY-9f8e7d6c5b4a", "tv" "ly-ENVADV-0123abcd4567"
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(key + "\n")
    keys_file.chmod(0o600)
    monkeypatch.setenv("TAVILY_API_KEY", env_key)
    caplog.set_level(logging.DEBUG)

    class EchoBackend:  # a hostile search service that echoes the key in every disguise
        def search(self, query, *, api_key, max_results):
            import subprocess
            text = subprocess.run([sys.executable, "-c", ADVERSARIAL_PRINTS.replace("KEY", repr(api_key))],
                                  capture_output=True, text=True).stdout
            return [{"title": api_key[::-1], "url": "u", "content": text}]

    box = Toolbox(ToolLoopConfig(tavily_keys_file=str(keys_file), python_timeout_s=5, result_max_chars=4000),
                  search_backend=EchoBackend())
    outputs = [box("search", "q").text]
    for k in (key, env_key):  # model code that knows the key prints it disguised
        outputs.append(box("python", ADVERSARIAL_PRINTS.replace("KEY", repr(k))).text)
    env = box("python", "import os, json\nprint(json.dumps(dict(os.environ)))\n"
                        "print(open('/proc/self/environ').read())\nprint(open('/proc/1/environ').read())").text
    record = json.dumps({"tool_calls": [{"input": redact(ADVERSARIAL_PRINTS.replace("KEY", repr(key)), box._keys),
                                         "result": o} for o in outputs]})
    samples = tmp_path / "samples_test.jsonl"
    samples.write_text(record + "\n")
    assert outputs[1].count("[REDACTED]") >= 7, outputs[1]  # every disguise was seen and replaced
    for k in (key, env_key):
        for where, text in {"outputs": "\n".join(outputs), "child env": env, "logs": caplog.text,
                            "samples": samples.read_text()}.items():
            assert leaked_forms(text, k) == [], (where, k)


@pytest.mark.sandbox
def test_key_never_leaks(tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                         capsys: pytest.CaptureFixture) -> None:
    canary_a, canary_b = "tv" "ly-CANARY-aaaa-1111", "tv" "ly-CANARY-bbbb-2222"
    keys_file = tmp_path / "tavily_keys.txt"
    keys_file.write_text(f"{canary_a}\n{canary_b}\n")
    keys_file.chmod(0o600)
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    # Hostile backend: every failure message quotes the key it was given.
    backend = FakeBackend({canary_a: SearchKeyError(f"429 for key {canary_a}"),
                           canary_b: [{"title": f"echo {canary_b}", "url": "u", "content": canary_b}]})
    tool = WebSearchTool.from_config(SearchConfig(keys_file=str(keys_file)), backend)
    texts += [tool("q").text, repr(tool), str(tool), repr(vars(tool))]
    backend.behaviour[canary_b] = RuntimeError(f"crash with {canary_b}")
    texts.append(tool("q").text)
    backend.behaviour[canary_b] = SearchUnavailableError(f"offline, key {canary_b}")
    texts.append(tool("q").text)
    for exc in (SearchKeyError(f"bad {canary_a}", permanent=True), OSError(f"dns {canary_a}")):
        texts.append(WebSearchTool([canary_a], FakeBackend({canary_a: exc}))("q").text)
    # The Python tool's child sees neither the environment key nor (when denied) the keys file.
    monkeypatch.setenv("TAVILY_API_KEY", canary_a)
    cfg = SandboxConfig(timeout_s=5, deny_read_paths=(str(keys_file),))
    texts.append(run_python_tool(f"import os\nprint(os.environ)\nprint(open({str(keys_file)!r}).read())",
                                 config=cfg).text)
    captured = capsys.readouterr()
    everything = "\n".join(texts + [caplog.text, captured.out, captured.err]
                           + [r.getMessage() for r in caplog.records])
    assert "[REDACTED]" in everything and "search unavailable" in everything, "the checks above must have run"
    assert canary_a not in everything and canary_b not in everything


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-x"]))
