"""Continuous links across two hops, beside the token link (issue "one system", item 4).

The main job's two-hop task (`--tasks sequential_light:recall`) carries the fact through token links: each latent
step arrives as nearly one token embedding. This experiment trains the same system with release-shaped
`OuterLink`s on both hops instead, with what the one-hop task taught (the rollout-state bridge) applied per hop,
hop by hop, and otherwise the token run's own settings (its `jobs.train_outer` config.json: questions, step
batches, lr, value weight, m, seed):

    inner links  <system>/{planner,critic,solver}, as the token run's (the product's jobs.train_inner)
    hop 1        planner -> critic: the planner's m-step rollouts of the training questions; ridge fit of
                 z_t -> the critic's embedding of the planner's argmax token at h_t (`train.bridge`); frozen
    hop 2        critic -> solver: the critic's rollouts from hop 1's messages; the same fit into the solver;
                 then trained on the solver's loss given those rollouts (`hop_by_hop.DecoderTrainer`, the token
                 link's trainer, on the same step batches)
    channel      per hop, on the test questions: the messages' mean cosine to their nearest receiver token
                 embedding, and their nearest-token strings for three questions (a token link's are ~1.0)
    out          <system>/outer: a product checkpoint (links.safetensors + manifest.json, log.json,
                 config.json, provenance.json, channel.json) and outer/init (both fits, as training started)

`python jobs/demo.py --tasks sequential_light:recall --output_path ROOT` then finds this seed's training done
and runs its eleven rows on these links (own, shuffled, zeroed, fresh, untrained = the two fits, text rows):

    PYTHONPATH=$PWD python -m jobs.experiments.continuous_hops \\
        --token_config ROOT_TOKEN/product/sequential_light-recall/seed0/system/outer/config.json \\
        --system_dir ROOT/product/sequential_light-recall/seed0/system   # holding copies of the inner links
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import torch

from recmas_ray.config.checks import ExistingPath, Range
from recmas_ray.config.cli import parse_config, run_job
from recmas_ray.config.tree import save_config
from recmas_ray.styles import build_schedule, get_style, split_edge
from recmas_ray.system.checkpoints import OUTER_INIT_DIR, LinkSet, save_links
from recmas_ray.system.launch import local_pool
from recmas_ray.system.plan import plan_system
from recmas_ray.system.provenance import write_provenance
from recmas_ray.engine.links import init_bridge
from recmas_ray.train import core
from recmas_ray.train.bridge import state_token_pairs, vocabulary_strings
from recmas_ray.train.config import OuterTrainConfig
from recmas_ray.train.data import load_rows, question_text
from recmas_ray.train.hop_by_hop import (DecoderTrainer, decoder_edges, embedding_rows, sent_edges, stage_states,
                                         step_line)
from recmas_ray.train.outer import prepare_samples


@dataclass
class ContinuousHopsConfig:
    """Where the token run's settings and the inner links are, and how the rollouts are batched."""

    token_config: Annotated[str, ExistingPath()]
    """The token-link run's `jobs.train_outer` config.json (its system/outer/config.json): every setting but the
    link kind and the schedule is taken from it."""
    system_dir: Annotated[str, ExistingPath()]
    """A system folder holding the inner links (planner/, critic/, solver/); outer/ is written into it and must
    not exist yet."""
    test_dataset: Annotated[str, ExistingPath()] = ""
    """Questions for the channel figures (the task's test.jsonl; empty: the training questions' first 64)."""
    rollout_batch_size: Annotated[int, Range(1, 512)] = 16
    """Questions rolled out together."""
    num_shown: Annotated[int, Range(0, 16)] = 3
    """Test questions whose messages are shown as nearest-token strings."""

    def __post_init__(self):
        if (Path(self.system_dir) / "outer").exists():
            raise ValueError(f"--system_dir {self.system_dir}: outer/ exists already; expected a folder holding "
                             f"only the inner links")


