"""`jobs/experiments/continuous_hops.py` on tiny models: release-shaped links on both hops of the two-hop fact task,
fitted per hop and trained hop by hop, saved as a product checkpoint that jobs.run loads (trained and untrained).

Asserts: hop 1 stays its fit (bit for bit, frozen), hop 2 moved from its fit, both fits are saved as outer/init,
the checkpoint loads in `jobs.run` with its trained links and with `--outer_init untrained` (which then names
the saved fits), and a folder whose outer/ exists is refused in one line with nothing written.
"""

import json

import pytest
import torch

pytestmark = pytest.mark.timeout(600)

M = 3


def _link_tensors(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "links.safetensors"))


def test_continuous_hops_trains_hop_two_only_and_runs_in_jobs_run(ray_cluster, tmp_path, capsys):
    from jobs import run as run_job
    from jobs import train_inner
    from jobs.experiments import continuous_hops
    from recmas_ray.config.tree import save_config
    from recmas_ray.system.config import with_system
    from recmas_ray.train.config import OuterTrainConfig
    from recmas_ray.train.synthetic import write_jsonl
    from recmas_ray.train.synthetic_facts import split_by_value

    train, seen, unseen = split_by_value("recall", "sequential_light", num_train=8, num_seen=2, num_unseen=2, seed=0)
    train_file, test_file = write_jsonl(train, tmp_path / "train.jsonl"), write_jsonl(seen + unseen,
                                                                                    tmp_path / "test.jsonl")
    system = tmp_path / "system"
    assert train_inner.main(["--style", "sequential_light", "--preset", "tiny", "--mas_role", "all", "--task", "qa",
                             "--dataset_name", str(train_file), "--save_dir", str(system), "--max_steps", "1",
                             "--batch_size", "2", "--num_workers", "0", "--no_progress"]) == 0
    token = with_system(OuterTrainConfig, style="sequential_light", preset="tiny", seed=0, task="qa",
                        dataset_name=str(train_file), save_dir=str(tmp_path / "token"), schedule="hop_by_hop",
                        num_recursive_rounds=1, rollout_latent_steps=M, max_steps=3, batch_size=2, lr=1e-2,
                        lr_scheduler_type="constant", warmup_steps=0, value_token_weight=5.0)
    save_config(token, tmp_path / "token")
    argv = ["--token_config", str(tmp_path / "token" / "config.json"), "--system_dir", str(system),
            "--test_dataset", str(test_file)]
    assert continuous_hops.main(argv) == 0
    outer = system / "outer"
    trained, fits = _link_tensors(outer), _link_tensors(outer / "init")
    hop1 = [k for k in trained if k.startswith("outer.planner->critic.")]
    hop2 = [k for k in trained if k.startswith("outer.critic->solver.")]
    assert hop1 and hop2 and set(trained) == set(fits)
    assert all(torch.equal(trained[k], fits[k]) for k in hop1), "hop 1 must stay its fit"
    assert any(not torch.equal(trained[k], fits[k]) for k in hop2), "hop 2 must train"
    manifest = json.loads((outer / "manifest.json").read_text())
    assert {e["kind"] for e in manifest["outer"].values()} == {"outer_ln_res_adapter"}
    assert len(manifest["log"]) == 3
    channel = json.loads((outer / "channel.json").read_text())
    assert set(channel) == {"planner->critic", "critic->solver"}
    assert all(0 <= c["mean_nearest_token_cosine"] <= 1 and len(c["nearest_tokens"]) == 3 for c in channel.values())

    for name, extra in (("own", []), ("untrained", ["--outer_init", "untrained"])):
        assert run_job.main(["--style", "sequential_light", "--preset", "tiny", "--links", str(system), "--task", "qa",
                             "--dataset", str(test_file), "--backend", "local", "--num_recursive_rounds", "1",
                             "--latent_steps", str(M), "--max_new_tokens", "2", "--output_path",
                             str(tmp_path / name), "--no_progress", *extra]) == 0
    results = json.loads(next((tmp_path / "untrained").glob("results_*.json")).read_text())
    assert "state_bridge init saved by training" in json.dumps(results)

    capsys.readouterr()
    before = sorted(p.name for p in outer.iterdir())
    assert continuous_hops.main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and "outer/ exists already" in err[0]
    assert sorted(p.name for p in outer.iterdir()) == before
