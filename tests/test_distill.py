"""Distillation (`spec-zoo-train distill`) and the `distilled` drafter, on tiny random targets:
training end to end (loss falls, acceptance rises, the artefact reloads, resume),
greedy identity and sampling exactness with a reduced draft vocabulary, and clear
errors for mismatched or corrupt drafts."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from spec_zoo import Draft, SpeculativeDecoder, Target
from spec_zoo.artefacts import describe_target
from spec_zoo.bench.specs import resolve_methods
from spec_zoo.drafters.distilled.drafter import DistilledDrafter
from spec_zoo.drafters.distilled.student import save_artefact, student_from_target
from spec_zoo.drafters.distilled.train import distill
from spec_zoo.errors import ConfigError
from spec_zoo.registry import CONF_DIR
from spec_zoo.testing import CERTIFY_SETTINGS, VOCAB, assert_lossless, certify_model
from spec_zoo.train.losses import divergence
from spec_zoo.verifiers.greedy import GreedyVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.tiny import hf_greedy, one_thread, tiny_llama  # noqa: F401 (autouse fixture)


def _teacher(seed: int = 3):
    model = tiny_llama(seed, vocab=64, layers=3, sharpness=3.0, dtype=torch.float32)
    model.generation_config.eos_token_id = 1
    return model


def _prompts(n: int = 48, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 64, (int(torch.randint(3, 9, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n)]


def _cfg(tmp_path, *overrides, prompts=None):
    base = [
        "data.max_new_tokens=16", "data.heldout=0.25", "data.batch_size=8", "data.top_k=16",
        "student.layers=1", "student.vocab_size=48", "student.init=random",
        "train.steps=40", "train.batch_size=8", "train.lr=1e-2", "train.warmup=4", "train.eval_every=10",
        "train.ckpt_every=10", f"output.dir={tmp_path / 'draft'}", f"data.cache_dir={tmp_path / 'cache'}",
        "output.dtype=float32", "output.quantize=null", "progress=false", "threads=1",  # exact weights to compare
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train_distill", overrides=base + list(overrides))
    OmegaConf.update(cfg, "data.token_ids", prompts or _prompts())
    return cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distill")
    model = _teacher()
    path = distill(_cfg(tmp), target=Target(model))
    return model, path, tmp


def test_training_lowers_loss_and_raises_acceptance(trained):
    _, path, _ = trained
    record = json.loads((path / "distill.json").read_text())
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < before["loss"]
    assert after["alpha_greedy"] > before["alpha_greedy"] + 0.05
    assert after["alpha_sampled"] > before["alpha_sampled"]
    assert record["steps"] == 40 and record["loss"] == "tvd" and len(record["draft_vocab"]) == 48
    assert record["target"]["vocab_size"] == 64 and record["data"]["positions"] > 0
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def test_artefact_reloads_and_drafts(trained):
    model, path, _ = trained
    drafter = DistilledDrafter(path, num_draft=3, dtype="float32")
    out = SpeculativeDecoder(Target(model), drafter).generate([5, 6, 7], max_new_tokens=20, eos_token_ids=[])
    assert out.ids == hf_greedy(model, [5, 6, 7], 20)
    assert out.stats.alpha is not None and out.stats.alpha > 0


def test_untrained_is_the_initialisation(trained, tmp_path):
    _, path, _ = trained
    with pytest.raises(ConfigError, match="student.init=target"):  # random layers cannot be rebuilt
        DistilledDrafter(path, untrained=True)
    model = tiny_llama(0)
    vocab = torch.arange(10, 58)
    noisy = _artefact(model, tmp_path / "d", vocab, noise=1.0)
    drafter = DistilledDrafter(noisy, untrained=True, dtype="float64")
    drafter.attach(Target(model))
    assert torch.equal(drafter.runner.model.lm_head.weight, model.lm_head.weight[vocab])
    assert torch.equal(drafter.runner.model.model.layers[0].mlp.up_proj.weight,
                       model.model.layers[0].mlp.up_proj.weight)


def test_same_seed_same_draft_and_a_changed_config_is_not_resumed(tmp_path):
    model = _teacher()
    a = distill(_cfg(tmp_path / "a", "train.steps=12"), target=Target(model))
    b1 = distill(_cfg(tmp_path / "b", "train.steps=8", "train.keep_checkpoints=true", "train.ckpt_every=4"),
                 target=Target(model))
    assert (b1.parent / ".draft.checkpoints" / "last.safetensors").is_file()
    with pytest.raises(ConfigError, match=r"another config \(train.steps=8 there, 12 here\).*train.resume=false"):
        distill(_cfg(tmp_path / "b", "train.steps=12"), target=Target(model))  # another LR schedule
    a2 = distill(_cfg(tmp_path / "a2", "train.steps=12"), target=Target(model))
    from safetensors.torch import load_file

    sa, sa2 = load_file(a / "model.safetensors"), load_file(a2 / "model.safetensors")
    assert all(torch.equal(sa[k], sa2[k]) for k in sa)


class _Killed(Exception):
    """The run stopped right after a checkpoint, as a killed process would."""


def test_interrupted_run_resumed_equals_the_uninterrupted_one(tmp_path, monkeypatch, capsys):
    """Same config both times: the resumed run restores weights, optimizer, sampler position and
    the loss average, so its draft and its history are bit-for-bit those of a run never stopped."""
    from safetensors.torch import load_file

    import spec_zoo.train.loop as loop

    model = _teacher()
    args = ("train.steps=12", "train.ckpt_every=4", "train.eval_every=3")
    a = distill(_cfg(tmp_path / "a", *args), target=Target(model))
    save = loop._save_checkpoint

    def save_then_die(*a_, **k):
        save(*a_, **k)
        raise _Killed

    monkeypatch.setattr(loop, "_save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        distill(_cfg(tmp_path / "b", *args), target=Target(model))
    monkeypatch.setattr(loop, "_save_checkpoint", save)
    capsys.readouterr()
    b = distill(_cfg(tmp_path / "b", *args), target=Target(model))
    assert "at step 4" in capsys.readouterr().err  # it resumed, not started over
    sa, sb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ra, rb = (json.loads((d / "distill.json").read_text()) for d in (a, b))
    assert ra["history"] == rb["history"] and ra["heldout_after"] == rb["heldout_after"]


def test_a_run_in_stretches_of_train_budget_s_equals_one_run(tmp_path, capsys):
    """``train.budget_s`` stops (checkpointed) after every step here; rerunning the same command
    continues, until the draft is written: the one an uninterrupted run writes, whose record
    counts the training time of every stretch."""
    from safetensors.torch import load_file

    import spec_zoo.train.loop as loop

    model = _teacher()
    args = ("train.steps=5", "train.eval_every=2")
    a = distill(_cfg(tmp_path / "a", *args), target=Target(model))
    spent = [0.0]  # training seconds so far, as each stretch's checkpoint says
    def stretch():
        return distill(_cfg(tmp_path / "b", *args, "train.budget_s=1e-9"), target=Target(model))

    while (out := stretch()).name == "last.safetensors":
        spent.append(loop._read_checkpoint(out)["seconds"])
        assert "rerun the same command" in capsys.readouterr().err
    assert len(spent) == 5  # steps 1..4 each end a stretch; step 5 ends the run
    assert spent == sorted(set(spent))  # each stretch adds its time to the earlier ones'
    record = json.loads((out / "distill.json").read_text())
    assert record["time_s"]["train"] >= round(spent[-1], 3) > 0
    sa, sb = load_file(a / "model.safetensors"), load_file(out / "model.safetensors")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not (out.parent / ".draft.checkpoints").exists()  # the finished run cleans up


def test_data_budget_s_stops_the_command_before_training_and_reruns_finish_the_run(tmp_path, monkeypatch, capsys):
    """``spec-zoo-train distill data.budget_s=...`` spent after the first shard: the command ends
    (exit 0) with the message, trains nothing on the part it has; rerun, it goes on from the
    store and ends with the draft an uninterrupted run writes."""
    import sys

    from safetensors.torch import load_file

    import spec_zoo.train.loop as loop
    from spec_zoo.train.cli import main
    from spec_zoo.train.store import TeacherSet

    model, prompts = _teacher(), _prompts(32)
    monkeypatch.setattr(TeacherSet, "shard_prompts", 16)
    monkeypatch.setattr(loop, "load_teacher_target", lambda cfg: Target(model))
    monkeypatch.chdir(tmp_path)
    a = distill(_cfg(tmp_path / "a", "train.steps=5", prompts=prompts), target=Target(model))
    b = tmp_path / "b"
    args = ["spec-zoo-train", "distill", "data.max_new_tokens=16", "data.heldout=0.25", "data.batch_size=8",
            "data.top_k=16", "student.layers=1", "student.vocab_size=48", "student.init=random", "train.steps=5",
            "train.batch_size=8", "train.lr=1e-2", "train.warmup=4", "train.eval_every=10", "train.ckpt_every=10",
            f"output.dir={b / 'draft'}", f"data.cache_dir={b / 'cache'}", "output.dtype=float32",
            "output.quantize=null", "progress=false", "threads=1",
            f"data.token_ids={json.dumps(prompts).replace(' ', '')}", "data.budget_s=1e-9"]
    monkeypatch.setattr(sys, "argv", list(args))
    main()  # returns: exit status 0
    out = capsys.readouterr()
    assert "data.budget_s=1e-09: teacher data of 16 of 32 prompts done in " in out.err
    assert "rerun the same command to continue" in out.err and out.out == ""
    assert not (b / "draft").exists() and not (b / ".draft.checkpoints").exists()  # nothing trained on the part
    monkeypatch.setattr(sys, "argv", list(args))
    main()  # the last shard: the store is whole, training runs
    assert "teacher data of" not in capsys.readouterr().err
    sa, sb = load_file(a / "model.safetensors"), load_file(b / "draft" / "model.safetensors")
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_negative_data_budget_s_is_refused_before_the_target_loads(tmp_path, monkeypatch):
    import spec_zoo.train.loop as loop

    monkeypatch.setattr(loop, "load_teacher_target", lambda cfg: pytest.fail("loaded a model"))
    with pytest.raises(ConfigError, match=r"data.budget_s=-5; use 0 \(no budget\)"):
        distill(_cfg(tmp_path, "data.budget_s=-5"))


@pytest.mark.parametrize("other", ["train.patience=2", "train.max_seconds=60"])
def test_budget_s_refuses_what_a_checkpoint_does_not_keep(tmp_path, other):
    with pytest.raises(ConfigError, match="train.budget_s .*not checkpointed.*train.budget_s=0"):
        distill(_cfg(tmp_path, "train.budget_s=30", other), target=Target(_teacher()))


@pytest.mark.parametrize("loss", ["fkl", "rkl", "tvd"])
def test_losses_are_zero_at_the_teacher_and_positive_elsewhere(loss):
    logits = torch.randn(5, 10) * 2
    t_logp, t_ids = logits.log_softmax(-1).topk(10)
    assert divergence(logits, t_ids, t_logp, loss).abs().max() < 1e-5
    other = divergence(torch.randn(5, 10), t_ids, t_logp, loss)
    assert (other > 0).all()
    # top-k truncation: a lower bound of the full value
    truncated = divergence(torch.randn(5, 10), t_ids[:, :3], t_logp[:, :3], loss)
    assert torch.isfinite(truncated).all() and (truncated >= 0).all()


def test_scoring_matches_generation():
    """The teacher-forced scoring of student data gives the same distributions as generation."""
    from spec_zoo.train.data import generate_batch, score_continuations

    model = _teacher()
    prompts = _prompts(4)
    gen = generate_batch(model, prompts, 8, 5, 0.0, [], 0, 0)
    cont = [gen["ids"][i, len(p) : len(p) + 8].tolist() for i, p in enumerate(prompts)]
    scored = score_continuations(model, prompts, cont, 5, 8)
    assert torch.equal(scored["topk_ids"], gen["topk_ids"])
    assert torch.allclose(scored["topk_logp"].float(), gen["topk_logp"].float(), atol=1e-2)


def test_student_written_data(tmp_path):
    """data.student_fraction: the student's own continuations, scored by the target, join the data."""
    model = _teacher()
    out = distill(_cfg(tmp_path, "data.student_fraction=0.5", "train.steps=20", "data.top_k=0"), target=Target(model))
    rec = json.loads((out / "distill.json").read_text())
    assert rec["data"]["student_sequences"] == 18 and rec["data"]["train_sequences"] == 36 + 18
    assert rec["heldout_after"]["loss"] < rec["heldout_before"]["loss"]


