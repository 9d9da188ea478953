"""Links from the Hub: ids parsed, one role's folder fetched from a Hub-layout cache offline, clear errors."""

import json

import pytest

from recmas_ray.system.hub import HubRef, links_overrides, looks_like_hub_id, parse_hub_id, resolve_folder

SHA = "0123456789abcdef0123456789abcdef01234567"


def test_parse_hub_ids(tmp_path):
    assert parse_hub_id("org/links") == HubRef("org/links")
    assert parse_hub_id("org/links@v1.2:sequential/planner") == HubRef("org/links", "v1.2", "sequential/planner")
    assert parse_hub_id("org/links:outer") == HubRef("org/links", None, "outer")
    for text in ("/abs/dir", "./rel", "a/b/c", "../x/y", "plain", "org/name:", "~/x"):
        assert parse_hub_id(text) is None, text
    assert not looks_like_hub_id(str(tmp_path))  # an existing path is never a Hub id
    assert str(HubRef("org/links", "v1", "outer")) == "org/links@v1:outer"


def _hub_cache(root, *, role_dirs=("planner", "outer")):
    """A cache laid out as huggingface_hub writes it: models--org--name/{refs/main, snapshots/<sha>/...}."""
    repo = root / "models--org--links"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SHA)
    for d in role_dirs:
        folder = repo / "snapshots" / SHA / d
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"role": d}))
    return root


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = _hub_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_role_folders_resolve_offline_from_the_cache(hub_cache):
    path = resolve_folder("org/links:planner")
    assert path.endswith(f"snapshots/{SHA}/planner") and json.load(open(f"{path}/manifest.json"))["role"] == "planner"
    found = links_overrides("org/links", ["planner", "critic", "solver"])
    assert sorted(found) == ["outer", "planner"] and found["outer"].endswith("/outer")


def test_missing_ids_fail_with_one_line_naming_them(hub_cache, tmp_path):
    with pytest.raises(ValueError, match="'org/absent:planner'.*Hub repo org/absent") as e:
        resolve_folder("org/absent:planner", what="--ckpt_override planner")
    assert "\n" not in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)
    with pytest.raises(ValueError, match="no files under critic"):
        resolve_folder("org/links:critic")
    with pytest.raises(ValueError, match="revision v9"):
        resolve_folder("org/links@v9:planner")
    with pytest.raises(ValueError, match="no such directory"):
        resolve_folder(str(tmp_path / "missing" / "dir" / "x"))


def test_jobs_run_accepts_hub_ids_and_rejects_missing_dirs(hub_cache, tmp_path, question_file, capsys):
    from jobs import run as run_job

    base = ["--style", "sequential_light", "--dataset", str(question_file), "--backend", "local",
            "--output_path", str(tmp_path / "o"), "--print_config"]
    assert run_job.main(base + ["--ckpt_override", "planner=org/links:planner"]) == 0
    assert run_job.main(base + ["--ckpt_override", f"planner={tmp_path}/nope/planner"]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_hub_links_load_into_a_system(tiny_cache, tmp_path, monkeypatch):
    """Links trained here, published in a Hub-layout cache, loaded by System.build(links=<hub id>)."""
    import shutil

    import recmas_ray as rm
    from recmas_ray.system.checkpoints import save_links
    from recmas_ray.system.plan import plan_system

    plan = plan_system("sequential_light", preset="tiny", seed=7)
    cache = _hub_cache(tmp_path / "hub", role_dirs=())
    snap = cache / "models--org--links" / "snapshots" / SHA
    save_links(snap / "planner", type(plan.links)(inner={"planner": plan.links.inner["planner"]}),
               {"roles": {"planner": {"base_model": "tiny:qwen3"}}})
    save_links(snap / "outer", type(plan.links)(outer=dict(plan.links.outer)), {})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with rm.System.build("sequential_light", links="org/links", backend="local", seed=1) as system:
        sources = system.manifest()["sources"]
        assert sources["inner:planner"].endswith("/planner") and sources["inner:critic"] == "init(seed=1)"
        assert all(v.endswith("/outer") for k, v in sources.items() if k.startswith("outer:"))
        assert system.generate(["1+1?"], num_recursive_rounds=1, latent_steps=2, max_new_tokens=2)[0][0].trace
    shutil.rmtree(cache)


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
