#!/bin/sh
# Hydra vs Medusa on the same data and the same steps (issue 26): both recipes read one
# teacher-data store (160 prompts of the training mixture, 96 greedy target tokens each;
# never Spec-Bench) and train 300 steps of 8 sequences at lr 3e-3 (their shared defaults),
# one thread each, side by side. Then tau on Spec-Bench (5 per category, 128 greedy tokens, the
# compiled runtime; tau does not depend on timing, so one repeat) for each pair as a chain and as the same static tree.
# Usage: [DATA=DIR] sh docs/hydra/equal_steps/run.sh OUT  (OUT: a scratch dir for artefacts and records;
# DATA: a teacher-data cache dir to reuse, default OUT/data, made on first use: ~30 min)
set -eu
OUT=${1:?usage: run.sh OUT}
D="data.num_prompts=160 data.prompts=../shared/data/train_prompts/prompts.jsonl data.max_prompt_tokens=512 \
data.cache_dir=${DATA:-$OUT/data} threads=1 train.steps=300 progress=false"
OMP_NUM_THREADS=1 spec-zoo-train medusa $D output.dir=$OUT/medusa > "$OUT/medusa.log" 2>&1 &
OMP_NUM_THREADS=1 spec-zoo-train hydra $D output.dir=$OUT/hydra > "$OUT/hydra.log" 2>&1 &
wait
TREE='[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]'   # Medusa's static tree (drafter/medusa_tree.yaml), for both
OMP_NUM_THREADS=2 spec-zoo-bench "methods={ar_compiled: null, \
medusa_compiled: {params: {heads: $OUT/medusa}}, hydra_compiled: {params: {heads: $OUT/hydra}}, \
medusa_tree_compiled: {params: {heads: $OUT/medusa}}, \
hydra_tree_compiled: {params: {heads: $OUT/hydra, tree: {policy: static, choices: $TREE}}}}" \
  dataset.per_category=5 generation.max_new_tokens=128 traces=true out="$OUT/bench"