@pytest.mark.parametrize("loss", ["fkl", "rkl", "tvd"])
def test_loss_gradients_are_finite_when_the_draft_covers_the_top_k(loss):
    """All of q's mass inside the teacher's top-k (q_rest = 0, the RKL NaN trap)."""
    t_logp, t_ids = torch.randn(4, 10).log_softmax(-1).topk(5)
    logits = torch.full((4, 10), -30.0)
    logits.scatter_(1, t_ids, 5.0)
    logits.requires_grad_(True)
    divergence(logits, t_ids, t_logp, loss).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_lora_adapts_an_existing_draft(trained, tmp_path):
    model, path, _ = trained
    cfg = _cfg(tmp_path, "student.init=pretrained", f"student.path={path}", "student.lora.enabled=true",
               "student.lora.r=4", "train.steps=6")
    out = distill(cfg, target=Target(model))
    rec = json.loads((out / "distill.json").read_text())
    assert rec["init"]["kind"] == "pretrained" and rec["init"]["lora"]["enabled"]
    assert len(rec["draft_vocab"]) == 48
    decoder = SpeculativeDecoder(Target(model), DistilledDrafter(out, dtype="float32"))
    assert decoder.generate([4, 5], max_new_tokens=10, eos_token_ids=[]).ids == hf_greedy(model, [4, 5], 10)


