#!/bin/bash
# Issue 62's floor: on the default (native, compiled once warmed) target, a draft that cannot pay must not
# fall below 0.97x plain decoding. drafter=quantized (the 4-bit copy: ~1.05 t(1) a drafted level here) and
# drafter=auto against plain, with no stored cost table (a fresh user), then after `spec-zoo costs` stored
# the copy's cost; one thread, idle machine, each run its own process, interleaved. docs/native.md
# Usage: bash docs/native/draft_floor.sh [REPEATS]
cd "$(dirname "$0")/../.."   # the repository root
export OMP_NUM_THREADS=1
P="prompt='Write a short story about a lighthouse keeper who finds a message in a bottle. Use about 150 words.' generation.max_new_tokens=128 compare=false"
.venv/bin/spec-zoo warmup > /dev/null 2>&1; .venv/bin/spec-zoo warmup drafter=quantized > /dev/null 2>&1
run() {  # $1: label, rest: options
  local label=$1; shift
  line=$(eval .venv/bin/spec-zoo "$@" $P 2>/dev/null | grep 'tok/s')
  echo "r$r | $label | $(echo "$line" | grep -o '[0-9.]* tok/s' | head -1) | $(echo "$line" | grep -o 'tau [0-9.]* | alpha [0-9.a-z/]* | target forwards [0-9]*' | head -1)"
}
for phase in fresh costed; do
  if [ $phase = costed ]; then .venv/bin/spec-zoo costs drafter=quantized > /dev/null 2>&1; fi
  for r in $(seq 1 "${1:-3}"); do
    for d in none quantized auto; do run "$phase drafter=$d" drafter=$d; done
  done
done
