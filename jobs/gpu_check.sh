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
#   backend   Ray on the GPU (agents share it: placement colocated) vs in-process, same agents and batches
#   replicas  the main job on Ray: two whole replicas and two solver copies on the GPU, predictions against the
#             in-process backend
#   multi-GPU with a GPU per agent (3): rdt:nccl latents, and the outer loop's pipeline with a GPU per role
#             worker; with fewer these are skipped, and the summary says so
# Tiny random-weight models throughout: the device machine reaches no model hub, and its image holds no
# packaged model (the figures are of the code paths, not of real model sizes).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-out/gpu_check}
mkdir -p "$out"
py=${PYTHON:-python3}
device=${GPU_CHECK_DEVICE:-cuda}
dtype=bfloat16
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
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
step backend 150 "$py" -m jobs.bench.backend --preset tiny --device "$device" --dtype "$dtype" \
  --placement "$placement" --repeats 3 --output_path "$out/backend"
replicas=(--style sequential_light --preset tiny --dataset jobs/examples/questions.jsonl --method recursive_mas
          --num_recursive_rounds 2 --latent_steps 8 --device "$device" --dtype "$dtype")
step replicas_local 120 "$py" -m jobs.run "${replicas[@]}" --backend local --output_path "$out/run_local"
step replicas_ray 180 "$py" -m jobs.run "${replicas[@]}" --backend ray --placement "$placement" --num_replicas 2 \
  --role_replicas solver=2 --output_path "$out/run_ray"
step replicas_compare 30 "$py" - "$out/run_local" "$out/run_ray" <<'EOF'
"""The two backends' predictions, question by question (every results file under each output folder)."""
import glob, json, os, sys

def predictions(folder):
    out = {}
    for path in glob.glob(os.path.join(folder, "**", "*.jsonl"), recursive=True):
        for line in open(path):
            row = json.loads(line)
            if "prediction" in row and "doc_id" in row:
                out[(row.get("method"), str(row["doc_id"]))] = row["prediction"]
    return out

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
