"""Bad inputs to the Python API, as data: each call raises ValueError (TypeError for a wrong type)
naming the argument, before any model loads, any file is written or Ray starts."""

from __future__ import annotations

import os

import pytest

import recmas_ray as rm
from tests.conftest import snapshot

ROWS = [
    # (id, callable, kwargs, exception, fragment)
    ("build_role_model_number", "System.build", dict(role_models={"planner": 5}), TypeError, "planner=5"),
    ("build_role_model_missing", "System.build", dict(role_models={"planner": "./no/such/model"}), ValueError,
     "planner=./no/such/model"),
    ("build_local_replicas", "System.build", dict(backend="local", num_replicas=4), ValueError, "num_replicas"),
    ("build_device_cuda", "System.build", dict(backend="local", device="cuda"), ValueError, "cuda"),
    ("build_ckpt_number", "System.build", dict(ckpt_override={"planner": 3}), TypeError, "ckpt_override"),
    ("build_timeout_text", "System.build", dict(timeout_s="soon"), TypeError, "timeout_s 'soon'"),
    ("inner_rows_ints", "train_inner", dict(rows=[1, 2]), TypeError, "rows"),
    ("inner_rows_empty", "train_inner", dict(rows=[]), TypeError, "rows"),
    ("inner_lr_text", "train_inner", dict(rows="synthetic:4", lr="high"), TypeError, "lr 'high'"),
    ("inner_steps_zero", "train_inner", dict(rows="synthetic:4", max_steps=0), ValueError, "max_steps 0"),
    ("inner_save_dir_empty", "train_inner", dict(rows="synthetic:4", save_dir=""), TypeError, "save_dir"),
    ("inner_roles_string", "train_inner", dict(rows="synthetic:4", roles="planner"), TypeError, "roles"),
    ("inner_role_unknown", "train_inner", dict(rows="synthetic:4", roles=["judge"]), ValueError, "judge"),
    ("inner_use_gpu", "train_inner", dict(rows="synthetic:4", use_gpu=True), ValueError, "use_gpu"),
    ("inner_role_models_list", "train_inner", dict(rows="synthetic:4", role_models=["tiny:qwen3"]), TypeError,
     "role_models"),
    ("outer_use_gpu", "train_outer", dict(rows="synthetic:4", use_gpu=True), ValueError, "use_gpu"),
    ("outer_microbatches", "train_outer", dict(rows="synthetic:4", batch_size=1, num_microbatches=2), ValueError,
     "num_microbatches"),
]


@pytest.mark.parametrize("name,call,kwargs,exc,fragment", ROWS, ids=[r[0] for r in ROWS])
def test_api_bad_input(name, call, kwargs, exc, fragment, tmp_path, tiny_cache, nothing_heavy):
    import ray

    before, ray_before = snapshot(tmp_path), ray.is_initialized()
    out = tmp_path / "out"
    if call == "System.build":
        fn, args = rm.System.build, {"style": "sequential_light", **kwargs}
    else:
        fn = getattr(rm, call)
        args = {"style": "sequential_light", "save_dir": str(out), "num_workers": 0, **kwargs} if call == \
            "train_inner" else {"style": "sequential_light", "save_dir": str(out), **kwargs}
    with pytest.raises(exc) as info:
        fn(**args)
    assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert snapshot(tmp_path) == before and not os.path.exists(out)
    assert ray.is_initialized() == ray_before
