"""Agents larger than one GPU: the device-map plan (pure, fake device lists) and where links go.

The CUDA path (`load_frozen_model(..., num_devices=K)` on K real GPUs) needs GPUs; these tests
check the plan it uses, on CPU, for K = 2 and 4.
"""

import pytest
import torch

from recmas_ray.models.loader import device_map_for, output_device, plan_device_map, resolve_model_path


@pytest.mark.parametrize("num_layers,k", [(2, 2), (6, 2), (4, 4), (10, 4), (7, 4)])
def test_plan_balances_contiguous_layers_over_exactly_the_devices(num_layers, k):
    devices = [f"cuda:{i}" for i in range(k)]
    dmap = plan_device_map(num_layers, devices)
    layers = [dmap[f"model.layers.{i}"] for i in range(num_layers)]
    assert set(layers) == set(devices)  # every device used, nothing else
    counts = [layers.count(d) for d in devices]
    assert max(counts) - min(counts) <= 1  # balanced
    assert layers == sorted(layers, key=devices.index)  # contiguous runs, in device order
    assert dmap["model.embed_tokens"] == devices[0]
    assert dmap["model.norm"] == dmap["lm_head"] == devices[-1]  # links go with the last layer


def test_plan_refuses_more_devices_than_layers():
    with pytest.raises(ValueError, match="2 layers cannot be split over 4 devices"):
        plan_device_map(2, ["cuda:0", "cuda:1", "cuda:2", "cuda:3"])


@pytest.mark.parametrize("family", ["qwen3", "llama", "gemma3", "mistral"])
@pytest.mark.parametrize("k", [2, 4])
def test_family_module_names_cover_the_whole_model(tiny_cache, family, k):
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model_path(f"tiny:{family}"))
    text = config.get_text_config()
    text.num_hidden_layers = 4  # room for K = 4
    if getattr(text, "layer_types", None):  # per-layer attention kinds (Qwen3, Gemma3) follow the count
        text.layer_types = (list(text.layer_types) * 4)[:4]
    devices = [f"cuda:{i}" for i in range(k)]
    dmap = device_map_for(config, devices)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    # every parameter belongs to exactly one mapped module (what from_pretrained(device_map=) requires)
    for name, _ in model.named_parameters():
        owners = [m for m in dmap if name == m or name.startswith(m + ".")]
        assert len(owners) == 1, (name, owners)
    assert set(dmap.values()) == set(devices)


def test_output_device_is_the_last_layers_device():
    class Fake(torch.nn.Module):
        def __init__(self, dmap):
            super().__init__()
            self.w = torch.nn.Linear(1, 1)
            self.hf_device_map = dmap

    assert output_device(Fake({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": 1})) \
        == torch.device("cuda:1")
    assert output_device(Fake({"": "cpu"})) == torch.device("cpu")  # one device: where the weights are


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-x"]))


@pytest.mark.parametrize("k", [2, 4])
def test_multimodal_gemma3_maps_vision_tower_and_projector(k):
    """gemma-3-4b-it (the paper preset's planner) is Gemma3ForConditionalGeneration: its vision tower and
    projector sit beside the language model, off the path to the layer list; all must be mapped."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, Gemma3Config

    config = Gemma3Config(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=300,
                         layer_types=["sliding_attention"] * 3 + ["full_attention"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=28, patch_size=14), mm_tokens_per_image=4)
    devices = [f"cuda:{i}" for i in range(k)]
    dmap = device_map_for(config, devices)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    for name, _ in model.named_parameters():
        owners = [m for m in dmap if name == m or name.startswith(m + ".")]
        assert len(owners) == 1, (name, owners)
    # the image path feeds the input embeddings: it sits with them; the LM head with the last layer
    assert dmap["model.vision_tower"] == dmap["model.multi_modal_projector"] == devices[0]
    assert dmap["lm_head"] == dmap["model.language_model.layers.3"] == devices[-1]
