#!/bin/sh
# The draft vocabulary as a knob (issue 24): EAGLE heads with 8k / 16k / 32k / full draft
# vocabularies (the most frequent tokens of the teacher data's answers, FR-Spec style), trained on
# the same data and steps (the teacher-data store and settings of ../eagle3_equal_steps/run.sh:
# 160 prompts, 300 steps of 8 sequences, one thread each, two side by side), then Spec-Bench
# (5 per category, 128 greedy tokens, one repeat) on the compiled runtime, each head on the
# compiled draft path with the default adaptive chain, against ar_compiled: coverage, acceptance,
# the draft's seconds per drafted token and speed. The 8k head is ../eagle3_equal_steps' eagle1-ttt1.
# Usage: [DATA=DIR] sh docs/eagle/vocab_equal_steps/run.sh OUT   (OUT: the scratch dir of
# ../eagle3_equal_steps/run.sh, which holds eagle1-ttt1 and the store)
set -eu
OUT=${1:?usage: run.sh OUT}
D="data.num_prompts=160 data.prompts=../shared/data/train_prompts/prompts.jsonl data.max_prompt_tokens=512 \
data.cache_dir=${DATA:-$OUT/data} threads=1 train.steps=300 train.eval_every=50 progress=false"
OMP_NUM_THREADS=1 spec-zoo-train eagle $D head.vocab_size=16384 output.dir=$OUT/eagle1-v16k > "$OUT/eagle1-v16k.log" 2>&1
OMP_NUM_THREADS=1 spec-zoo-train eagle $D head.vocab_size=32768 output.dir=$OUT/eagle1-v32k > "$OUT/eagle1-v32k.log" 2>&1 &
OMP_NUM_THREADS=1 spec-zoo-train eagle $D head.vocab_size=0 output.dir=$OUT/eagle1-vfull > "$OUT/eagle1-vfull.log" 2>&1 &
wait
M="ar_compiled: null"
for v in 8k:eagle1-ttt1 16k:eagle1-v16k 32k:eagle1-v32k full:eagle1-vfull; do
  M="$M, eagle_v${v%%:*}_compiled: {drafter: eagle, runtime: compiled, params: {head: $OUT/${v#*:}, runtime: compiled}}"
done
OMP_NUM_THREADS=2 spec-zoo-bench "methods={$M}" dataset.per_category=5 generation.max_new_tokens=128 \
  traces=true out="$OUT/vocab-bench"
python docs/eagle/vocab_equal_steps/coverage.py "$OUT/vocab-bench" $OUT/eagle1-ttt1 $OUT/eagle1-v16k $OUT/eagle1-v32k $OUT/eagle1-vfull
