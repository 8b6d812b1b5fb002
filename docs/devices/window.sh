#!/usr/bin/env bash
# The GPU window's one command (docs/devices.md): run from the repository root on the device machine.
# It finds a python whose torch sees CUDA, installs the carried wheels (.whl/: hydra-core, omegaconf,
# antlr4) and this checkout into a folder of its own (the machine has no network), and runs
# docs/devices/window.py into $OUT. Without a CUDA torch it says so and runs the dry mode instead.
set -u
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-window-out}
mkdir -p "$OUT"
PY=""
for candidate in ${WINDOW_PYTHON:-} python3 /opt/torch/.venv/bin/python3; do
    if "$candidate" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        PY=$candidate
        break
    fi
done
if [ -z "$PY" ]; then
    PY=${WINDOW_PYTHON:-python3}
    echo "window: no python here has a torch that sees CUDA ($PY: $("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)); running the dry mode on the CPU"
fi
echo "window: $PY ($("$PY" --version 2>&1))"
SITE=${WINDOW_SITE:-/tmp/spec-zoo-window-site}
shopt -s nullglob
wheels=(.whl/*.whl .whl/*.tar.gz)
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" \
    "${wheels[@]}" . || { echo "window: pip could not install ${wheels[*]} and this checkout into $SITE"; exit 3; }
PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 "$PY" docs/devices/window.py --out "$OUT" "$@"
