"""`jobs.push_links`: a system folder is published with a model card and read back by `links=ORG/NAME`, offline.

The Hub's side of the upload is a stand-in API that files each uploaded folder into the local Hub cache exactly
as a download would (refs/<branch> -> snapshots/<commit>/...), so with `HF_HUB_OFFLINE=1` the project's own
loader (`system/hub.py` -> `snapshot_download`) reads the published repo back. Everything else is the real code.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from jobs import push_links as job
from recmas_ray.styles import get_style
from recmas_ray.system.checkpoints import load_links, save_links
from recmas_ray.system.link_init import init_links

ROLE_DIMS = {"planner": 64, "critic": 96, "solver": 128}  # the tiny preset's sequential_light system
ROLE_MODELS = {"planner": "tiny:qwen3", "critic": "tiny:llama", "solver": "tiny:gemma3"}


class FakeHubApi:
    """HfApi's three upload calls, writing into the local Hub cache layout that snapshot_download reads."""

    def __init__(self, cache: Path):
        self.cache, self.calls = cache, []

    def create_repo(self, repo_id, *, repo_type, private, exist_ok):
        self.calls.append(("create_repo", repo_id, private))

    def create_branch(self, repo_id, *, branch, repo_type, exist_ok):
        self.calls.append(("create_branch", repo_id, branch))

    def upload_folder(self, *, folder_path, repo_id, repo_type, revision, commit_message):
        self.calls.append(("upload_folder", repo_id, revision, sorted(os.listdir(folder_path))))
        repo = self.cache / f"models--{repo_id.replace('/', '--')}"
        commit = hashlib.sha1(f"{repo_id}:{revision}:{len(self.calls)}".encode()).hexdigest()
        shutil.copytree(folder_path, repo / "snapshots" / commit)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / (revision or "main")).write_text(commit)
        return f"https://hub.invalid/{repo_id}/commit/{commit}"


def _system_folder(root: Path) -> Path:
    """A system folder as training writes it: per-role inner links, outer/, configs, Ray run leftovers."""
    style = get_style("sequential_light")
    torch.manual_seed(0)
    links = init_links(style, ROLE_DIMS, seed=7)
    for module in [*links.inner.values(), *links.outer.values()]:  # trained-looking weights, not the seeded init
        for p in module.parameters():
            p.data.normal_()
    roles = {r: {"base_model": ROLE_MODELS[r], "hidden_size": d} for r, d in ROLE_DIMS.items()}
    for role, link in links.inner.items():
        one = type(links)(inner={role: link})
        save_links(root / role, one, {"kind": "inner", "role": role, "style": "sequential", "roles": {role: roles[role]},
                                      "loss_log": [[3, 0.98]], "step": 3,
                                      "train_config": {"lr": 5e-4, "save_dir": "/home/me/secret/path"}})
        (root / role / "optim-state.pt").write_bytes(b"not for publishing")
    save_links(root / "outer", type(links)(outer=links.outer),
               {"kind": "outer", "style": "sequential_light", "roles": roles, "step": 3,
                "log": [{"step": 3, "loss": 1.25}], "train_config": {"lr": 1e-4, "storage_path": "/home/me/runs"}})
    (root / "outer" / "eval_curve.jsonl").write_text(json.dumps({"step": 3, "eval_loss": 1.5}) + "\n")
    (root / "_ray_runs").mkdir()
    return root


