"""Link provenance: training writes provenance.json beside its links, the files are re-hashed on use, and jobs
that take link folders refuse those of unknown origin (one line, exit 2, no model loaded) unless told."""

import pytest
import torch

from recmas_ray.engine.links import InnerLink
from recmas_ray.system.checkpoints import LinkSet, save_links
from recmas_ray.system.provenance import (PROVENANCE, file_hashes, link_origin, require_known_links,
                                          write_provenance)


def _links(path, role="planner", hidden=64):
    torch.manual_seed(0)
    manifest = {"kind": "inner", "base_model": "tiny:qwen3", "roles": {role: {"base_model": "tiny:qwen3",
                                                                              "hidden_size": hidden}}}
    return save_links(path, LinkSet(inner={role: InnerLink(hidden)}), manifest)


def test_written_provenance_is_known_until_a_file_changes(tmp_path):
    folder = _links(tmp_path / "planner")
    assert not link_origin(folder)["known"] and "no provenance.json" in link_origin(folder)["why"]
    write_provenance(folder, config={"lr": 3e-3, "track": {"api_key": "sk-123", "uri": "file:/x"}}, kind="inner")
    got = link_origin(folder)
    assert got["known"] and got["why"] == "" and set(got["files"]) == {"links.safetensors", "manifest.json"}
    record = got["provenance"]
    assert record["files"] == file_hashes(folder) and "pytest" in record["made_by"]["command"]
    assert record["config"]["lr"] == 3e-3 and record["config"]["track"]["api_key"] == "<left out>"
    assert "sk-123" not in (folder / PROVENANCE).read_text()
    with open(folder / "links.safetensors", "r+b") as f:  # one byte of the weights changed after training
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    got = link_origin(folder)
    assert not got["known"] and "links.safetensors differ from the sha256" in got["why"]


def test_release_layout_files_are_hashed_and_inputs_recorded(tmp_path):
    release = tmp_path / "release"
    release.mkdir()
    torch.save({"proj1.weight": torch.eye(4)}, release / "adapter.pt")
    (release / "adapter_config.json").write_text("{}")
    (release / "notes.txt").write_text("not a link file")
    assert set(file_hashes(release)) == {"adapter.pt", "adapter_config.json"}
    made = _links(tmp_path / "outer")
    write_provenance(made, config={}, inputs={"planner": str(release)})
    inputs = link_origin(made)["provenance"]["inputs"]
    assert inputs["planner"]["known"] is False and set(inputs["planner"]["files"]) == {"adapter.pt",
                                                                                       "adapter_config.json"}


def test_require_known_links_names_the_folder_and_the_flag(tmp_path):
    known, unknown = _links(tmp_path / "a"), _links(tmp_path / "b")
    write_provenance(known, config={})
    with pytest.raises(ValueError) as e:
        require_known_links({"planner": str(known), "critic": str(unknown)}, allow_unknown=False)
    assert str(e.value).startswith(f"--ckpt_override critic={unknown}: links of unknown origin")
    assert "--allow_unknown_links" in str(e.value) and "\n" not in str(e.value)
    got = require_known_links({"planner": str(known), "critic": str(unknown)}, allow_unknown=True)
    assert got["planner"]["known"] and not got["critic"]["known"]
    (known / PROVENANCE).write_text("{broken")
    assert "not a readable JSON file" in link_origin(known)["why"]


@pytest.fixture
def no_models(monkeypatch):
    import recmas_ray.eval.run as evaluation_run
    import recmas_ray.models.loader as loader

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loader, "load_frozen_model", boom)
    monkeypatch.setattr(evaluation_run, "BatchRunner", boom)


def test_run_refuses_unknown_links_before_any_model_loads(tmp_path, question_file, tiny_cache, capsys, no_models):
    from jobs import run as run_job

    from recmas_ray.system.plan import plan_system

    folder = _links(tmp_path / "planner", hidden=plan_system("sequential_light", preset="tiny").hidden_sizes["planner"])
    out = tmp_path / "out"
    args = ["--style", "sequential_light", "--preset", "tiny", "--dataset", str(question_file), "--backend", "local",
            "--ckpt_override", f"planner={folder}", "--output_path", str(out), "--no_progress"]
    assert run_job.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "links of unknown origin" in err[0] and "--allow_unknown_links" in err[0]
    assert not list(out.glob("samples_*")) and not list(out.glob("results_*"))
    # told to: the gate opens (the next step, starting agents, is what no_models stops)
    assert run_job.main(args + ["--allow_unknown_links"]) == 1
    assert "a model was loaded" in capsys.readouterr().err
    write_provenance(folder, config={})  # made here, recorded: no flag needed
    assert run_job.main(args) == 1


def test_inner_training_records_its_provenance(tmp_path, tiny_cache):
    from recmas_ray.system.config import with_system
    from recmas_ray.train.config import InnerTrainConfig
    from recmas_ray.train.inner_job import train_inner
    from recmas_ray.train.synthetic import make_arithmetic_dataset, write_jsonl

    data = write_jsonl(make_arithmetic_dataset(8, seed=1), tmp_path / "train.jsonl")
    cfg = with_system(InnerTrainConfig, model_name_or_path="tiny:qwen3", mas_role="planner", dataset_name=str(data),
                      save_dir=str(tmp_path / "inner"), max_steps=2, batch_size=1, lr=1e-3, warmup_steps=0,
                      save_every=2, log_every=1, num_workers=0, progress=False, max_failures=0)
    got = link_origin(train_inner(cfg))
    assert got["known"], got["why"]
    record = got["provenance"]
    assert record["kind"] == "inner" and record["config"]["max_steps"] == 2
    assert record["config"]["dataset_name"] == str(data) and record["made_by"]["command"]
