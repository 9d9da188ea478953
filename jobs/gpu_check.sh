#!/usr/bin/env bash
# The one prepared GPU check (issue #31): short runs of the GPU paths, each figure written under $OUT, for a
# lent GPU machine with a short time budget. From the repository root:
#
#   bash jobs/device_wheels.sh           # here, once: .whl/ holds Ray and what the device image lacks
#   bash jobs/gpu_check.sh               # there (the device tool: carry .whl, timeout_s 560)
#   GPU_CHECK_DEVICE=cpu bash jobs/gpu_check.sh   # every step on this machine's CPU: the commands still run
#
# Steps (each under its own time limit; one that fails is recorded and the next runs; the summary lists
# each step's exit status and seconds, and summary.json beside the logs):
#   env       GPUs, driver, Python, torch, Ray and transformers versions
#   engine    continuous batching on the GPU: one agent at 1 / 8 / 64 batches in flight, identical outputs (fp32:
#             in bf16 a merged batch's shape changes the rounding, so greedy tokens may differ from one at a time)
#   speed     in-process bf16: the KV-cache rollout, one latent step vs one decoded token, prefix reuse, decode loop
#   latent_step  one latent step and one decoded token (`jobs.bench.perf.step_cost`) of a random-weight model of
#             Qwen2.5-1.5B's shapes, bf16, at 1 / 8 / 64 rows, against the HBM floor (weight bytes / 4.8 TB/s)
#   backend   Ray on the GPU (agents share it: placement colocated) vs in-process, same agents and batches
#   replicas  the main job on Ray: two whole replicas and two solver copies on the GPU, predictions against the
#             in-process backend
#   multi-GPU with a GPU per agent (3): rdt:nccl latents, and the outer loop's pipeline with a GPU per role
#             worker; with fewer these are skipped, and the summary says so
# Random-weight models throughout, tiny but for latent_step: the device machine reaches no model hub, and its
# image holds no packaged model (the figures are of the code paths; latent_step's of a real model's shapes).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-out/gpu_check}
mkdir -p "$out"
py=${PYTHON:-python3}
device=${GPU_CHECK_DEVICE:-cuda}
dtype=bfloat16
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ! "$py" -c 'import ray' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then  # only where Ray is missing
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
    .whl/*.whl || { echo "error: installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/gpu_check_site:$PWD
else
  export PYTHONPATH=$PWD
fi
num_gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ')
placement=colocated
[ "$device" = cpu ] && placement=cpu
summary=()

step() {  # step NAME SECONDS COMMAND...: run it under a time limit, log to $out/NAME.log, keep its status
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  echo "== $name: $*"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  tail -n 4 "$out/$name.log"
  summary+=("$name rc=$rc $(($(date +%s) - t0))s")
}

step env 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -5; \
  $py -c 'import sys, torch, ray, transformers; print(sys.version.split()[0], \"torch\", torch.__version__, \
\"cuda\", torch.cuda.is_available(), \"ray\", ray.__version__, \"transformers\", transformers.__version__)'"
step engine 120 "$py" -m jobs.bench.engine --model tiny:llama --device "$device" --dtype float32 \
  --in_flight 1 8 64 --num_batches 64 --rows 4 --latent_steps 32 --tokens 64 --torch_threads 0 \
  --output_path "$out/engine"
step speed 150 "$py" -m jobs.bench.speed --preset tiny --quick --no_ray --device "$device" --dtype "$dtype" \
  --output_path "$out/speed"
step latent_step 240 "$py" - "$device" "$out/latent_step.json" <<'EOF'
"""One latent step and one decoded token (`jobs.bench.perf.step_cost`, the speed figure (d)) at 1 / 8 / 64 rows,
bf16, on a random-weight model of a real model's shapes (Qwen2.5-1.5B's config.json, built with no download),
against the HBM floor: the bytes of the weights a latent step reads (its layers, not the embedding table or the
LM head) / 4.8 TB/s (the H200's datasheet bandwidth). The CPU dry run takes 2 layers, 1 / 4 rows."""
import json, sys
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from jobs.bench.perf import step_cost
from recmas_ray.agent import Agent
from recmas_ray.links import InnerLink
from recmas_ray.models.loader import load_frozen_model

device, path = sys.argv[1], sys.argv[2]
cuda = device == "cuda"
cfg = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28 if cuda else 2, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)
_, tok = load_frozen_model("tiny:qwen3", dtype=torch.float32)  # a byte-level tokenizer: ids fit any vocabulary
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device).eval().requires_grad_(False)
agent = Agent(model, tok, InnerLink(cfg.hidden_size), role="planner", model_name="random:qwen2.5-1.5b-shapes")
step_bytes = sum(p.numel() * p.element_size() for p in model.model.layers.parameters())
floor_ms = step_bytes / 4.8e12 * 1e3
report = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "layers": cfg.num_hidden_layers,
          "step_weight_bytes": step_bytes, "hbm_floor_ms": floor_ms, "rows": {}}
with torch.no_grad():
    for rows in (1, 8, 64) if cuda else (1, 4):
        cost = step_cost(agent, [f"Question {i}: what is {i} + 7? Make a short plan." for i in range(rows)],
                         SimpleNamespace(repeats=3))
        step_ms = cost["latent_step_s"] * 1e3
        report["rows"][rows] = {**cost, "latent_step_ms": step_ms, "x_floor": step_ms / floor_ms}
        print(f"{rows:3d} rows: {step_ms:.3f} ms per latent step ({cost['decoded_token_s'] * 1e3:.3f} per decoded "
              f"token), {step_ms / floor_ms:.1f}x the HBM floor ({floor_ms:.3f} ms for {step_bytes / 2**30:.2f} GiB)",
              flush=True)
json.dump(report, open(path, "w"), indent=1)
EOF
step backend 150 "$py" -m jobs.bench.backend --preset tiny --device "$device" --dtype "$dtype" \
  --placement "$placement" --repeats 3 --output_path "$out/backend"
replicas=(--style sequential_light --preset tiny --dataset jobs/examples/questions.jsonl --method recursive_mas
          --num_recursive_rounds 2 --latent_steps 8 --device "$device" --dtype "$dtype")
step replicas_local 120 "$py" -m jobs.run "${replicas[@]}" --backend local --output_path "$out/run_local"
step replicas_ray 180 "$py" -m jobs.run "${replicas[@]}" --backend ray --placement "$placement" --num_replicas 2 \
  --role_replicas solver=2 --output_path "$out/run_ray"
step replicas_compare 30 "$py" - "$out/run_local" "$out/run_ray" <<'EOF'
"""The two backends' predictions, sample by sample (the runs' samples files, read as a resume reads them)."""
import glob, os, sys

from recmas_ray.eval.samples import read_samples, sample_key


def predictions(folder):
    return {sample_key(r): r["prediction"] for path in glob.glob(os.path.join(folder, "samples_*.jsonl"))
            for r in read_samples(path)}

local, ray = predictions(sys.argv[1]), predictions(sys.argv[2])
same = sum(local[k] == ray.get(k) for k in local)
print(f"same predictions: {same} of {len(local)} (ray has {len(ray)})")
sys.exit(0 if local and same == len(local) == len(ray) else 1)
EOF
if [ "$num_gpus" -ge 3 ]; then
  step nccl_run 180 "$py" -m jobs.run "${replicas[@]}" --backend ray --placement one_gpu_per_agent \
    --transport rdt:nccl --output_path "$out/run_nccl"
  step outer_nccl 180 "$py" -m jobs.bench.outer --preset tiny --use_gpu --rounds 1 2 --max_steps 4 \
    --output_path "$out/outer"
else
  summary+=("nccl_run skipped: $num_gpus GPU(s), one per agent needs 3" "outer_nccl skipped: $num_gpus GPU(s)")
fi

printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
"$py" -c 'import json, sys; print(json.dumps(sys.argv[1:], indent=1))' "${summary[@]}" >"$out/summary.json"
! grep -q ' rc=[1-9]' "$out/summary.txt"