def test_push_links_round_trips_through_the_hub_layout(tmp_path, monkeypatch, tiny_cache):
    folder = _system_folder(tmp_path / "links")
    cache = tmp_path / "hub_cache"
    api = FakeHubApi(cache)
    cfg = job.PushLinksConfig(folder=str(folder), repo="my-org/recmas-links", revision="v1", private=True,
                              allow_random_bases=True)
    out = job.push_links(cfg, api=api)

    assert [c[0] for c in api.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert api.calls[0] == ("create_repo", "my-org/recmas-links", True)
    assert out["commit"].endswith((cache / "models--my-org--recmas-links" / "refs" / "v1").read_text())
    # only link files, manifests and curves go up: no optimizer state, no Ray run folders
    assert "critic/optim-state.pt" not in out["files"] and not any(f.startswith("_ray_runs") for f in out["files"])
    assert {"README.md", "outer/links.safetensors", "outer/eval_curve.jsonl", "planner/manifest.json"} <= set(out["files"])

    card = (next((cache / "models--my-org--recmas-links" / "snapshots").iterdir()) / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: recmas_ray\n")
    for text in ("tiny:qwen3", "tiny:llama", "tiny:gemma3", "planner->critic", "held-out loss 1.5",
                 "train loss 1.25", "System.build('sequential_light', links='my-org/recmas-links',",
                 "role_models={'critic': 'tiny:llama', 'planner': 'tiny:qwen3', 'solver': 'tiny:gemma3'})"):
        assert text in card, text
    assert "/home/me" not in card  # the trainer's paths stay home

    # read back with the project's own loader, offline, from the cache the upload filled
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    from recmas_ray import System

    system = System.build("sequential_light", links="my-org/recmas-links@v1", preset="tiny", backend="local")
    try:
        for role in ROLE_DIMS:
            want = load_links(folder / role).inner[role].state_dict()
            got = system.agents.services[role].agent.inner_link.state_dict()
            assert all(torch.equal(got[k].float().cpu(), want[k]) for k in want), role
        want_outer = load_links(folder / "outer").outer
        for edge, link in want_outer.items():
            src = edge.split("->")[0]
            got = system.agents.services[src].agent.outer_links[edge].state_dict()
            assert all(torch.equal(got[k].float().cpu(), v) for k, v in link.state_dict().items()), edge
    finally:
        system.close()


def test_dry_run_stages_the_card_and_uploads_nothing(tmp_path):
    folder = _system_folder(tmp_path / "links")
    staging = tmp_path / "staged"
    api = FakeHubApi(tmp_path / "cache")
    out = job.push_links(job.PushLinksConfig(folder=str(folder), repo="org/name", dry_run=True,
                                             staging_dir=str(staging), allow_random_bases=True), api=api)
    assert api.calls == [] and out["commit"] is None
    assert (staging / "README.md").is_file() and (staging / "solver" / "links.safetensors").is_file()


def _bad_rows(tmp):
    good = _system_folder(tmp / "good")
    (tmp / "empty").mkdir()
    (tmp / "not_ours" / "planner").mkdir(parents=True)
    (tmp / "not_ours" / "planner" / "manifest.json").write_text("[1, 2]")
    (tmp / "not_ours" / "planner" / "links.safetensors").write_bytes(b"x")
    fifo_root = tmp / "fifo" / "planner"
    fifo_root.mkdir(parents=True)
    (fifo_root / "links.safetensors").write_bytes(b"x")
    os.mkfifo(fifo_root / "manifest.json")
    (tmp / "staged_exists").mkdir()
    no_outer = _system_folder(tmp / "no_outer")
    shutil.rmtree(no_outer / "outer")
    ok = ["--allow_random_bases"]
    return [
        ("no_repo_shape", [str(good), "--repo", "just-a-name"], "--repo 'just-a-name': expected a Hub repo id"),
        ("repo_with_subfolder", [str(good), "--repo", "org/name:planner"], "the branch goes in --revision"),
        ("missing_folder", [str(tmp / "nope"), "--repo", "org/name"], "not a directory"),
        ("empty_folder", [str(tmp / "empty"), "--repo", "org/name"], "no link folder in it"),
        ("foreign_manifest", [str(tmp / "not_ours"), "--repo", "org/name"], "not a recmas_ray link manifest"),
        ("fifo_manifest", [str(tmp / "fifo"), "--repo", "org/name"], "not a regular file"),
        ("empty_revision", [str(good), "--repo", "org/name", "--revision", " "], "--revision"),
        ("staging_exists", [str(good), "--repo", "org/name", "--staging_dir", str(tmp / "staged_exists")],
         "expected a path that does not exist yet"),
        ("no_outer", [str(no_outer), "--repo", "org/name", *ok], "but not ['outer'] of style sequential"),
        ("random_bases", [str(good), "--repo", "org/name"], "random-weight test models ['tiny:gemma3', 'tiny:llama', "
                                                            "'tiny:qwen3']"),
    ]


@pytest.mark.parametrize("row", range(10))
def test_bad_input_is_one_line_before_anything_is_written(row, tmp_path, capsys, monkeypatch):
    name, argv, fragment = _bad_rows(tmp_path)[row]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    monkeypatch.setattr("huggingface_hub.HfApi", lambda *a, **k: pytest.fail(f"{name}: an upload was attempted"))
    assert job.main(argv) == 2, name
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], (name, err)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before, f"{name}: files were written"


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
