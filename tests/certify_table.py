"""The certification table: every shipped drafter x verifier x draft shape x sampling
setting, certified by enumeration (`spec_zoo.certify`) on a 4-token tiny float64 model,
3 generated tokens after a repetitive prompt.

Regenerate docs/certification_table.md (one core, a few minutes):

    python -m tests.certify_table

tests/test_certify.py certifies a subset of these cells in CI (every drafter, shape,
verifier and setting at least once) and checks the generated table.
"""

from __future__ import annotations

import atexit
import copy
import functools
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from spec_zoo.certify import certify
from spec_zoo.errors import ConfigError
from spec_zoo.sampling import SamplingParams
from spec_zoo.testing import tiny_llama
from spec_zoo.trees import Dynamic, MultiDraft, Static
from spec_zoo.verifiers.block import BlockVerifier
from spec_zoo.verifiers.greedy import GreedyVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier
from spec_zoo.verifiers.typical import TypicalVerifier

VOCAB, LENGTH, PROMPT = 4, 3, [2, 3, 2, 3, 2]
LOSSLESS_TV = 1e-9
TABLE = Path(__file__).parents[1] / "docs" / "certification_table.md"

SETTINGS = {
    "T=1": SamplingParams(temperature=1.0),
    "T=0.7 top-k 3 top-p 0.75": SamplingParams(temperature=0.7, top_k=3, top_p=0.75),
    "T=0": SamplingParams(),
}
# chain: a 2-token chain; static: two siblings (drawn without replacement when sampling);
# dynamic: EAGLE-2's tree (deterministic); multi_draft: two i.i.d. draws (with replacement)
SHAPES = {
    "chain": None,
    "static": lambda: Static([[0], [1]]),
    "dynamic": lambda: Dynamic(width=2, depth=2, budget=3),
    "multi_draft": lambda: MultiDraft(n=2, depth=1),
}
VERIFIERS = {"greedy": GreedyVerifier, "rejection": RejectionVerifier, "block": BlockVerifier,
             "typical": TypicalVerifier}
DRAFTERS = ["ngram", "small_model", "distilled", "eagle", "medusa", "hydra", "mlp_speculator", "parallel", "early_exit",
            "cascade", "merge", "cross_tokenizer", "quantized"]
# drafters with a tree policy
TREE_DRAFTERS = {"small_model", "distilled", "eagle", "medusa", "hydra", "mlp_speculator", "parallel", "early_exit",
                 "quantized"}


@functools.cache
def target():
    return tiny_llama(21, vocab=VOCAB, sharpness=6.0)


