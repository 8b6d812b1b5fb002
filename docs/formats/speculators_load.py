"""Load a spec-zoo-written EAGLE-3 head with vLLM `speculators`' own model class and check that
every stored tensor lands in it unchanged (docs/formats.md, "Checked by speculators").

`speculators` pins an older transformers and pulls CUDA torch, so it is never a dependency:
install it beside spec-zoo's venv with --no-deps (the command in docs/formats.md) and run
    PYTHONPATH=/tmp/specpkg HF_HUB_OFFLINE=1 .venv/bin/python docs/formats/speculators_load.py DIR
DIR: a head from `spec-zoo-train eagle3` or `spec-zoo-train export --format speculators`; its
config's verifier must be a loadable model directory (spec-zoo writes the target's own).
"""

import sys

import torch
from safetensors.torch import load_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

path = sys.argv[1]
config = Eagle3SpeculatorConfig.from_pretrained(path)  # validates the config (pydantic)
model = Eagle3DraftModel.from_pretrained(path)
stored, loaded = load_file(f"{path}/model.safetensors"), model.state_dict()
extra = sorted(set(stored) - set(loaded))
missing = sorted(set(loaded) - set(stored))
same = all(torch.equal(loaded[k].to(stored[k].dtype), stored[k]) for k in stored if k in loaded)
print(f"config: eagle3, draft vocab {config.draft_vocab_size}, layers {config.eagle_aux_hidden_state_layer_ids}")
print(f"stored tensors speculators does not know: {extra or 'none'}")
print(f"its tensors not stored (taken from the verifier): {missing}")
print(f"every stored tensor loaded unchanged: {same}")
sys.exit(0 if same and not extra else 1)
