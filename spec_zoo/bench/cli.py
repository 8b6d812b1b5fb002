"""``spec-zoo-bench``: the Hydra entry point (conf/bench.yaml). Validates everything cheap
(dataset, methods, sampling, model config) before loading a model, then runs the
benchmark into ``out/results.jsonl`` and writes ``out/summary.md``."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from spec_zoo.api import CONF_DIR
from spec_zoo.bench.dataset import load_questions, prompt_encoder
from spec_zoo.bench.methods import build_method, resolve_methods
from spec_zoo.bench.runner import run_benchmark, run_context
from spec_zoo.bench.summary import Summary, summarize, summarize_file
from spec_zoo.cli import _quiet_transformers
from spec_zoo.errors import ConfigError
from spec_zoo.sampling import SamplingParams


def write_summary(summary: Summary, out_dir) -> Path:
    """Write ``summary.md`` into ``out_dir``, print it, and return its path."""
    path = Path(out_dir) / "summary.md"
    text = summary.to_markdown()
    path.write_text(text, encoding="utf-8")
    print(text)
    print(f"summary written to {path}")
    return path


def bench(cfg: DictConfig) -> Summary:
    """Run (or, with ``summarize=PATH``, only summarize) the benchmark described by ``cfg``."""
    if cfg.summarize:
        results = Path(cfg.summarize)
        if not results.is_file():
            raise ConfigError(f"summarize={cfg.summarize} is not a file; pass the path of a results.jsonl.")
        summary = summarize_file(results)
        write_summary(summary, results.parent)
        return summary

    from spec_zoo.decoder import SpeculativeDecoder
    from spec_zoo.models import check_model_config, load_target

    data, gen = cfg.dataset, cfg.generation
    questions = load_questions(data.name, data.path, data.per_category, data.categories)
    if cfg.repeats < 1:
        raise ConfigError(f"repeats={cfg.repeats}; it must be a positive integer.")
    sampling = SamplingParams(gen.temperature, gen.top_k, gen.top_p)
    specs, notes = resolve_methods(OmegaConf.to_container(cfg.methods) if cfg.methods is not None else None,
                                   list(cfg.default_methods), cfg)
    check_model_config(cfg.model)
    for note in notes:
        print(note)
    print(f"{len(questions)} questions x {len(specs)} methods ({', '.join(s.name for s in specs)}) "
          f"x {cfg.repeats} repeat(s)")

    target = load_target(**cfg.model)
    plain = SpeculativeDecoder(target, sampling=sampling)  # encodes prompts; its EOS set serves every method
    eos = sorted(plain._eos_ids())
    run_settings = {"model": OmegaConf.to_container(cfg.model), "generation": OmegaConf.to_container(gen),
                    "dataset": {"name": data.name, "path": data.path}, "seed": cfg.seed}
    methods = [build_method(s, target, sampling, s.config_hash(run_settings), cfg.seed, gen.stop_strings, eos)
               for s in specs]
    out = Path(cfg.out)
    records = run_benchmark(
        methods, questions, prompt_encoder(plain, gen.chat), out / "results.jsonl",
        target=target, context=run_context(cfg.model.name, data.name, sampling.temperature, target.device),
        max_new_tokens=gen.max_new_tokens, repeats=cfg.repeats, seed=cfg.seed, greedy=sampling.greedy,
        warmup_tokens=cfg.warmup_tokens, progress=cfg.progress,
    )
    summary = summarize(records)
    write_summary(summary, out)
    return summary


@hydra.main(config_path=CONF_DIR, config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    _quiet_transformers()  # load bars and per-call generate() notices would bury the progress bar
    try:
        bench(cfg)
    except ConfigError as err:
        print(f"spec-zoo-bench: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
