#!/bin/sh
# Issue 29's per-drafter cost table at two threads, from `spec-zoo costs` (session 14): each drafter's
# cost per drafted level in steps t(1) of the compiled target, its draft eager then compiled, one
# process per line, filed into the machine's stored table (t(M) kept as measured in session 12).
# Run from the repository root: sh docs/runtime/draft_costs_2t/run.sh > docs/runtime/draft_costs_2t/costs.txt
set -e
export OMP_NUM_THREADS=2
for args in \
  "drafter=eagle" \
  "drafter=eagle drafter.runtime=compiled" \
  "drafter=eagle drafter.runtime=compiled drafter.tree=auto" \
  "drafter=medusa" \
  "drafter=medusa drafter.runtime=compiled" \
  "drafter=distilled" \
  "drafter=distilled drafter.runtime=compiled" \
  "drafter=early_exit_adapter" \
  "drafter=early_exit_adapter drafter.runtime=compiled drafter.reuse_kv=false"; do
  echo "== spec-zoo costs model.runtime=compiled $args"
  # shellcheck disable=SC2086 (the overrides are words)
  spec-zoo costs model.runtime=compiled $args 2>&1 | grep -E "^drafting|^after 100 |^saved|Error|error" || true
done