# -- reduced-vocabulary drafts stay exact --------------------------------------------


def _artefact(model, path, vocab_ids, layers=1, noise=0.0):
    student = student_from_target(model, layers, None, vocab_ids)
    if noise:
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            w = student.lm.lm_head.weight
            w.add_(noise * w.std() * torch.randn(w.shape, generator=g))
    record = {"target": describe_target(model, "tiny"),
              "init": {"kind": "target", "layers": layers, "copy_layers": None}}
    return save_artefact(student, path, record, dtype="float64")


@pytest.mark.parametrize("verifier", [GreedyVerifier, RejectionVerifier])
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("seed", [0, 1])
def test_distilled_greedy_identity(tmp_path, seed, shape, verifier):
    model = tiny_llama(seed, sharpness=3.0)
    vocab = torch.arange(0, 64, 4).tolist() + torch.arange(1, 64, 2).tolist()  # 48 of 64 tokens
    path = _artefact(model, tmp_path / "d", torch.tensor(sorted(set(vocab))), layers=1)
    kw = dict(tree_width=2, tree_depth=3) if shape == "tree" else dict(num_draft=4, adaptive=True, max_draft=8)
    drafter = DistilledDrafter(path, dtype="float64", sample=False, **kw)
    prompt = [5, 9, 13, 5, 9, 13, 22, 40]
    out = SpeculativeDecoder(Target(model), drafter, verifier()).generate(prompt, max_new_tokens=40, eos_token_ids=[])
    assert out.ids == hf_greedy(model, prompt, 40)


