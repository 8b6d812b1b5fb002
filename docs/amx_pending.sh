#!/bin/sh
# The measurements that wait for a host with Intel's matrix engine (AMX-BF16), in the order the open
# issues need them, each resumable: rerun the script and every step skips what its OUT already holds.
#   sh docs/amx_pending.sh OUT [STEP...]      # steps: identity47 train46 lineup46 lineup47 head47 (default: all)
# One thread per benchmark, pinned: core 0 runs the step, nothing else should run (docs/benchmark.md).
# Refuses to start without AMX: on another host these figures would say nothing about the goals.
set -eu
out=${1:?give an output directory: sh docs/amx_pending.sh OUT [STEP...]}
shift
steps=${*:-identity47 train46 lineup46 lineup47 head47}
grep -q amx_tile /proc/cpuinfo || { echo "this CPU has no AMX (amx_tile): these bf16 goals are for AMX hosts" >&2; exit 2; }
mkdir -p "$out"
run() { OMP_NUM_THREADS=1 taskset -c 0 "$@"; }
head47=${GEMMA_HEAD:-$HOME/.cache/spec_zoo/trained/gemma3-270m-eagle3-4096}
needs_head() {  # lineup47 and head47 read a trained Gemma 3 EAGLE-3 head; the repository ships none (36 MB)
  [ -f "$head47/config.json" ] || { echo "no Gemma 3 EAGLE-3 head at $head47: train it first with the 4,096-prompt command of docs/gemma3.md (hours on one core; it resumes), or set GEMMA_HEAD=DIR" >&2; exit 2; }
}
for step in $steps; do
  case $step in
    identity47)  # issue 47: greedy identity on Gemma 3 (every drafter, eager and compiled, fp32 and bf16 on the AMX kernels),
      # after the tiny families compiled (the order that once broke bf16 identity)
      [ -s "$out/identity47.log" ] && grep -q " passed" "$out/identity47.log" || {
        make gemma3 >/dev/null && OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/pytest -q -n 0 -p no:cacheprovider \
          tests/test_families.py tests/test_formats.py tests/test_gemma3.py > "$out/identity47.log" 2>&1; tail -3 "$out/identity47.log"; } ;;
    train46)  # issue 45: teacher-data and training throughput, bf16 against fp32 on this core
      [ -s "$out/bf16_throughput/bf16_throughput.json" ] || run python docs/training/bf16_throughput.py --out "$out/bf16_throughput" ;;
    lineup46)  # issue 46: the batch line-up in bf16 on the AMX GEMM beside vLLM (docs/batching.md)
      M='methods={ngram:null,suffix:null,eagle_compiled:null,cascade_compiled:{engine:spec_zoo,runtime:compiled,drafter:cascade,params:{params:{eagle:{runtime:compiled}}}},vllm_ar:null,vllm_ngram:null}'
      for b in 1 2 4 8 16; do
        run spec-zoo-bench batch_size=$b model.runtime=compiled model.dtype=bfloat16 model.gemm=amx "$M" \
          dataset.per_category=5 generation.max_new_tokens=128 repeats=3 progress=false out="$out/lineup46/b$b"
      done
      mkdir -p "$out/lineup46/all" && cat "$out"/lineup46/b*/results.jsonl > "$out/lineup46/all/results.jsonl"
      spec-zoo-bench batches="$out/lineup46/all" ;;
    lineup47)  # issue 47: the Gemma 3 line-up in bf16 (docs/gemma3.md), its EAGLE-3 head from $GEMMA_HEAD
      needs_head
      E3="{engine:spec_zoo,runtime:compiled,drafter:eagle,params:{head:$head47,runtime:compiled}}"
      CASC="{engine:spec_zoo,runtime:compiled,drafter:cascade,params:{params:{eagle:{head:$head47,runtime:compiled}}}}"
      AUTO="{engine:spec_zoo,runtime:compiled,drafter:auto,params:{workload:continuation,params:{eagle:{head:$head47,runtime:compiled},cascade:{params:{eagle:{head:$head47,runtime:compiled}}}}}}"
      run spec-zoo-bench model=gemma3_270m model.dtype=bfloat16 dataset=continuation generation.max_new_tokens=128 \
        repeats=3 progress=false \
        "methods={ar_compiled:null,ngram_compiled:null,suffix_compiled:null,eagle3_compiled:$E3,cascade_compiled:$CASC,auto_compiled:$AUTO}" \
        out="$out/lineup47" ;;
    head47)  # issue 47: the EAGLE-3 head's cost per drafted token against a target step, bf16 and fp32
      needs_head
      for dtype in bfloat16 float32; do
        [ -s "$out/head47_$dtype.json" ] || run python docs/gemma3/head_cost.py "$head47" $dtype 3 > "$out/head47_$dtype.json"
      done ;;
    *) echo "unknown step $step (identity47 train46 lineup46 lineup47 head47)" >&2; exit 2 ;;
  esac
done
