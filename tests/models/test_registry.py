"""The model-kind registry: every name finds its kind, and resolution, revisions, hidden sizes, memory estimates,
name checks and loading all answer through it, so a new kind is one entry in `KINDS`."""

import pytest
import torch

from recmas_ray.models import registry
from recmas_ray.models.registry import (GEMMA3_270M, HUB, PACKAGED, SIMULATED, SMOLLM2_135M, TINY, ModelKind,
                                        check_model_names, model_kind)

SIM = "sim:hidden=24,step_ms=0,token_ms=0,tokens=2"


def test_each_name_finds_its_kind_and_anything_else_is_a_hub_id_or_path():
    assert model_kind(TINY.name("qwen3")) is TINY and TINY.name("qwen3") == "tiny:qwen3"
    assert model_kind(SMOLLM2_135M) is PACKAGED and PACKAGED.key(SMOLLM2_135M) == "smollm2-135m-instruct"
    assert model_kind(SIM) is SIMULATED
    for name in ("Qwen/Qwen3-1.7B", "/models/llama", "./here", "tinyllama/x"):
        assert model_kind(name) is HUB
    assert registry.KINDS[-1] is HUB  # the fallback matches everything: it must come last


def test_packaged_names_are_the_packaged_models():
    from recmas_ray.models.packaged import PKG_MODELS

    assert {SMOLLM2_135M, GEMMA3_270M} <= set(PKG_MODELS)


def test_what_a_name_holds_is_read_without_loading_weights(tmp_path):
    from recmas_ray.models.loader import model_revision, resolve_model_path
    from recmas_ray.models.packaged import PKG_MODELS
    from recmas_ray.models.tiny import TINY_FAMILIES, ensure_tiny_model
    from recmas_ray.system.memory import model_shape
    from recmas_ray.system.plan import model_hidden_size

    tiny = TINY.name("llama")
    assert resolve_model_path(tiny) == str(ensure_tiny_model("llama"))
    assert model_hidden_size(tiny) == TINY_FAMILIES["llama"].hidden_size
    assert model_hidden_size(GEMMA3_270M) == PKG_MODELS[GEMMA3_270M].hidden_size  # the wheel is not converted
    assert model_hidden_size(SIM) == 24
    assert [model_revision(n) for n in (tiny, SMOLLM2_135M, SIM)] == [tiny, SMOLLM2_135M, SIM]
    assert model_revision(resolve_model_path(tiny)).startswith("config-sha256:")  # a local folder: its config
    assert model_shape(SIM).num_params == 0 and model_shape(tiny).num_params > 0
    with pytest.raises(ValueError, match="simulated"):
        resolve_model_path(SIM)
    with pytest.raises(ValueError, match="empty model name"):
        resolve_model_path("")


def test_name_checks_ask_each_kind(tmp_path):
    check_model_names("--role_model", {"planner": TINY.name("qwen3"), "critic": SMOLLM2_135M, "solver": SIM})
    with pytest.raises(ValueError, match=r"--role_model solver=sim:hidden=2,bogus=1: .*bogus"):
        check_model_names("--role_model", {"solver": "sim:hidden=2,bogus=1"})
    with pytest.raises(ValueError, match="--models critic=.*no such path"):
        check_model_names("--models", {"critic": str(tmp_path / "missing" / "model")})
    with pytest.raises(ValueError, match="planner=: is empty"):
        check_model_names("--models", {"planner": ""})


def test_a_kind_without_weights_is_served_by_its_stand_in():
    from recmas_ray.models.sim import SimulatedAgent
    from recmas_ray.engine.service import AgentService, AgentSpec

    service = AgentService(AgentSpec(role="solver", model_name=SIM, system_prompt="s"), {}, {})
    assert isinstance(service.agent, SimulatedAgent) and service.info()["hidden_size"] == 24


class _AliasKind(ModelKind):
    """A toy kind, `alias:<family>`: another spelling of the tiny models (what adding a kind takes)."""

    prefix = "alias:"
    offline = True
    hub_id = False
    random_weights = True

    def path(self, name):
        return TINY.path(TINY.name(self.key(name)))

    def revision(self, name):
        return name

    def name_problem(self, name):
        return None


def test_a_new_kind_is_one_entry(monkeypatch):
    from recmas_ray.models.loader import load_frozen_model, resolve_model_path
    from recmas_ray.models.tiny import TINY_FAMILIES
    from recmas_ray.system.plan import model_hidden_size

    alias = _AliasKind()
    monkeypatch.setattr(registry, "KINDS", (alias, *registry.KINDS))
    name = alias.name("qwen3")
    assert model_kind(name) is alias
    assert resolve_model_path(name) == resolve_model_path(TINY.name("qwen3"))
    assert model_hidden_size(name) == TINY_FAMILIES["qwen3"].hidden_size
    check_model_names("--role_model", {"planner": name})
    model, _ = load_frozen_model(name, dtype=torch.float32)
    assert model.config.hidden_size == TINY_FAMILIES["qwen3"].hidden_size