@pytest.fixture(scope="module")
def small_vocab_model():
    return tiny_llama(21, vocab=VOCAB, sharpness=6.0)


@pytest.mark.parametrize("shape,setting", [("chain", "t1"), ("tree", "t0.7_topk3_topp0.75"),
                                           ("chain", "t0.7_topk3_topp0.75")])
def test_distilled_sampling_is_exact(tmp_path, shape, setting):
    """A draft whose vocabulary misses 1 of the 4 tokens: q is 0 there, and rejection
    sampling still gives exactly the target's law (enumerated), drafts partly accepted."""
    model = certify_model()
    path = _artefact(model, tmp_path / "d", torch.tensor([0, 2, 3]), noise=0.5)
    kw = dict(tree_width=2, tree_depth=3) if shape == "tree" else dict(num_draft=3)
    pristine = DistilledDrafter(path, dtype="float64", **kw)
    cert = assert_lossless(lambda m: copy.deepcopy(pristine), sampling=CERTIFY_SETTINGS[setting], model=model)
    assert cert.tau > 1


def test_q_is_zero_outside_the_draft_vocabulary(tmp_path, small_vocab_model):
    path = _artefact(small_vocab_model, tmp_path / "d", torch.tensor([0, 2, 3, 6]))
    drafter = DistilledDrafter(path, dtype="float64", num_draft=2)
    drafter.attach(Target(small_vocab_model))
    drafter.runner.reset()
    logits = drafter.to_target_vocab(drafter.runner.score([2, 3, 4], Draft.empty()).logits)
    probs = logits.softmax(-1)
    assert logits.shape[-1] == VOCAB and probs[:, [1, 4, 5, 7]].abs().max() == 0
    assert torch.allclose(probs.sum(-1), torch.ones(1, dtype=probs.dtype))