@torch.no_grad()
def rollouts(agent, style, step, task: str, m: int, questions: list[str], received: dict[str, torch.Tensor],
             batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(z [N * m, D] after the inner link, h [N * m, D]) of one earlier stage's m-step rollouts from its prompts,
    `received` (slot -> [N, m, E]) spliced into its slots: what inference sends on. `hop_by_hop.stage_states`
    in batches, keeping h as well: the state-bridge fit reads each step's argmax token off it."""
    zs, hs = [], []
    for k in range(0, len(questions), batch_size):
        h_ND = stage_states(agent, style, step, task, m, questions[k:k + batch_size],
                            {s: t[k:k + batch_size] for s, t in received.items()})
        zs.append(agent.inner_link(h_ND))
        hs.append(h_ND)
    return torch.cat(zs), torch.cat(hs)


@torch.no_grad()
def nearest_tokens(y_ND: torch.Tensor, receiver) -> tuple[torch.Tensor, list[int]]:
    """(cosine of each row to its nearest token embedding of `receiver`, that token's id), in chunks (a module's
    own scaling, e.g. Gemma's sqrt(d), changes no cosine)."""
    table = receiver.model.get_input_embeddings().weight
    y = torch.nn.functional.normalize(y_ND.float(), dim=-1)
    best, ids = torch.full((len(y),), -2.0), torch.zeros(len(y), dtype=torch.long)
    for start in range(0, table.shape[0], 16384):
        rows = torch.nn.functional.normalize(table[start:start + 16384].float(), dim=-1)
        sim = y @ rows.T
        top, where = sim.max(dim=-1)
        better = top > best
        best[better], ids[better] = top[better], where[better] + start
    return best, ids.tolist()


def channel(agents: dict, style, sched, task: str, m: int, questions: list[str], batch_size: int,
            num_shown: int) -> dict:
    """Per sent edge, over `questions`: the messages' mean cosine to their nearest receiver token embedding and
    the nearest-token strings of the first `num_shown` questions."""
    out, msgs = {}, {}
    for step in sched[:-1]:
        z_ND, _ = rollouts(agents[step.role], style, step, task, m, questions,
                           {slot: msgs[edge] for slot, edge in step.inputs}, batch_size)
        for edge in step.outputs:
            receiver = agents[split_edge(edge)[1]]
            with torch.no_grad():
                y_ND = agents[step.role].outer_links[edge](z_ND)
            msgs[edge] = y_ND.reshape(len(questions), m, -1)
            cos, ids = nearest_tokens(y_ND, receiver)
            out[edge] = {"mean_nearest_token_cosine": round(float(cos.mean()), 4),
                         "min_nearest_token_cosine": round(float(cos.min()), 4),
                         "nearest_tokens": [receiver.tokenizer.decode(ids[q * m:(q + 1) * m])
                                            for q in range(min(num_shown, len(questions)))]}
    return out


def train_continuous(cfg: OuterTrainConfig, test_questions: list[str], *, batch_size: int, num_shown: int) -> dict:
    """Fit both hops' OuterLinks per hop, train the one into the decoder, save the checkpoint; returns the log
    and channel figures."""
    torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
    style = get_style(cfg.system.style)
    plan = plan_system(cfg.system, task=cfg.task)
    agents = {r: s.agent for r, s in local_pool(plan).services.items()}
    samples = prepare_samples(load_rows(cfg.dataset_name, cfg.dataset_json_field, split=cfg.dataset_split), style,
                              cfg.task)
    cfg = core.resolve_steps(cfg, len(samples), cfg.batch_size)
    batches = [core.step_indices(len(samples), s, cfg.batch_size, cfg.system.seed) for s in range(cfg.max_steps)]
    sched, m = build_schedule(style, 1), cfg.rollout_latent_steps
    trained, questions = decoder_edges(style, sched), [s.question for s in samples]
    msgs, into_decoder, fits = {}, {}, {}
    t0 = time.perf_counter()
    for step in sched[:-1]:  # hop by hop: each fit on the rollouts the earlier hops' fitted links give
        agent = agents[step.role]
        z_ND, h_ND = rollouts(agent, style, step, cfg.task, m, questions,
                              {slot: msgs[edge] for slot, edge in step.inputs}, batch_size)
        for edge in step.outputs:
            receiver = agents[split_edge(edge)[1]]
            x_KD, ids = state_token_pairs(agent, z_ND, h_ND, vocabulary_strings(receiver.tokenizer))
            link = copy.deepcopy(plan.links.outer[edge]).float().to(agent.device)
            with torch.no_grad():
                init_bridge(link, x_KD, embedding_rows(receiver, ids), ridge=cfg.bridge_ridge)
            agent.outer_links[edge] = link.requires_grad_(False)
            fits[edge] = copy.deepcopy(link).cpu()
            print(f"[continuous] {edge}: ridge fit on {len(ids)} of {len(h_ND)} rollout states "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            if edge in trained:
                into_decoder[edge] = z_ND
            else:
                with torch.no_grad():
                    msgs[edge] = link(z_ND).reshape(len(questions), m, -1)
    trainer = DecoderTrainer(cfg, style, agents[style.decoder], {e: agents[split_edge(e)[0]].outer_links[e]
                                                                 for e in trained}, m=m)
    trainer.remember(list(range(len(samples))), into_decoder)
    log = []
    for step, batch in enumerate(batches):
        log.append({"step": step + 1, **trainer.step(samples, batch)["entry"]})
        line = step_line(trained, step, len(batches), log[-1])
        if line:
            print(f"{line} ({time.perf_counter() - t0:.0f} s)", flush=True)
    trainer.finish()
    edges = sent_edges(sched)
    links = {e: agents[split_edge(e)[0]].outer_links[e] for e in edges}
    out = Path(cfg.save_dir)
    save_links(out / OUTER_INIT_DIR, LinkSet(outer=fits), {"kind": "outer_init", "outer_init": "state_bridge",
                                                           "step": 0})
    figures = channel(agents, style, sched, cfg.task, m, test_questions or questions[:64], batch_size, num_shown)
    (out / "log.json").write_text(json.dumps(log))
    (out / "channel.json").write_text(json.dumps(figures, indent=2))
    save_config(cfg, out)
    manifest = {**plan.manifest(), "task": cfg.task, "train_config": asdict(cfg), "step": len(log), "log": log,
                "experiment": "continuous_hops: OuterLink per hop, state-bridge fits, hop 2 trained"}
    save_links(out, LinkSet(outer=links), {**manifest, "kind": "outer"})
    write_provenance(out, config=asdict(cfg), inputs=cfg.system.ckpt_override, kind="outer")
    return {"log": log, "channel": figures, "seconds": time.perf_counter() - t0}


def main_cfg(c: ContinuousHopsConfig) -> int:
    system = Path(c.system_dir)
    overrides = [f"{r}={system / r}" for r in ("planner", "critic", "solver")]
    cfg, _ = parse_config(OuterTrainConfig, ["--config", c.token_config, "--schedule", "end_to_end",
                                             "--outer_init", "state_bridge", "--save_dir", str(system / "outer"),
                                             "--ckpt_override", *overrides, "--no_progress"])
    test = [question_text(row) for row in load_rows(c.test_dataset, None)] if c.test_dataset else []
    got = train_continuous(cfg, test, batch_size=c.rollout_batch_size, num_shown=c.num_shown)
    print(json.dumps({"loss_first": got["log"][0]["loss"], "loss_last": got["log"][-1]["loss"],
                      "seconds": round(got["seconds"]), "channel": got["channel"]}, indent=2))
    return 0


def main(argv=None) -> int:
    return run_job(main_cfg, ContinuousHopsConfig, argv, prog="continuous_hops", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
