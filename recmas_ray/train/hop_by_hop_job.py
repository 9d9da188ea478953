"""`--schedule hop_by_hop` on Ray Train: one worker per role, stage-parallel (numerics in `hop_by_hop.py`).

    driver      config checked, system planned (inner links against base models), rows loaded, the batch of
                every step fixed (`core.step_indices`), one TorchTrainer with a worker per role (gloo)
    worker r    loads only its own base model and frozen inner link
    links       every worker's vocabulary strings are gathered; per sent edge src -> dst the two workers
                agree on the shared-token pairs and one sends the other its embedding rows: an edge between
                earlier stages lives on its sender (untrained, it only sends on), an edge into the decoder on
                the decoder's worker (trained there, so no gradient ever crosses a worker)
    rollouts    earlier stage, for each step that draws new questions (each question's first draw): receive
                the messages of its inputs -> m-step rollout -> z -> send z on (edge into the decoder) or
                token_link(z) (edge to a later earlier stage); computed once per question, never again
    training    decoder worker, step s: receive step s's new z (if any) into its memo, then the same
                `DecoderTrainer.step` as the single-process reference (`hop_by_hop.train_in_process`)
    result      every worker's links.pt entries (and frozen-weight check) gathered; rank 0 reports one
                checkpoint holding links.pt and log.json, which the driver copies into --save_dir

Why stage-parallel and not data-parallel: the earlier stages are frozen, so their work is a pure function of
the question, computed once; only the decoder's forward and backward repeat every step. Data-parallel
workers would each have to hold every model (to roll out their shard) and would change the decoder's batch
(left padding) and the order of the gradient sum, so their gradients would equal the reference's only up to
rounding; here the decoder runs each step's whole batch in one process, so its gradients are the
reference's to the bit where the torch thread counts match (`--torch_threads`; on the demo's Gemma-3-270M
planner and critic and SmolLM2-135M solver, 8 steps: links, gradients and losses identical), while the earlier
stages roll out the next questions as the decoder trains (a pipeline across stages; the mixture's three
experts in parallel).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import ray
import ray.train
import torch
import torch.distributed as dist

from recmas_ray.config.checks import check_tree
from recmas_ray.config.tree import save_config
from recmas_ray.console import current
from recmas_ray.distributed import cluster
from recmas_ray.engine.agent import Agent
from recmas_ray.engine.links import inner_link_from_state_dict
from recmas_ray.models import loader
from recmas_ray.models.loader import resolve_dtype
from recmas_ray.styles import build_schedule, get_style, split_edge
from recmas_ray.system.plan import plan_system
from recmas_ray.system.provenance import write_provenance
from recmas_ray.train import core, history
from recmas_ray.train.bridge import shared_pairs, vocabulary_strings
from recmas_ray.train.config import OuterTrainConfig
from recmas_ray.train.data import load_rows
from recmas_ray.train.hop_by_hop import (LINKS_FILE, LOG_FILE, DecoderTrainer, decoder_edges, embedding_rows,
                                         links_entry, load, new_rows_per_step, save_links_file, save_product_checkpoint,
                                         send_on, sent_edges, stage_rollout, step_line, token_link_of)
from recmas_ray.train.outer import OuterRunResult, Sample, prepare_samples
from recmas_ray.train.progress import StepBoard, post_step
from recmas_ray.train.stage import frozen_digest

GRADS_FILE = "grads.pt"


# ----------------------------------------------------------------------------- Ray Train worker
class _Peers:
    """Point-to-point with the other role workers: CPU tensors over gloo, tagged by edge, sends kept alive."""

    def __init__(self, ranks: dict[str, int], dims: dict[str, int], device):
        self.ranks, self.dims, self.device, self.pending = ranks, dims, device, []
        """role -> rank; role -> hidden size (= its embedding width); this worker's device; sends in flight."""

    def send(self, t: torch.Tensor, role: str, tag: int) -> None:
        t = t.detach().cpu().contiguous()
        self.pending.append((dist.isend(t, dst=self.ranks[role], tag=tag), t))

    def recv(self, shape, dtype, role: str, tag: int) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype)
        dist.recv(t, src=self.ranks[role], tag=tag)
        return t.to(self.device)

    def flush(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending = []


def _load_agent(cfg: OuterTrainConfig, style, role: str, system: dict, inner_state: dict, device):
    name = system["role_models"][role]
    model, tokenizer = loader.load_frozen_model(name, dtype=resolve_dtype(cfg.system.dtype, device), device=device)
    agent = Agent(model, tokenizer, inner_link_from_state_dict(inner_state, what=f"inner link of {role}"), role=role,
                  model_name=name, system_prompt=style.system_prompt)
    agent.inner_link.requires_grad_(False)
    return agent


def _token_links(agent, role: str, edges: list[str], trained: set[str], peers: _Peers, tau: float):
    """This worker's token links (edge -> (link, ids)): sent edges it sends on, or edges into it it trains."""
    mine = {"role": role, "vocab": vocabulary_strings(agent.tokenizer, blanks=True)}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    vocab = {e["role"]: e["vocab"] for e in everyone}
    out = {}
    for tag, edge in enumerate(edges):  # every worker walks the same order: each pair meets at its edge
        src, dst = split_edge(edge)
        if role not in (src, dst):
            continue
        ids = shared_pairs(vocab[src], vocab[dst], max_pairs=None)
        owner = dst if edge in trained else src
        other = src if owner == dst else dst
        own_ids, other_ids = (ids[1], ids[0]) if owner == dst else ids
        if role == other:
            peers.send(embedding_rows(agent, other_ids), owner, tag)
        else:
            rows = peers.recv((len(other_ids), peers.dims[other]), torch.float32, other, tag)
            pair = (rows, embedding_rows(agent, own_ids)) if owner == dst else (embedding_rows(agent, own_ids), rows)
            link = token_link_of(*(p.cpu() for p in pair), tau, ids).to(agent.device)
            link.requires_grad_(False)
            out[edge] = (link, ids)
    peers.flush()
    return out


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry. config = {"cfg", "system", "links": {role: ObjectRef of its inner state}, "samples",
    "batches" (row indices per step), "storage", "progress", "capture_grads"}."""
    cfg, style, role, device = core.role_worker_setup(config, OuterTrainConfig)
    rank = style.roles.index(role)
    agent = _load_agent(cfg, style, role, config["system"], ray.get(config["links"][role]), device)
    digest0 = frozen_digest(agent) if cfg.verify_frozen else None
    sched = build_schedule(style, 1)
    edges, trained = sent_edges(sched), decoder_edges(style, sched)
    peers = _Peers({r: i for i, r in enumerate(style.roles)}, config["system"]["hidden_sizes"], device)
    dtypes = [None] * dist.get_world_size()
    dist.all_gather_object(dtypes, (role, str(agent.dtype).removeprefix("torch.")))
    dtype_of = {r: getattr(torch, d) for r, d in dtypes}
    links = _token_links(agent, role, edges, set(trained), peers, cfg.token_tau)
    samples = [Sample(**s) for s in config["samples"]]
    batches, m = config["batches"], cfg.rollout_latent_steps
    new_rows = new_rows_per_step(batches)
    log, grads = [], {}
    if role == style.decoder:
        trainer = DecoderTrainer(cfg, style, agent, {e: links[e][0] for e in trained}, m=m)
        t0 = time.perf_counter()
        for step, (batch, new) in enumerate(zip(batches, new_rows)):
            if new:
                trainer.remember(new, {e: peers.recv((len(new) * m, peers.dims[split_edge(e)[0]]),
                                                     dtype_of[split_edge(e)[0]], split_edge(e)[0], edges.index(e))
                                       for e in trained})
            got = trainer.step(samples, batch, keep_grads=step + 1 in config.get("capture_grads", ()))
            if not torch.isfinite(torch.tensor([got["entry"]["loss"], got["entry"]["grad_norm"]])).all():
                raise FloatingPointError(f"hop-by-hop: non-finite loss or gradient norm at step {step + 1} "
                                         f"(rows {batch}); links.pt not written")
            log.append({"step": step + 1, **got["entry"]})
            if got["grads"] is not None:
                grads[step + 1] = got["grads"]
            post_step(config.get("progress"), f"outer {style.name} hop_by_hop", step + 1, len(batches))
            line = step_line(trained, step, len(batches), log[-1])
            if line:
                print(f"{line} ({time.perf_counter() - t0:.0f} s)", flush=True)
        trainer.finish()
    else:
        step_def = next(s for s in sched if s.role == role)
        for new in new_rows:  # each question once, in the order the decoder first draws it
            if not new:
                continue
            received = {slot: peers.recv((len(new), m, agent.hidden_size), dtype_of[split_edge(e)[0]],
                                         split_edge(e)[0], edges.index(e)) for slot, e in step_def.inputs}
            z_ND = stage_rollout(agent, style, step_def, cfg.task, m, [samples[i].question for i in new], received)
            for e in step_def.outputs:
                dst = split_edge(e)[1]
                peers.send(z_ND if e in trained else send_on(links[e][0], z_ND, len(new), m), dst, edges.index(e))
        peers.flush()
    owned = {e: links_entry(link, ids, cfg.token_tau) for e, (link, ids) in links.items()
             if (e in trained) == (role == style.decoder)}
    mine = {"role": role, "links": owned, "log": log, "grads": grads,
            "frozen_unchanged": frozen_digest(agent) == digest0 if digest0 else None}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    entries = {e: x for w in everyone for e, x in w["links"].items()}
    log = next(w["log"] for w in everyone if w["role"] == style.decoder)
    metrics = {"step": len(log), "loss": log[-1]["loss"] if log else None,
               "workers": {w["role"]: {"frozen_unchanged": w["frozen_unchanged"]} for w in everyone}}
    with tempfile.TemporaryDirectory() as tmp:
        if rank == 0:
            save_links_file(Path(tmp), {e: entries[e] for e in edges}, log)  # the sent edges' order
            found = next(w["grads"] for w in everyone if w["role"] == style.decoder)
            if found:
                torch.save(found, Path(tmp) / GRADS_FILE)
            core.write_state(Path(tmp), {"step": len(log), "log": log, "style": style.name})
            core.seal(Path(tmp))
        storage = core.RunStorage(*config["storage"])
        core.report_checkpoint(Path(tmp), metrics, step=len(log), storage=storage, local_mode=False,
                               num_to_keep=cfg.num_to_keep, with_files=rank == 0)


# ----------------------------------------------------------------------------- driver
def train_hop_by_hop(cfg: OuterTrainConfig, *, batches: list[list[int]] | None = None,
                     capture_grads: tuple[int, ...] = ()):
    """Run `--schedule hop_by_hop` as one Ray Train job (a worker per role); writes <save_dir>/links.pt, the same
    links as the product's checkpoint (links.safetensors + manifest.json, `--ckpt_override outer=SAVE_DIR`),
    log.json and config.json and returns an `outer.OuterRunResult`. `batches` (row indices per step)
    replaces the data order of `core.step_indices` (e.g. an earlier run's, to reproduce it); `capture_grads`
    (1-based steps, for tests) returns those steps' pre-clip gradients in metrics["captured_grads"]."""
    check_tree(cfg)
    style = get_style(cfg.system.style)
    plan = plan_system(cfg.system, task=cfg.task)  # raises on link/base-model mismatches, before compute
    samples = prepare_samples(load_rows(cfg.dataset_name, cfg.dataset_json_field, split=cfg.dataset_split), style,
                              cfg.task)
    if batches is not None:
        cfg = core.resolve_steps(cfg, len(samples), 1)
        bad = [b for b in batches if not b or not all(0 <= i < len(samples) for i in b)]
        if len(batches) != cfg.max_steps or bad:
            raise ValueError(f"hop_by_hop: batches must be {cfg.max_steps} non-empty lists of row indices below "
                             f"{len(samples)}, got {len(batches)} lists{f' (e.g. {bad[0]})' if bad else ''}")
    else:
        cfg = core.resolve_steps(cfg, len(samples), cfg.batch_size)
        batches = [core.step_indices(len(samples), s, cfg.batch_size, cfg.system.seed) for s in range(cfg.max_steps)]
    storage = core.run_storage(cfg, f"outer-hops-{style.name}")
    storage.clear()  # one checkpoint, at the end: nothing to resume
    save_dir = Path(cfg.save_dir)
    for old in (LINKS_FILE, LOG_FILE, GRADS_FILE):  # a half-overwritten folder must not look finished
        (save_dir / old).unlink(missing_ok=True)
    save_config(cfg, save_dir)
    local = not ray.is_initialized()
    if local:  # joins a running cluster (RAY_ADDRESS / ray start) or starts a local one on loopback

        cluster.init_ray()
    repo = str(Path(__file__).resolve().parents[2])
    loop_config = {"cfg": asdict(cfg), "links": {r: ray.put(plan.service_args(r)[1]) for r in style.roles},
                   "system": {"role_models": plan.role_models, "hidden_sizes": plan.hidden_sizes},
                   "samples": [asdict(s) for s in samples], "batches": [list(b) for b in batches],
                   "storage": (storage.uri, storage.name), "capture_grads": tuple(capture_grads)}
    with history.tracked_run(cfg, f"outer-hops-{cfg.system.style}") as tracker, \
            StepBoard(current(), enabled=cfg.progress) as board:
        loop_config["progress"] = board.queue
        result = core.fit(train_loop_per_worker, loop_config, cfg, storage, num_workers=len(style.roles),
                          resources=core.role_worker_resources(cfg, len(style.roles), local), backend="gloo", tracker=tracker,
                          env_vars={"PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))})
        if result.checkpoint is None:
            raise RuntimeError(f"hop-by-hop training finished without a checkpoint (run {storage.root})")
        metrics = dict(result.metrics or {})
        with result.checkpoint.as_directory() as d:
            if (Path(d) / GRADS_FILE).exists():
                metrics["captured_grads"] = torch.load(Path(d) / GRADS_FILE, weights_only=True)
            shutil.copyfile(Path(d) / LOG_FILE, save_dir / LOG_FILE)
            log = json.loads((save_dir / LOG_FILE).read_text())
            manifest = {**plan.manifest(), "task": cfg.task, "train_config": asdict(cfg), "step": len(log), "log": log}
            save_product_checkpoint(save_dir, load(Path(d) / LINKS_FILE), manifest, plan.hidden_sizes)
            write_provenance(save_dir, config=asdict(cfg), inputs=cfg.system.ckpt_override, kind="outer")
            shutil.copyfile(Path(d) / LINKS_FILE, save_dir / LINKS_FILE)  # last: its presence means finished
        history.log_history(tracker, log, save_dir=save_dir, files=("manifest.json", "config.json", LOG_FILE))
    return OuterRunResult(save_dir, result.checkpoint.path, metrics, log, [])
