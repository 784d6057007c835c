#!/usr/bin/env bash
# The device run of benchmarks/gpu_acceptance.py, the one command a session passes to the device tool:
#     run(command="bash benchmarks/gpu_acceptance.sh", carry=[".whl"], timeout_s=480)
# .whl is made here first by `python benchmarks/gpu_wheels.py` (docs/gpu.md). On the device this
# installs the carried wheels into a site folder with pip --no-index (the device reaches no index),
# builds omniprof there from the working tree that travelled with the command (so a fix made since
# the wheels were made is what runs; its C extensions compiled on the device), then runs the
# acceptance script with the image's own torch and jax; the record and the log go to $OUT.
# Exit status: the acceptance script's (0 all passed, 1 some failed, 3 no GPU), or 10 when the
# build tools, 11 when the wheels or omniprof could not be installed.
set -u -o pipefail
PY=${PYTHON:-python3}
WHL=${GPU_WHEELS:-.whl}
SITE=${GPU_SITE:-/tmp/omniprof-gpu-site}
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
LOG="$OUT/gpu_acceptance.log"
PIP=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check)
rm -rf "$SITE" "$SITE-build"
extra=()  # fallback/<module>/: carried in case the image lacks <module> or has it older than MIN_VERSION
for d in "$WHL"/fallback/*/; do
  [ -d "$d" ] || continue
  mod=$(basename "$d"); min=$(cat "${d}MIN_VERSION" 2>/dev/null || echo 0)
  "$PY" -c "import sys, $mod as m; from packaging.version import Version as V
sys.exit(V(getattr(m, '__version__', '0')) < V('$min'))" 2>/dev/null || extra+=("$d"*.whl)
done
echo "fallback wheels installed: ${extra[*]:-none}" | tee -a "$LOG"
"${PIP[@]}" --target "$SITE-build" "$WHL"/build/*.whl 2>&1 | tee -a "$LOG" || exit 10
PYTHONPATH="$SITE-build${PYTHONPATH:+:$PYTHONPATH}" "${PIP[@]}" --no-build-isolation --target "$SITE" \
  "$WHL"/*.whl ${extra[@]+"${extra[@]}"} "${GPU_OMNIPROF:-.}" 2>&1 | tee -a "$LOG" || exit 11
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" - <<'PY' 2>&1 | tee -a "$LOG"
import importlib.metadata as md, sys
def v(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return "MISSING"
print("python", sys.version.split()[0], "|", ", ".join(f"{n} {v(n)}" for n in (
    "omniprof", "torch", "jax", "jaxlib", "xprof", "cupti-python", "nvidia-ml-py", "nvidia-cuda-cupti", "cuda-bindings",
    "attrs", "cattrs", "rich", "protobuf")))
PY
"$PY" benchmarks/gpu_acceptance.py --results-dir "$OUT" --log "$LOG" "$@"
