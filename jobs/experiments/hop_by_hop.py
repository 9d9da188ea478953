"""Hop-by-hop training in the sweep (recipe `token_hop_by_hop_r1`, and so the main job's two-hop fact task): the
product's `jobs.train_outer --schedule hop_by_hop` (`recmas_ray.train.hop_by_hop`, on Ray Train, a worker per
role), with the data order these runs have always used, so that their links stay what they were.

Before the schedule moved into the product this file trained in-process with `random.Random(seed)` shuffling
the rows at each epoch; `legacy_batches` is that order, handed to the product's trainer as its step batches
(the product's own default is `core.step_indices`). On tiny models every tensor of the links.pt of the sweep's
three styles (sequential_light, distillation, mixture; the main job's fact-task path, 6 steps) was bit-identical
before and after the move, and so were the losses (`tests/jobs/test_hop_by_hop.py` pins the order).

The links.pt format, `load` and `attach` are the product's (`recmas_ray.train.hop_by_hop`), re-exported here
for the sweep and the diagnostics.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from recmas_ray.train.hop_by_hop import (LINKS_FILE, LOG_FILE, attach, decoder_edges, load,  # noqa: F401
                                         sender_latents, token_link)
from recmas_ray.train import hop_by_hop_job


def legacy_batches(num_rows: int, num_steps: int, batch_size: int, seed: int) -> list[list[int]]:
    """Row indices of every step as the in-process trainer drew them: a list shuffled in place by
    random.Random(seed) at the start of each epoch of num_rows // batch_size steps, read in slices."""
    rng, order, per_epoch = random.Random(seed), list(range(num_rows)), max(1, num_rows // batch_size)
    out = []
    for step in range(num_steps):
        if step % per_epoch == 0:
            rng.shuffle(order)
        out.append(order[(step % per_epoch) * batch_size:][:batch_size])
    return out


def train(cfg, num_rows: int) -> dict:
    """Train `cfg` (an OuterTrainConfig with schedule hop_by_hop) through the product, in the legacy data order;
    returns {"links": (as `load`), "log": per-step entries}. With a links.pt already in its save_dir (an earlier
    run that stopped before its measurement), that is loaded instead of training again."""
    save_dir = Path(cfg.save_dir)
    if not (save_dir / LINKS_FILE).exists():
        hop_by_hop_job.train_hop_by_hop(cfg, batches=legacy_batches(num_rows, cfg.max_steps, cfg.batch_size,
                                                                    cfg.system.seed))
    return {"links": load(save_dir / LINKS_FILE), "log": json.loads((save_dir / LOG_FILE).read_text())}