# -- clear errors --------------------------------------------------------------------


def test_refuses_a_draft_for_another_target(tmp_path):
    path = _artefact(tiny_llama(0), tmp_path / "d", torch.arange(48))
    drafter = DistilledDrafter(path, dtype="float64")
    with pytest.raises(ConfigError, match="trained for target 'tiny'.*embedding weights differ"):
        SpeculativeDecoder(Target(tiny_llama(1)), drafter)
    with pytest.raises(ConfigError, match="vocab_size 64 vs 32"):
        SpeculativeDecoder(Target(tiny_llama(0, vocab=32)), DistilledDrafter(path, dtype="float64"))


def test_corrupt_or_incomplete_drafts_fail_clearly(tmp_path):
    model = tiny_llama(0)
    path = _artefact(model, tmp_path / "d", torch.arange(48))
    with pytest.raises(ConfigError, match="not a directory"):
        DistilledDrafter(tmp_path / "nowhere")
    record = path / "distill.json"
    good = record.read_text()
    record.write_text(good[: len(good) // 2])
    with pytest.raises(ConfigError, match="distill.json is corrupt"):
        DistilledDrafter(path)
    rec = json.loads(good)
    rec["draft_vocab"] = rec["draft_vocab"][:40]
    record.write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="do not belong together"):
        DistilledDrafter(path)
    record.write_text(good)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ConfigError, match="corrupt or incomplete"):
        DistilledDrafter(path)
    record.unlink()
    with pytest.raises(ConfigError, match="not a distilled draft"):
        DistilledDrafter(path)


def test_corrupt_checkpoint_fails_clearly(tmp_path):
    cfg = _cfg(tmp_path, "train.steps=4")
    ckpt = tmp_path / ".draft.checkpoints" / "last.safetensors"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="is corrupt.*train.resume=false"):
        distill(cfg, target=Target(_teacher()))


