"""Untrusted checkpoint folders: the file opened is the file checked (a symlink swapped in after the
containment check is refused), FIFOs never block, NaN/Inf weights and malformed config JSON are one line."""

from __future__ import annotations

import json
import os

import pytest
import torch

from recmas_ray.system.checkpoints import MANIFEST, WEIGHTS, LinkSet, contained, load_links, read_json, save_links
from recmas_ray.system.link_init import seeded_inner_link
from recmas_ray.system.untrusted import opened_inside


def test_symlink_swapped_in_after_the_check_is_refused(tmp_path):
    folder, outside = tmp_path / "ckpt", tmp_path / "secret.json"
    folder.mkdir()
    outside.write_text(json.dumps({"secret": 1}))
    (folder / "adapter_config.json").write_text(json.dumps({"hidden_size": 64}))
    checked = contained(folder, "adapter_config.json", what="t")  # passes: a regular file inside
    (folder / "adapter_config.json").unlink()
    os.symlink(outside, folder / "adapter_config.json")  # the race: swapped after the check
    with pytest.raises(ValueError, match="outside the checkpoint folder"):
        read_json(checked, folder)


def test_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match="is a FIFO"):
        with opened_inside(tmp_path, tmp_path / "pipe", what="t"):
            pass


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused(tmp_path, value):
    link = seeded_inner_link(8, seed=0, role="planner")
    with torch.no_grad():
        link.proj1.bias[3] = value
    save_links(tmp_path, LinkSet(inner={"planner": link}), {"kind": "inner"})
    with pytest.raises(ValueError, match="NaN/Inf"):
        load_links(tmp_path)
    rel = tmp_path / "release"
    rel.mkdir()
    torch.save(link.state_dict(), rel / "adapter.pt")
    with pytest.raises(ValueError, match="NaN/Inf"):
        load_links(rel, role="planner")


MALFORMED = [
    ("innerlink_config.json", {"tasks": {"math": 5}}),
    ("innerlink_config.json", {"tasks": {"math": {"adapter.pt": 7}}}),
    ("innerlink_config.json", {"tasks": []}),
    ("adapter_config.json", {"hidden_size": [64]}),
    ("adapter_config.json", {"adapter_type": {"x": 1}}),
    ("outerlink_config.json", {"adapters": [{"filename": 3}]}),
    ("outerlink_config.json", {"adapters": [5]}),
    ("outerlink_config.json", {"adapters": {"a": 1}}),
    ("outerlink_config.json", {"tasks": {"math": []}}),
    ("outerlink_config.json", {"adapters": [{"legacy_key": "outer_12", "filename": "outer_12.pt", "in_dim": [1],
                                             "out_dim": 2}]}),
]


@pytest.mark.parametrize("name,content", MALFORMED, ids=[f"{n}:{json.dumps(c)}" for n, c in MALFORMED])
def test_wrong_json_types_in_release_configs_are_one_line(tmp_path, name, content):
    from recmas_ray.system.link_init import seeded_outer_link

    torch.save(seeded_inner_link(8, seed=0, role="planner").state_dict(), tmp_path / "adapter.pt") \
        if name != "outerlink_config.json" else \
        torch.save(seeded_outer_link(8, 8, seed=0, edge="planner->critic").state_dict(), tmp_path / "outer_12.pt")
    (tmp_path / name).write_text(json.dumps(content))
    with pytest.raises(ValueError) as info:
        load_links(tmp_path, role="planner")
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("manifest", [{"roles": [1]}, {"roles": {"planner": 3}}, {"roles": {"planner":
                                                                                          {"base_model": 5}}}])
def test_wrong_json_types_in_our_manifest_are_one_line(tmp_path, manifest):
    from recmas_ray.system.checkpoints import declared_base_model

    save_links(tmp_path, LinkSet(inner={"planner": seeded_inner_link(8, seed=0, role="planner")}), {})
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    assert (tmp_path / WEIGHTS).exists()
    with pytest.raises(ValueError, match="malformed configuration JSON"):
        declared_base_model(tmp_path, "planner")
