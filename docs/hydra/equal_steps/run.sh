#!/bin/sh
# Hydra vs Medusa on the same data and the same steps (issue 26): both recipes read one
# teacher-data store (160 prompts of the training mixture, 96 greedy target tokens each;
# never Spec-Bench) and train 300 steps of 8 sequences at lr 3e-3 (their shared defaults),
# one thread each, side by side: first on the written tokens (heads.labels=tokens, both
# recipes' default), then on the target's top-k distributions (heads.labels=distributions,
# Hydra++'s teacher distillation). Then tau on Spec-Bench (5 per category, 128 greedy tokens,
# the compiled runtime; tau does not depend on timing, so one repeat) for each pair as a chain
# and as the same static tree.
# Usage: [DATA=DIR] [PROMPTS=160] [STEPS=300] [LABELS="tokens distributions"] [THREADS=2]
#        sh docs/hydra/equal_steps/run.sh OUT
# (OUT: a scratch dir for heads and records; DATA: a teacher-data cache dir to reuse, default OUT/data,
# made on first use: ~30 min for 160 prompts; PROMPTS, STEPS: the store's prompts and the steps of both
# recipes; LABELS: which label pairs to train; THREADS: the bench's threads)
set -eu
OUT=${1:?usage: run.sh OUT}
LABELS=${LABELS:-tokens distributions}
D="data.num_prompts=${PROMPTS:-160} data.prompts=../shared/data/train_prompts/prompts.jsonl data.max_prompt_tokens=512 \
data.cache_dir=${DATA:-$OUT/data} threads=1 train.steps=${STEPS:-300} progress=false"
for labels in $LABELS; do
  OMP_NUM_THREADS=1 spec-zoo-train medusa $D heads.labels=$labels output.dir=$OUT/medusa-$labels > "$OUT/medusa-$labels.log" 2>&1 &
  OMP_NUM_THREADS=1 spec-zoo-train hydra $D heads.labels=$labels output.dir=$OUT/hydra-$labels > "$OUT/hydra-$labels.log" 2>&1 &
  wait
done
TREE='[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]'   # Medusa's static tree (drafter/medusa_tree.yaml), for both
M="ar_compiled: null"
for labels in $LABELS; do
  tag=$( [ $labels = tokens ] && echo "" || echo _soft )
  M="$M, medusa${tag}_compiled: {drafter: medusa, runtime: compiled, params: {heads: $OUT/medusa-$labels, runtime: compiled}}"
  M="$M, hydra${tag}_compiled: {drafter: hydra, runtime: compiled, params: {heads: $OUT/hydra-$labels}}"
  M="$M, medusa_tree${tag}_compiled: {drafter: medusa_tree, runtime: compiled, params: {heads: $OUT/medusa-$labels, runtime: compiled}}"
  M="$M, hydra_tree${tag}_compiled: {drafter: hydra, runtime: compiled, params: {heads: $OUT/hydra-$labels, tree: {policy: static, choices: $TREE}}}"
done
OMP_NUM_THREADS=${THREADS:-2} spec-zoo-bench "methods={$M}" dataset.per_category=5 generation.max_new_tokens=128 traces=true out="$OUT/bench"