@functools.cache
def parts() -> dict:
    """What the drafters are built from, made once (the heads are not changed by decoding)."""
    from spec_zoo.artefacts import describe_target
    from spec_zoo.drafters.distilled.student import save_artefact, student_from_target
    from spec_zoo.drafters.hydra.heads import HydraHeads
    from spec_zoo.drafters.mlp_speculator.speculator import MLPSpeculator
    from tests.drafts import eagle_head, exit_adapter, medusa_heads, noisy_copy, parallel_draft, staged_heads

    model = target()
    student = student_from_target(model, 1, None, torch.tensor([0, 2, 3]))  # token 1 is outside its vocabulary
    with torch.no_grad():
        w = student.lm.lm_head.weight
        w.add_(0.5 * w.std() * torch.randn(w.shape, generator=torch.Generator().manual_seed(5), dtype=w.dtype))
    record = {"target": describe_target(model, "tiny"), "init": {"kind": "target", "layers": 1, "copy_layers": None}}
    scratch = Path(tempfile.mkdtemp(prefix="spec-zoo-certify-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # the process's copy, gone when it exits
    distilled = save_artefact(student, scratch / "distilled", record, dtype="float64", quantize=None)  # exact float64
    return {"draft": noisy_copy(model, 1.0), "eagle": eagle_head(model), "exit": exit_adapter(model),
            "medusa": medusa_heads(model), "hydra": staged_heads(HydraHeads, model, 2),
            "mlp_speculator": staged_heads(MLPSpeculator, model, 2), "distilled": distilled,
            "parallel": parallel_draft(model)}


@functools.cache
def cross_tokenizer_draft():
    """(draft model, its tokenizer) of another vocabulary: "a", "b" and the merged "ab", "ba"."""
    from tests.drafts import merged_draft

    return merged_draft(["a", "b"], [("a", "b"), ("b", "a")], sharpness=6.0)


def drafter_factory(drafter: str, shape: str):
    """(target model -> a fresh drafter), or None where the drafter has no such shape."""
    from spec_zoo.drafters.cascade import CascadeDrafter
    from spec_zoo.drafters.eagle.drafter import EagleDrafter
    from spec_zoo.drafters.early_exit.drafter import EarlyExitDrafter
    from spec_zoo.drafters.hydra.drafter import HydraDrafter
    from spec_zoo.drafters.medusa.drafter import MedusaDrafter
    from spec_zoo.drafters.merge import MergeDrafter
    from spec_zoo.drafters.mlp_speculator.drafter import MLPSpeculatorDrafter
    from spec_zoo.drafters.ngram import NgramDrafter
    from spec_zoo.drafters.quantized import QuantizedDrafter
    from spec_zoo.drafters.small_model import SmallModelDrafter

    if drafter == "cross_tokenizer":  # TLI when sampling, text drafting at T=0
        if shape != "chain":
            return None
        from spec_zoo.drafters.cross_tokenizer import CrossTokenizerDrafter
        from tests.drafts import char_tokenizer

        draft, tokenizer = cross_tokenizer_draft()
        return lambda m: CrossTokenizerDrafter(draft, tokenizer, char_tokenizer(["a", "b"]), num_draft=2)
    p = parts()
    if drafter == "ngram":
        kw = {"chain": {}, "static": {"branches": 2, "max_nodes": 4}}.get(shape)
        return None if kw is None else lambda m: NgramDrafter(num_draft=2, adaptive=False, **kw)
    if drafter in ("cascade", "merge"):
        if shape != "chain":
            return None
        cls = CascadeDrafter if drafter == "cascade" else MergeDrafter
        return lambda m: cls([NgramDrafter(num_draft=2, adaptive=False),
                              SmallModelDrafter(p["draft"], num_draft=2, adaptive=False)])
    tree = SHAPES[shape]
    shape_kw = (lambda: {"num_draft": 2}) if tree is None else (lambda: {"tree": tree()})
    build = {
        "small_model": lambda: SmallModelDrafter(p["draft"], adaptive=False, **shape_kw()),
        "distilled": lambda: copy.deepcopy(loaded(drafter, shape)),  # loaded from disk once
        "parallel": lambda: copy.deepcopy(loaded(drafter, shape)),
        "eagle": lambda: EagleDrafter(p["eagle"], adaptive=False, **shape_kw()),
        "medusa": lambda: MedusaDrafter(p["medusa"], **shape_kw()),
        "hydra": lambda: HydraDrafter(p["hydra"], **shape_kw()),
        "mlp_speculator": lambda: MLPSpeculatorDrafter(p["mlp_speculator"], **shape_kw()),
        "quantized": lambda: QuantizedDrafter(adaptive=False, runtime="eager", **shape_kw()),
        "early_exit": lambda: EarlyExitDrafter(1, adaptive=False, adapter=p["exit"], reuse_kv=tree is None,
                                               **shape_kw()),
    }[drafter]
    return lambda m: build()


@functools.cache
def loaded(drafter: str, shape: str):
    """The distilled or parallel drafter of a shape, loaded once (its factory copies it)."""
    from spec_zoo.drafters.distilled.drafter import DistilledDrafter
    from spec_zoo.drafters.parallel.drafter import ParallelDrafter

    tree = SHAPES[shape]
    kw = {"num_draft": 2} if tree is None else {"tree": tree()}
    if drafter == "parallel":
        return ParallelDrafter(parts()["parallel"], dtype="float64", **kw)
    return DistilledDrafter(parts()["distilled"], dtype="float64", adaptive=False, **kw)


@dataclass
class Cell:
    drafter: str
    shape: str
    verifier: str
    setting: str

    @property
    def id(self) -> str:
        return f"{self.drafter}-{self.shape}-{self.verifier}-{self.setting.replace(' ', '')}"


@dataclass
class Result:
    cell: Cell
    status: str  # lossless / lossy / refused / NOT EXACT
    tv: float | None = None
    tau: float | None = None
    branches: int = 0
    seconds: float = 0.0


def cells() -> list[Cell]:
    """Every drafter x its shapes x verifier x setting (greedy only at T=0, where it is defined;
    typical, the lossy rule, on chains)."""
    out = []
    for drafter in DRAFTERS:
        for shape in SHAPES:
            if drafter_factory(drafter, shape) is None:
                continue
            for verifier in VERIFIERS:
                for setting in SETTINGS:
                    if verifier == "typical" and shape != "chain":
                        continue
                    out.append(Cell(drafter, shape, verifier, setting))
    return out


def run(cell: Cell) -> Result:
    start = time.perf_counter()
    verifier = VERIFIERS[cell.verifier]()
    try:
        cert = certify(target, drafter_factory(cell.drafter, cell.shape), verifier, SETTINGS[cell.setting],
                       PROMPT, LENGTH)
    except ConfigError:
        return Result(cell, "refused", seconds=time.perf_counter() - start)
    status = "lossless" if cert.tv <= LOSSLESS_TV else "lossy" if not verifier.lossless else "NOT EXACT"
    return Result(cell, status, cert.tv, cert.tau, cert.branches, time.perf_counter() - start)


def markdown(results: list[Result], seconds: float) -> str:
    lines = [
        "<!-- generated by `python -m tests.certify_table`; do not edit -->",
        "# Certification table",
        "",
        f"Every drafter x verifier x draft shape x sampling setting, certified by enumeration "
        f"(`spec_zoo.certify`, [how](certify.md)): a {VOCAB}-token tiny float64 Llama "
        f"(`tiny_llama(21, vocab={VOCAB}, sharpness=6.0)`), the {LENGTH} tokens generated after "
        f"`{PROMPT}`. **TV** is the exact total variation between the generated tokens' law and "
        f"the target's own law under the same sampling settings (lossless: TV <= {LOSSLESS_TV:g}); "
        "**tau** the exact expected tokens per target forward; **decodes** the leaves of the "
        "choice tree (one decode each). *refused*: the verifier declines the pair up front "
        "(greedy above T=0, block on trees). Shapes: chain = 2 tokens; static = two siblings "
        "(drawn without replacement when sampling); dynamic = EAGLE-2 (width 2, depth 2, "
        "budget 3; deterministic); multi_draft = two i.i.d. draws (with replacement).",
        "",
        f"{sum(r.status == 'lossless' for r in results)} lossless, "
        f"{sum(r.status == 'lossy' for r in results)} lossy (typical acceptance), "
        f"{sum(r.status == 'refused' for r in results)} refused, "
        f"{sum(r.status == 'NOT EXACT' for r in results)} not exact; generated in {seconds:.0f} s on one core.",
        "",
        "| drafter | shape | verifier | setting | result | TV | tau | decodes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.cell
        tv = "" if r.tv is None else f"{r.tv:.1e}"
        tau = "" if r.tau is None else f"{r.tau:.4f}"
        decodes = str(r.branches) if r.branches else ""
        lines.append(f"| {c.drafter} | {c.shape} | {c.verifier} | {c.setting} | {r.status} | {tv} | {tau} "
                     f"| {decodes} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    torch.set_num_threads(1)
    start, results = time.perf_counter(), []
    for cell in cells():
        results.append(run(cell))
        r = results[-1]
        print(f"{cell.id}: {r.status} tv={r.tv} tau={r.tau} decodes={r.branches} {r.seconds:.1f}s", flush=True)
    TABLE.write_text(markdown(results, time.perf_counter() - start))
    print(f"wrote {TABLE}")
    sys.exit(any(r.status == "NOT EXACT" for r in results))


if __name__ == "__main__":
    main()
