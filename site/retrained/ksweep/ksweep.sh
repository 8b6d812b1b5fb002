#!/bin/bash
# As run (2026-11-30) from an install of spec-zoo in /tmp/benchsite (pip install --target). The
# training-time-test head (TTT) was an ablation and is not kept: its record is
# docs/training/retrain_gpu/eagle_ttt.json; without it, drop the eagle_ttt_* methods.
export PYTHONPATH=/tmp/benchsite OMP_NUM_THREADS=1
TTT=/tmp/benchsite/spec_zoo/drafters/eagle/artefacts/smollm2-135m-eagle-ttt
/work/main/.venv/bin/python -m spec_zoo.bench.cli out=/work/bench/ksweep repeats=1 dataset.per_category=2 generation.max_new_tokens=128 \
 "methods={ar_compiled:{},eagle_k1:{drafter:eagle,runtime:compiled,params:{adaptive:false,num_draft:1}},eagle_k2:{drafter:eagle,runtime:compiled,params:{adaptive:false,num_draft:2}},eagle_ttt_k2:{drafter:eagle,runtime:compiled,params:{adaptive:false,num_draft:2,head:$TTT}},eagle_ttt_k3:{drafter:eagle,runtime:compiled,params:{adaptive:false,num_draft:3,head:$TTT}},distilled_k3:{drafter:distilled,runtime:compiled,params:{adaptive:false,num_draft:3}}}"
