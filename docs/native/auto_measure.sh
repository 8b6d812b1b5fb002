#!/bin/bash
# The bare `spec-zoo` (model.*=auto) against configurations a user could name, after `spec-zoo warmup`; one
# thread, idle machine, each run its own process (docs/configs.md#auto). Usage: bash docs/native/auto_measure.sh
cd "$(dirname "$0")/../.."   # the repository root
export OMP_NUM_THREADS=1
P="prompt='Write a short story about a lighthouse keeper who finds a message in a bottle. Use about 150 words.' generation.max_new_tokens=128 compare=false"
start=$(date +%s); eval .venv/bin/spec-zoo warmup > "${TMPDIR:-/tmp}/warmup.out" 2>&1; echo "warmup (cold compile, process): $(( $(date +%s) - start )) s"; tail -2 "${TMPDIR:-/tmp}/warmup.out"
start=$(date +%s.%N); eval .venv/bin/spec-zoo drafter=none generation.max_new_tokens=1 compare=false > "${TMPDIR:-/tmp}/first.out" 2>&1; echo "warm process to 1 token: $(echo "$(date +%s.%N) - $start" | bc) s"; tail -1 "${TMPDIR:-/tmp}/first.out"
for cfg in "warmup model.runtime=compiled model.weights=dense" "warmup model.runtime=compiled model.weights=dense model.dtype=bfloat16"; do eval .venv/bin/spec-zoo $cfg > /dev/null 2>&1; done
for r in 1 2 3; do
  for cfg in "" "model.runtime=eager" "model.runtime=compiled model.weights=native" "model.runtime=compiled model.weights=dense" "model.runtime=compiled model.weights=dense model.dtype=bfloat16" "model.runtime=eager model.weights=dense" ; do
    for d in none ngram; do
      line=$(eval .venv/bin/spec-zoo drafter=$d $cfg $P 2>/dev/null | grep 'tok/s')
      echo "r$r | drafter=$d | ${cfg:-bare} | $(echo "$line" | grep -o '[0-9.]* tok/s' | head -1) | $(echo "$line" | cut -d'|' -f1)"
    done
  done
done
