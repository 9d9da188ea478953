#!/usr/bin/env bash
# Submit a recmas_ray job to a running Ray cluster with the project's defaults.
#
#   cluster/submit.sh JOB [JOB ARGS...]
#
# JOB is a file name under jobs/ without .py (run, train_inner, train_outer) or a path to it.
# Every argument after JOB is passed to the job unchanged. Runs
#   ray job submit --address $RAY_ADDRESS --working-dir . --runtime-env cluster/runtime_env.yaml \
#       $SUBMIT_FLAGS -- python -m jobs.JOB ARGS...
# from the repo root, whatever the current directory.
#
# Environment:
#   RAY_ADDRESS   dashboard address of the cluster (default http://127.0.0.1:8265, e.g. through
#                 `ray dashboard cluster/aws.yaml` or `kubectl port-forward svc/recmas-head-svc 8265`)
#   RUNTIME_ENV   runtime env file (default cluster/runtime_env.yaml)
#   SUBMIT_FLAGS  extra `ray job submit` flags, e.g. "--no-wait --submission-id eval-math500"
#   RAY_AUTH_MODE / RAY_AUTH_TOKEN   for clusters with token auth (cluster/README.md)
set -euo pipefail

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

job="$1"
shift
job="$(basename "${job%.py}")"
script="jobs/${job}.py"
if [[ ! -f "$script" ]]; then
  echo "submit.sh: no job script '$script'; expected one of: $(ls jobs/*.py 2>/dev/null | xargs -n1 basename 2>/dev/null | sed 's/\.py$//' | tr '\n' ' ')" >&2
  exit 2
fi

address="${RAY_ADDRESS:-http://127.0.0.1:8265}"
runtime_env="${RUNTIME_ENV:-cluster/runtime_env.yaml}"
# Word-splitting of SUBMIT_FLAGS is intended: it holds several flags.
# shellcheck disable=SC2206
extra=(${SUBMIT_FLAGS:-})

set -x
exec ray job submit --address "$address" --working-dir . --runtime-env "$runtime_env" \
  "${extra[@]}" -- python -m "jobs.${job}" "$@"