@pytest.mark.parametrize("override,key", [
    ("loss=kl", "loss="), ("student.init=teacher", "student.init="), ("train.steps=-1", "train.steps="),
    ("student.lora.enabled=true", "student.lora.enabled"), ("data.heldout=1.5", "data.heldout="),
    ("data.student_fraction=2", "data.student_fraction="),
])
def test_bad_config_fails_before_any_model_load(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        distill(_cfg(tmp_path, override), target="not loaded")


def test_drafter_configs_compose():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for name in ("distilled", "distilled_tree"):
            cfg = compose("config", overrides=[f"drafter={name}"])
            assert cfg.drafter._target_ == "spec_zoo.drafters.distilled.DistilledDrafter"
        assert compose("config", overrides=["drafter=distilled_tree"]).drafter.tree_depth > 0


def test_bench_experiment_preset():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("bench", overrides=["+experiment=distill"])
    assert list(cfg.methods) == ["ar", "distilled", "distilled_tree", "draft_untrained", "truncated_target", "eagle",
                                 "eagle_k3"]
    assert cfg.dataset.per_category == 3 and cfg.generation.max_new_tokens == 128
    specs = {s.name: s for s in resolve_methods(cfg.methods, cfg.default_methods, cfg)[0]}
    assert specs["eagle_k3"].drafter["_target_"] == "spec_zoo.drafters.eagle.EagleDrafter"
    assert specs["eagle_k3"].params == {"num_draft": 3, "adaptive": False}


def test_shipped_draft_loads_and_refuses_another_target():
    drafter = DistilledDrafter()  # the draft shipped for SmolLM2-135M
    assert drafter.record["target"]["name"] == "smollm2-135m" and len(drafter.record["draft_vocab"]) == 8192
    with pytest.raises(ConfigError, match="trained for target 'smollm2-135m'.*vocab_size 49152 vs 64"):
        drafter.attach(Target(tiny_llama(0)))


@pytest.mark.real_model
@pytest.mark.parametrize("drafter", ["distilled", "distilled_tree", "draft_untrained"])
def test_shipped_draft_is_lossless_on_the_real_target(smollm2_target, drafter):
    from spec_zoo.drafters.distilled.drafter import DistilledDrafter as D

    make = {"distilled": lambda: D(), "distilled_tree": lambda: D(tree_width=2, tree_depth=3),
            "draft_untrained": lambda: D(untrained=True)}[drafter]
    plain = SpeculativeDecoder(smollm2_target)
    prompt = plain.encode("Name three colours.")
    reference = plain.generate(prompt, max_new_tokens=24).ids
    out = SpeculativeDecoder(smollm2_target, make()).generate(prompt, max_new_tokens=24)
    assert out.ids == reference


def test_bfloat16_training_runs_and_learns(tmp_path, capsys):
    model = _teacher()
    out = distill(_cfg(tmp_path, "train.dtype=bfloat16", "train.steps=20"), target=Target(model))
    assert "-> bfloat16" in capsys.readouterr().err
    record = json.loads((out / "distill.json").read_text())
    assert record["heldout_after"]["loss"] < record["heldout_before"]["loss"]
    from safetensors.torch import load_file

    bf16 = load_file(out / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in bf16.values())  # float32 master weights, output.dtype=float32
    fp32 = load_file(distill(_cfg(tmp_path / "fp32", "train.steps=20"), target=Target(model)) / "model.safetensors")
    assert any(not torch.equal(bf16[k], fp32[k]) for k in bf16)  # the bf16 path really ran (rounding differs)


@pytest.mark.parametrize(("isa", "want"), [("amx", torch.bfloat16), ("avx512-bf16", torch.bfloat16),
                                           ("avx512", torch.float32), ("avx2", torch.float32),
                                           ("portable", torch.float32)])
def test_train_dtype_auto_takes_bfloat16_where_the_cpu_has_a_bf16_unit(monkeypatch, isa, want):
    import spec_zoo.runtime.cpp_kernels
    from spec_zoo.train.loop import compute_dtype

    monkeypatch.setattr(spec_zoo.runtime.cpp_kernels, "host_isa", lambda: isa)
    cfg = OmegaConf.create({"train": {"dtype": "auto"}})
    assert compute_dtype(cfg, torch.device("cpu")) == want
    assert compute_dtype(OmegaConf.create({"train": {"dtype": "float32"}}), torch.device("cpu")) == torch.float32
