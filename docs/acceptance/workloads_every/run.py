"""The workloads report for every shipped artefact, all six categories in the bench's forms
(summarization as "Summarize: <article>" over held-out CNN/DM validation articles, qa as Natural
Questions, translation of WMT13's human German; no prompt sharing 27 words with a training prompt),
each beside the bench run that measured it: the new-methods line-up (3 repeats) for EAGLE, Medusa, Hydra, the MLP
speculator and the parallel draft; docs/retrained for the distilled draft and the exit adapter.
prompts_de.jsonl: the shared prompts plus docs/training/retrain_gpu/translations_de_en.jsonl.gz (gunzipped)
(docs/training.md, "An acceptance report that predicts Spec-Bench").

    OMP_NUM_THREADS=1 python docs/acceptance/workloads_every/run.py [THREADS]
"""

import sys

import torch
from hydra import compose, initialize_config_dir

from spec_zoo.registry import CONF_DIR
from spec_zoo.train.report import run_report

LINEUP, RETRAINED = "docs/lineups/new_methods_3r", "docs/retrained"
BENCH = {"smollm2-135m-eagle": (LINEUP, "eagle_compiled"),
         "smollm2-135m-medusa": (LINEUP, "medusa_compiled"),
         "smollm2-135m-hydra": (LINEUP, "hydra_compiled"),
         "smollm2-135m-mlp-speculator": (LINEUP, "mlp_speculator_compiled"),
         "smollm2-135m-parallel": (LINEUP, "parallel_compiled"),
         "smollm2-135m-distilled": (RETRAINED, "distilled_compiled"),
         "smollm2-135m-exit8": (RETRAINED, "early_exit_adapter_compiled")}

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(threads)
methods = ", ".join(f"{name}: {{results: {run}, method: {m}}}" for name, (run, m) in BENCH.items())
overrides = [
    "report.prompts=workloads", "data.prompts=prompts_de.jsonl", "data.mixture.translation.share=0.1",
    "report.exclude_mixture=8000", "report.per_category=5", "data.max_new_tokens=128", "data.batch_size=8",
    f"threads={threads}", "report.out=docs/acceptance/workloads_every", "data.cache_dir=outputs/report-cache",
    "progress=false", f"+report.compare.methods={{{methods}}}",
]
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = compose("train_report", overrides=overrides)
print(run_report(cfg))
