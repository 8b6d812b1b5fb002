"""The workloads report on the two categories whose form changed (summarization, qa) only (session 18):
the shipped EAGLE head, distilled draft and exit adapter, beside docs/retrained's bench traces.
prompts_de.jsonl: the shared prompts plus docs/training/retrain_gpu/translations_de_en.jsonl.gz, gunzipped
(docs/training.md).

    python docs/acceptance/workloads_forms/run.py
"""

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from spec_zoo.registry import CONF_DIR
from spec_zoo.train.report import run_report

ARTEFACTS = {"smollm2-135m-eagle": ("eagle", "eagle_compiled"),
             "smollm2-135m-distilled": ("distilled", "distilled_compiled"),
             "smollm2-135m-exit8": ("early_exit", "early_exit_adapter_compiled")}

torch.set_num_threads(2)
dirs = ",".join(f"drafters/{method}/artefacts/{name}" for name, (method, _) in ARTEFACTS.items())
methods = ", ".join(f"{name}: {bench}" for name, (_, bench) in ARTEFACTS.items())
overrides = [
    "report.prompts=workloads", "data.prompts=prompts_de.jsonl", "data.mixture.translation.share=0.1",
    "report.exclude_mixture=8000", "report.per_category=5", "data.max_new_tokens=128", "data.batch_size=8",
    "threads=2", "report.out=docs/acceptance/workloads_forms", "report.compare.results=docs/retrained",
    "data.cache_dir=outputs/report-cache", "progress=false", f"report.artefacts=[{dirs}]",
    f"+report.compare.methods={{{methods}}}",
]
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = compose("train_report", overrides=[*overrides, "report.train_ngram=0"])  # as of session 18: exact texts
OmegaConf.set_struct(cfg, False)
cfg.report.workloads = {  # session 18's sources (later defaults: held-out CNN/DM validation news, Natural Questions)
    "summarization": {"sources": ["t0-cnn_dailymail"], "min_tokens": 350, "form": "Summarize: {prompt}",
                      "strip": r"^In 2 or 3 sentences, what are the main points one should remember from this "
                               r"news article\?\s*Article:\s*"},
    "qa": {"sources": ["t0-kilt_tasks"], "strip": r"^Combine facts and answer this:\s*"},
}
print(run_report(cfg))
