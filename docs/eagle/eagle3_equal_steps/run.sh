#!/bin/sh
# EAGLE-1 features (spec-zoo's EAGLE head: the target's last-layer state) vs EAGLE-3 fused
# features (fc over the states entering layers 2, 15, 27, EAGLE-3's layer), and the
# training-time test on and off, on the same data and the same steps (issue 24): every head
# reads one teacher-data store (160 prompts of the training mixture, 96 greedy target tokens
# each; never Spec-Bench) and trains 300 steps of 8 sequences (the recipes' shared defaults),
# one thread each, two side by side. Then tau and per-position acceptance on Spec-Bench (5 per
# category, 128 greedy tokens, eager runtime: an EAGLE-3 head reads three layers, which only
# the eager runtime hands out; tau does not depend on timing, so one repeat), each head
# drafting a fixed chain of 3. With vLLM's CPU build installed (make peer-vllm, docs/peers.md) the
# run also serves the EAGLE-3 head trained without the training-time test in vLLM (vllm_eagle3,
# 3 speculative tokens) beside vLLM's plain decoding: the head spec-zoo wrote, read by an engine.
# Usage: [DATA=DIR] sh docs/eagle/eagle3_equal_steps/run.sh OUT   (OUT: scratch dir for heads and
# records; DATA: a teacher-data cache dir to reuse, default OUT/data, made on first use: ~5 min)
set -eu
OUT=${1:?usage: run.sh OUT}
D="data.num_prompts=160 data.prompts=../shared/data/train_prompts/prompts.jsonl data.max_prompt_tokens=512 \
data.cache_dir=${DATA:-$OUT/data} threads=1 train.steps=300 train.eval_every=50 progress=false"
for ttt in 1 3; do
  OMP_NUM_THREADS=1 spec-zoo-train eagle $D head.ttt_steps=$ttt output.dir=$OUT/eagle1-ttt$ttt > "$OUT/eagle1-ttt$ttt.log" 2>&1 &
  OMP_NUM_THREADS=1 spec-zoo-train eagle3 $D head.ttt_steps=$ttt output.dir=$OUT/eagle3-ttt$ttt > "$OUT/eagle3-ttt$ttt.log" 2>&1 &
  wait
done
M="ar: null"
for h in eagle1-ttt1 eagle3-ttt1 eagle1-ttt3 eagle3-ttt3; do
  M="$M, $(echo $h | tr - _): {drafter: eagle, params: {head: $OUT/$h, num_draft: 3, adaptive: false}}"
done
if [ -x .venv-vllm/bin/python ]; then
  M="$M, vllm_ar: null, vllm_eagle3: {engine: vllm, params: {speculative_config: {method: eagle3, \
model: $OUT/eagle3-ttt1, num_speculative_tokens: 3}}}"
fi
OMP_NUM_THREADS=2 spec-zoo-bench "methods={$M}" dataset.per_category=5 generation.max_new_tokens=128 traces=true out="$OUT/bench"
