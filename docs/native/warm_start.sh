#!/bin/bash
# A warm start of the bare spec-zoo (model.freezing: auto, unfrozen for native weights) against
# model.freezing=true: each warmed up once, then 3 rounds of (first token, 128-token story), one thread,
# each run its own process (docs/native.md, "A warm start"). Usage: bash docs/native/warm_start.sh
cd "$(dirname "$0")/../.."   # the repository root
export OMP_NUM_THREADS=1
P="prompt='Write a short story about a lighthouse keeper who finds a message in a bottle. Use about 150 words.' generation.max_new_tokens=128 compare=false"
for cfg in "" "model.freezing=true"; do s=$(date +%s.%N); eval taskset -c 1 .venv/bin/spec-zoo warmup $cfg > "${TMPDIR:-/tmp}/warmup.out" 2>&1; echo "warmup [$cfg]: $(echo "$(date +%s.%N) - $s" | bc) s"; done
for r in 1 2 3; do
  for cfg in "" "model.freezing=true"; do
    s=$(date +%s.%N); line=$(eval taskset -c 1 .venv/bin/spec-zoo drafter=none generation.max_new_tokens=1 compare=false $cfg 2>/dev/null | tail -1); echo "r$r first token [$cfg]: $(echo "$(date +%s.%N) - $s" | bc) s | $(echo "$line" | cut -d'|' -f1)"
    line=$(eval taskset -c 1 .venv/bin/spec-zoo drafter=none $cfg $P 2>/dev/null | grep 'tok/s'); echo "r$r story [$cfg]: $(echo "$line" | grep -o '[0-9.]* tok/s' | head -1)"
  done
done
