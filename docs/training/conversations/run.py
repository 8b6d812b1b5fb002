"""Does conversation data raise a draft's acceptance on second turns? (issue 24)

Two fine-tunings of the shipped distilled draft, same steps, same number of teacher rows from
the same chat sources: ``single`` on first turns only, ``conversations`` on conversations
(`data.mixture.<c>.follow_up`: each first turn, then the target's own answer and a question of
``data.follow_ups``, both answers trained on). Then the workloads report's mt_bench category
(held-out conversations, scored on the answer to a follow-up of ``report.follow_ups``, which
the training questions never repeat) and held-out first turns of the same sources, for the
shipped draft and both fine-tunings. Every prompt either arm or the shipped draft trained on is kept out.

    OMP_NUM_THREADS=1 python docs/training/conversations/run.py OUT [ROWS] [STEPS]
"""

import gzip
import json
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from spec_zoo.registry import CONF_DIR
from spec_zoo.train.cli import runner
from spec_zoo.train.data import PACKAGED_PROMPTS
from spec_zoo.train.loop import load_teacher_target
from spec_zoo.train.mixture import categories, mixture_texts

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/conversations")
ROWS, STEPS = (int(sys.argv[2]) if len(sys.argv) > 2 else 200), (int(sys.argv[3]) if len(sys.argv) > 3 else 200)
SHARED = "../shared/data/train_prompts/prompts.jsonl"
TRANSLATIONS = "docs/training/retrain_gpu/translations_de_en.jsonl.gz"
SOURCES = "[self-instruct, oasst, gpteacher-roleplay]"
SHIPPED = "drafters/distilled/artefacts/smollm2-135m-distilled"
ARMS = {"single": f"{{chat: {{share: 1, sources: {SOURCES}}}}}",
        "conversations": f"{{conversation: {{share: 1, follow_up: true, sources: {SOURCES}}}}}"}


def config(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(name, overrides=["threads=1", "progress=false", *overrides])


OUT.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)
prompts_de = OUT / "prompts_de.jsonl"  # the shipped draft's prompts file: the shared one + the translations
prompts_de.write_text(Path(SHARED).read_text() + gzip.decompress(Path(TRANSLATIONS).read_bytes()).decode())
common = [f"data.prompts={SHARED}", f"data.num_prompts={ROWS}", "data.max_new_tokens=128", "data.batch_size=8",
          "student.init=pretrained", f"student.path={SHIPPED}", "loss=fkl", f"train.steps={STEPS}",
          "train.eval_every=50", "train.warmup=10", "train.lr=3e-4", "~data.mixture"]
for arm, mixture in ARMS.items():
    if not (OUT / arm / "distill.json").is_file():
        print(runner("distill")(config("train_distill", *common, f"+data.mixture={mixture}",
                                       f"data.store={OUT / ('store-' + arm)}", f"output.dir={OUT / arm}")))

# kept out of the report: the shipped draft's 8,000 prompts (GPU mixture with translations) and the arms' texts
target = load_teacher_target(config("train_distill"))
gpu = config("train_distill", f"data.prompts={prompts_de}", "data.mixture.translation.share=0.1").data
trained = set(mixture_texts(target.tokenizer, gpu, categories(gpu), 8000))
for mixture in ARMS.values():
    d = config("train_distill", *common, f"+data.mixture={mixture}").data
    trained |= set(mixture_texts(target.tokenizer, d, categories(d), ROWS))
exclude = OUT / "trained.jsonl"
exclude.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in sorted(trained)))

chat = "[self-instruct-user-oriented, oasst, awesome-chatgpt-prompts, gpteacher-roleplay]"
workloads = f"{{mt_bench: {{sources: {chat}, follow_up: true}}, first_turn: {{sources: {chat}}}}}"
report = config("train_report", "report.prompts=workloads", f"data.prompts={prompts_de}", "report.per_category=12",
                "data.max_new_tokens=128", "data.batch_size=8", f"report.out={OUT / 'report'}",
                f"data.cache_dir={OUT / 'report-data'}", f"report.exclude=[{PACKAGED_PROMPTS},{exclude}]",
                f"report.artefacts=[{SHIPPED},{OUT / 'single'},{OUT / 'conversations'}]", "~report.workloads",
                f"+report.workloads={workloads}")
print(runner("report")(report))
