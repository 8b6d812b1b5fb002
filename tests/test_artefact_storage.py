"""How artefacts store their weights (`spec_zoo.artefacts.storage_tensors` / `restored_tensors`, the one
path every writer and reader takes): int8 / int4 matrices round-trip within half a scale step, corrupt
scales are refused, older float16 layouts still load, and a tensor taken from the target is checked by
its digest (docs/training.md, "Artefact storage")."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from spec_zoo.artefacts import BITS, GROUP, SCALES, describe_target, restored_tensors, storage_tensors
from spec_zoo.errors import ConfigError
from tests.tiny import tiny_llama


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(40, 3 * GROUP + 10, generator=gen), "norm": torch.randn(7, generator=gen),
            "ids": torch.arange(5), "zero": torch.zeros(3, 8)}


@pytest.mark.parametrize(("kind", "levels"), [("int8", 127), ("int6", 31), ("int5", 15), ("int4", 7)])
def test_a_quantized_matrix_comes_back_within_half_a_step_of_its_scale(kind, levels):
    weights = _weights()
    stored = storage_tensors(weights, quantize=kind)
    assert stored["w"].dtype == torch.uint8 and stored["w" + SCALES].dtype == torch.float16
    assert set(stored) == {"w", "w" + SCALES, "w" + BITS, "norm", "ids", "zero", "zero" + SCALES, "zero" + BITS}
    assert stored["norm"].dtype == torch.float16 and torch.equal(stored["ids"], weights["ids"])  # as before
    back = restored_tensors(stored, "drafter.head", "here", "head")
    assert set(back) == set(weights) and back["w"].shape == weights["w"].shape
    w = weights["w"]
    peaks = torch.nn.functional.pad(w, (0, -w.shape[1] % GROUP)).view(w.shape[0], -1, GROUP)  # per group of inputs
    step = (peaks.abs().amax(2) / levels).repeat_interleave(GROUP, 1)[:, : w.shape[1]]
    assert bool(((back["w"] - w).abs() <= step / 2 * 1.01 + 1e-7).all())
    assert torch.equal(back["zero"], weights["zero"])
    bytes_per_weight = (stored["w"].numel() * stored["w"].element_size() + stored["w" + SCALES].numel()
                        * stored["w" + SCALES].element_size()) / w.numel()
    assert bytes_per_weight < {"int8": 1.04, "int6": 0.81, "int5": 0.69, "int4": 0.56}[kind]  # + its scales


def test_a_row_of_unlike_inputs_keeps_its_small_ones_and_the_per_row_layout_still_reads():
    """A scale per group: a row over [small embedding, large feature] inputs (EAGLE's fc) keeps the small
    half to its own step; the per-row int8 layout of earlier artefacts (int8, a float32 scale per row)
    still reads as integers x scales."""
    gen = torch.Generator().manual_seed(1)
    w = torch.cat([torch.randn(8, GROUP, generator=gen) * 1e-3, torch.randn(8, GROUP, generator=gen)], 1)
    back = restored_tensors(storage_tensors({"w": w}, quantize="int8"), "k", "here", "head")["w"]
    small = back[:, :GROUP] - w[:, :GROUP]
    assert float(small.abs().max()) <= float(w[:, :GROUP].abs().max()) / 254 * 1.01
    ints = torch.randint(-127, 128, (8, 2 * GROUP), generator=gen, dtype=torch.int8)
    scales = torch.rand(8, 1, generator=gen) + 0.5
    old = restored_tensors({"w": ints, "w" + SCALES: scales}, "k", "here", "head")["w"]
    assert torch.equal(old, ints.float() * scales)


@pytest.mark.parametrize("bad", ["zero", "nan", "negative", "shape", "orphan"])
def test_a_corrupt_scale_is_refused_in_one_line(bad):
    stored = storage_tensors(_weights(), quantize="int8")
    scales = stored["w" + SCALES]
    if bad == "zero":
        scales[3] = 0
    elif bad == "nan":
        scales[0] = float("nan")
    elif bad == "negative":
        scales[5] = -scales[5]
    elif bad == "shape":
        stored["w" + SCALES] = scales[:-1]
    else:
        stored["gone" + SCALES] = scales
    with pytest.raises(ConfigError, match=r"^drafter.head: here .*(corrupt quantized weight 'w'|scales 'gone::scales' "
                                          r"of no weight).*retrain or re-copy it\.$") as e:
        restored_tensors(stored, "drafter.head", "here", "head")
    assert "\n" not in str(e.value)


def test_quantize_takes_only_the_known_kinds():
    with pytest.raises(ConfigError, match=r"output.quantize='int3'; allowed values"):
        storage_tensors(_weights(), quantize="int3")


def test_a_corrupt_bit_width_is_refused():
    stored = storage_tensors(_weights(), quantize="int5")
    stored["w" + BITS] = torch.tensor([6, stored["w" + BITS][1]])
    with pytest.raises(ConfigError, match=r"corrupt quantized weight 'w' \(uint8"):
        restored_tensors(stored, "drafter.head", "here", "head")


def _head(model, train_head: bool):
    from spec_zoo.drafters.early_exit.adapter import ExitAdapter

    return ExitAdapter(model, 1, 1, vocab_ids=torch.tensor([0, 2, 3, 5]), train_head=train_head)


@pytest.mark.parametrize("quantize", ["int8", "int6", "int4", None])
def test_a_head_saved_in_each_storage_loads_as_it_was_within_the_storage_step(tmp_path, quantize):
    from spec_zoo.draft_head import load_head, save_head
    from spec_zoo.drafters.early_exit.adapter import ExitAdapter

    model = tiny_llama()
    head = _head(model, train_head=True)
    path = save_head(head, tmp_path / "adapter", describe_target(model, None), {}, quantize=quantize)
    record = json.loads((path / ExitAdapter.RECORD).read_text())
    assert record["format_version"] == 2 and record["quantize"] == quantize and "from_target" not in record
    loaded = load_head(ExitAdapter, path, model, "drafter.adapter", "spec-zoo-train early_exit")
    for name, want in head.state_dict().items():
        got = loaded.state_dict()[name]
        steps = {"int8": 254, "int6": 62, "int4": 14}
        tol = 0 if not want.is_floating_point() else (1e-3 if quantize is None or want.dim() < 2 else
                                                      want.abs().max() / steps[quantize] * 1.01)
        assert float((got.double() - want.double()).abs().max()) <= tol + 1e-6, name


def test_an_older_float16_head_still_loads(tmp_path):
    """format_version 1: every weight float16, no digest of the target's rows; read as it was."""
    from spec_zoo.draft_head import load_head, save_head
    from spec_zoo.drafters.early_exit.adapter import ExitAdapter

    model = tiny_llama()
    path = save_head(_head(model, train_head=False), tmp_path / "adapter", describe_target(model, None), {},
                     quantize=None)
    record = json.loads((path / ExitAdapter.RECORD).read_text())
    for field in ("quantize", "from_target"):
        del record[field]
    (path / ExitAdapter.RECORD).write_text(json.dumps({**record, "format_version": 1}))
    assert all(t.dtype in (torch.float16, torch.int64) for t in load_file(str(path / ExitAdapter.WEIGHTS)).values())
    loaded = load_head(ExitAdapter, path, model, "drafter.adapter", "spec-zoo-train early_exit")
    assert loaded.record["format_version"] == 1 and torch.equal(loaded.head, model.lm_head.weight[[0, 2, 3, 5]])


def test_a_head_whose_target_rows_changed_is_refused_by_digest(tmp_path):
    from spec_zoo.draft_head import load_head, save_head
    from spec_zoo.drafters.early_exit.adapter import ExitAdapter

    model = tiny_llama()
    path = save_head(_head(model, train_head=False), tmp_path / "adapter", describe_target(model, None), {})
    record = json.loads((path / ExitAdapter.RECORD).read_text())
    assert set(record["from_target"]["lm_head_rows"]) == {"bfloat16", "float16"}
    assert not any(k == "head" for k in load_file(str(path / ExitAdapter.WEIGHTS)))  # the rows are not stored
    load_head(ExitAdapter, path, model, "drafter.adapter", "spec-zoo-train early_exit")
    with torch.no_grad():
        model.lm_head.weight[3, 0] += 0.25  # a row of its draft vocabulary: the fingerprint does not see it
    with pytest.raises(ConfigError, match=r"^drafter.adapter='.*' takes lm_head_rows from the target, but this "
                                          r"target's lm_head_rows differ from those the exit-adapter was made with "
                                          r"\(SHA-256 of its bfloat16 values\); use one made for this target "
                                          r"\(`spec-zoo-train early_exit`\)\.$"):
        load_head(ExitAdapter, path, model, "drafter.adapter", "spec-zoo-train early_exit")


def _distilled(model, tmp_path, **save):
    from spec_zoo.drafters.distilled.student import save_artefact, student_from_target

    student = student_from_target(model, 1, None, torch.tensor([0, *range(2, model.lm_head.weight.shape[0])]))
    path = save_artefact(student, tmp_path / "draft", {"target": describe_target(model, "tiny"),
                                                       "init": {"kind": "target", "layers": 1}}, **save)
    return student, path


def test_a_distilled_draft_stores_no_embeddings_and_checks_the_targets(tmp_path):
    from spec_zoo.drafters.distilled.drafter import DistilledDrafter
    from spec_zoo.runtime.target import Target

    model = tiny_llama()
    student, path = _distilled(model, tmp_path)
    stored = load_file(str(path / "model.safetensors"))
    assert "model.embed_tokens.weight" not in stored and stored["lm_head.weight"].dtype == torch.uint8
    record = json.loads((path / "distill.json").read_text())
    assert record["format_version"] == 2 and record["quantize"] == "int8"
    assert "input_embeddings" in record["from_target"]
    drafter = DistilledDrafter(path)
    drafter.attach(Target(model))
    plugged = drafter.runner.model.model.embed_tokens.weight  # the target's (a float32 copy of this float64 one)
    assert torch.equal(plugged, model.get_input_embeddings().weight.float())
    want = student.lm.state_dict()["model.layers.0.mlp.up_proj.weight"]
    got = drafter.runner.model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    assert float((got - want).abs().max()) <= float(want.abs().max()) / 254 * 1.01
    with torch.no_grad():
        model.get_input_embeddings().weight[1, 0] += 0.25
    with pytest.raises(ConfigError, match=r"takes input_embeddings from the target, but this target's "
                                          r"input_embeddings differ from those the distilled draft was made with"):
        DistilledDrafter(path).attach(Target(model))


def test_an_older_distilled_draft_with_its_own_embedding_rows_still_loads(tmp_path):
    """format_version 1: a plain HF model dir (float16, ``embed_tokens`` = the target's rows)."""
    from spec_zoo.drafters.distilled.drafter import DistilledDrafter
    from spec_zoo.runtime.target import Target

    model = tiny_llama()
    student, path = _distilled(model, tmp_path, quantize=None)
    lm = student.lm.to(torch.float16)
    weights = {k: v.contiguous() for k, v in lm.state_dict().items()}
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    record = json.loads((path / "distill.json").read_text())
    for field in ("quantize", "from_target"):
        del record[field]
    (path / "distill.json").write_text(json.dumps({**record, "format_version": 1}))
    drafter = DistilledDrafter(path)
    drafter.attach(Target(model))
    assert drafter.record["format_version"] == 1
    got = drafter.runner.model.state_dict()["lm_head.weight"]
    assert torch.equal(got, weights["lm_head.weight"].float())


def test_requantize_rewrites_a_parallel_draft_and_its_base_and_names_the_new_base_digest(tmp_path):
    from spec_zoo.drafters.parallel.drafter import ParallelDrafter
    from spec_zoo.drafters.parallel.model import RECORD, save_parallel, weights_digest
    from spec_zoo.runtime.target import Target
    from spec_zoo.train.requantize import requantize

    model = tiny_llama()
    student, base = _distilled(model, tmp_path, quantize=None)
    gen = torch.Generator().manual_seed(1)
    updates = {n: (torch.randn(w.shape[0], 2, generator=gen) / 2, torch.randn(2, w.shape[1], generator=gen) / 8)
               for n, w in student.lm.named_parameters() if ".layers." in n and w.dim() == 2}
    old = weights_digest(base)
    record = {"target": describe_target(model, "tiny"), "base": {"path": str(base), "sha256": old}}
    parallel = save_parallel(tmp_path / "parallel", torch.randn(2, model.config.hidden_size, generator=gen), updates,
                             record, quantize=None)
    with pytest.raises(ConfigError, match="no spec-zoo artefact"):
        requantize([tmp_path], model, "int8")
    assert requantize([parallel, base], model, "int8") == [base, parallel]
    rewritten = json.loads((parallel / RECORD).read_text())
    assert rewritten["quantize"] == "int8" and rewritten["base"]["requantized_from"] == old
    assert rewritten["base"]["sha256"] == weights_digest(base) != old
    ParallelDrafter(parallel).attach(Target(model))
    with pytest.raises(ConfigError, match="missing or has changed since"):
        requantize([base], model, "int4") and ParallelDrafter(parallel)


def test_a_trained_output_layer_is_stored_at_its_own_width_and_requantize_sets_it(tmp_path):
    """`quantize_head`: the head's draft-vocabulary rows at their own width, the rest at ``quantize``
    (the shipped EAGLE head: int8 with its output layer at int6, docs/training.md); the record says so,
    and a rewrite without it stores the rows at ``quantize`` again."""
    from spec_zoo.draft_head import load_head, save_head
    from spec_zoo.drafters.early_exit.adapter import ExitAdapter
    from spec_zoo.train.requantize import requantize

    model = tiny_llama()
    head = _head(model, train_head=True)
    path = save_head(head, tmp_path / "adapter", describe_target(model, None), {}, quantize="int8",
                     quantize_head="int4")
    record = json.loads((path / ExitAdapter.RECORD).read_text())
    assert (record["quantize"], record["quantize_head"], record["group"]) == ("int8", "int4", GROUP)
    stored = load_file(str(path / ExitAdapter.WEIGHTS))
    widths = {n.removesuffix(BITS): int(t[0]) for n, t in stored.items() if n.endswith(BITS)}
    assert widths.pop("head") == 4 and set(widths.values()) == {8}
    loaded = load_head(ExitAdapter, path, model, "drafter.adapter", "spec-zoo-train early_exit")
    assert float((loaded.head - head.head).abs().max()) <= float(head.head.abs().max()) / 14 * 1.01
    requantize([path], model, "int8")
    record = json.loads((path / ExitAdapter.RECORD).read_text())
    assert "quantize_head" not in record and record["requantized_from"]["quantize_head"] == "int4"
    assert int(load_file(str(path / ExitAdapter.WEIGHTS))["head" + BITS][0]) == 8
    with pytest.raises(ConfigError, match=r"output.quantize for head='int3'; allowed values"):
        save_head(head, tmp_path / "other", describe_target(model, None), {}, quantize_head="int3")
