"""Command-line entry points: ``spec-zoo`` (Hydra) and ``spec-zoo-make-draft``."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import cast

import hydra
from omegaconf import DictConfig

from spec_zoo.api import build_decoder, compile_ahead, label, quiet_loading, run
from spec_zoo.batch_run import cut_note
from spec_zoo.decoder import Output, SpeculativeDecoder
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import Drafter
from spec_zoo.registry import CONF_DIR, build_option
from spec_zoo.schema import Keys, check_command_line


def _fail(error: ConfigError) -> None:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    """Generate ``prompt`` with the configured target, drafter and verifier, stream the
    text, then print one summary line (tau, alpha, speed)."""
    from hydra.core.hydra_config import HydraConfig

    drafter_choice = HydraConfig.get().runtime.choices.get("drafter")
    if cfg.get("prompts_file") is not None:
        return _batch_main(cfg, drafter_choice)
    try:
        if cfg.get("out"):
            raise ConfigError(f"out: {cfg.out} keeps the results of a prompts_file run, and this run has one prompt, "
                              "whose text is printed; give prompts_file=FILE (one prompt per line) to keep results "
                              "in out=, or drop out=.")
        with quiet_loading():  # progress bars and load reports would interleave with the text
            decoder = build_decoder(cfg)
            # text streams as it is committed; a target without a tokenizer (a bare local model) gives ids
            texts = decoder.target.tokenizer is not None
            out = run(cfg, decoder, on_text=(lambda text: print(text, end="", flush=True)) if texts else None)
            plain = plain_run(cfg, decoder) if cfg.compare and not is_plain(decoder) else None
    except ConfigError as e:
        _fail(e)
    print(out.ids if not texts else "")
    print(f"{label(cfg, decoder, drafter_choice)} | {out.stats.summary()}{cut_note(out)}")
    if plain is not None:
        print(comparison(out, plain, greedy=decoder.sampling.temperature == 0))
    if compiled := compile_ahead(decoder):  # compiled when the decoder was built: this only says so
        print(compiled)


def _batch_main(cfg: DictConfig, drafter_choice: str | None) -> None:
    """``prompts_file=...``: every prompt through `spec_zoo.batch_run`, then (``compare``) the same
    requests decoded plainly, batched alike: the speedup, and how many texts are equal."""
    from spec_zoo.batch_run import done_requests, read_prompts, run_batch, run_settings

    try:
        if cfg.get("prompt_file") is not None:
            raise ConfigError("prompts_file: prompt_file is set too; give one prompt (prompt_file) or a file of "
                              "prompts (prompts_file), not both.")
        prompts = read_prompts(cfg.prompts_file)
        if cfg.out:
            done_requests(cfg.out, prompts, run_settings(cfg))  # refused now, before any model loads
        with quiet_loading():
            decoder = build_decoder(cfg, prompts=prompts)  # drafter=auto calibrates on the first few
            outputs, wall = run_batch(cfg, decoder, prompts)
            if not (cfg.compare and outputs and not is_plain(decoder)):
                print(label(cfg, decoder, drafter_choice))
                return
            plain = build_decoder(cfg, target=decoder.target, drafter=plain_drafter(), verifier=decoder.verifier,
                                  prompts=prompts)
            start = time.perf_counter()
            baseline = plain.generate_batch([o.prompt_ids for o in outputs], cfg.generation.max_new_tokens,
                                            cfg.generation.stop_strings, batch_size=cfg.batch_size)
            plain_wall = time.perf_counter() - start
    except ConfigError as e:
        _fail(e)
    tokens, plain_tokens = sum(len(o.ids) for o in outputs), sum(len(o.ids) for o in baseline)
    same = sum(o.ids == p.ids for o, p in zip(outputs, baseline))
    greedy = decoder.sampling.temperature == 0
    print(f"{label(cfg, decoder, drafter_choice)} | plain decoding (drafter=none) of the same {len(outputs)} requests, "
          f"batch_size={cfg.batch_size}: {plain_tokens / plain_wall:.1f} tok/s over the run | speedup "
          f"{tokens / wall / (plain_tokens / plain_wall):.2f}x | "
          + (f"same text: {same}/{len(outputs)}" if greedy else "sampled: texts differ by chance, not in distribution")
          + " (compare=false skips this run)")


def plain_drafter() -> Drafter:
    """The baseline's drafter (``drafter=none``), built by name: the core imports no method."""
    return build_option("drafter", "none")


def is_plain(decoder: SpeculativeDecoder) -> bool:
    """Whether ``decoder`` already decodes plainly (its drafter is the baseline's)."""
    return isinstance(decoder.drafter, type(plain_drafter()))


def plain_run(cfg: DictConfig, decoder: SpeculativeDecoder) -> Output:
    """The same prompt decoded plainly (no drafter) on the same target, verifier and sampling:
    the baseline the first run is measured against, so a user sees what speculation bought."""
    baseline = build_decoder(cfg, target=decoder.target, drafter=plain_drafter(), verifier=decoder.verifier)
    return run(cfg, baseline)


def comparison(out: Output, plain: Output, greedy: bool) -> str:
    """One line: plain decoding's figures, the speedup in tokens/s, and whether the texts agree
    (greedy decoding must give the same text; sampled texts are equal in distribution only)."""
    speedup = out.stats.tokens_per_s / plain.stats.tokens_per_s if plain.stats.tokens_per_s else float("nan")
    same = ("same text: yes" if out.ids == plain.ids else "same text: NO (report this: greedy speculation is exact)"
            ) if greedy else "sampled: texts differ by chance, not in distribution"
    p = plain.stats
    return (f"plain decoding (drafter=none) | {p.new_tokens} tokens in {p.wall_s:.2f} s ({p.tokens_per_s:.1f} tok/s) | "
            f"speedup {speedup:.2f}x | {same} (compare=false skips this run)")


def checked_command_line(config_name: str, prog: str = "error", keys: Keys | None = None) -> None:
    """Validate ``sys.argv`` for ``config_name`` (and the ``keys`` its command adds) before Hydra
    runs it; one line and exit 2 if bad."""
    try:
        check_command_line(config_name, sys.argv[1:], keys)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """``spec-zoo [group=option ...] [key=value ...]``; ``spec-zoo list``: what can be chosen."""
    from spec_zoo.registry import format_options, options, register_plugins

    try:
        register_plugins()  # installed drafters/verifiers become options before Hydra composes
        if sys.argv[1:] == ["list"]:
            print(format_options(options()))
            return
        if sys.argv[1:2] == ["show"]:
            print("\n".join(show_option(a) for a in sys.argv[2:] or ["drafter=none"]))
            return
        if sys.argv[1:2] in (["warmup"], ["costs"]):
            check_command_line("config", sys.argv[2:])  # the checks `spec-zoo` makes, before any model loads
            runtime_command(sys.argv[1], sys.argv[2:])
            return
    except ConfigError as e:
        _fail(e)
    if sys.argv[1:] in (["--help"], ["-h"]):
        print(usage())
        return
    checked_command_line("config")
    _hydra_main()


GROUPS = ("drafter", "verifier", "model", "generation")  # the groups `spec-zoo` composes


def runtime_command(command: str, overrides: list[str]) -> None:
    """``spec-zoo warmup [drafter=...] [model overrides]``: compile the target's graph and the
    draft's (where the drafter runs compiled) ahead of time, say how long each took and
    whether inductor's on-disk cache served it (`spec_zoo.runtime.compile_cache`: later processes
    then start in seconds). ``spec-zoo costs``: measure the scoring-cost table t(M) of the
    target on this machine (M = 1..32, after 100, 500 and 1,500 cached tokens; with
    ``drafter=...`` that drafter's cost per drafted level in steps t(1), kept beside the others
    measured before: added to the stored table, whose t(M) is measured only when there is none
    yet), save it where the adaptive draft length finds it, and plot it (PNG next to the JSON)."""
    from spec_zoo.api import build_decoder, compiled_parts, compose_config, load_checked_target
    from spec_zoo.costs import cached_table, measure, measure_draft, plot_table, set_aside_unreadable, table_path

    cfg = compose_config(overrides)
    if command == "warmup" and cfg.model.runtime == "auto":  # what a later model.runtime=auto run will find
        cfg.model.runtime = "compiled"
    with quiet_loading():
        target = load_checked_target(cfg.model)
    if command == "costs" and (aside := set_aside_unreadable(table_path(target))):  # the way out it names
        print(f"the stored cost table failed to load; kept it as {aside} and measuring a new one", file=sys.stderr)
    if command == "warmup":
        if not hasattr(target, "warm_up"):
            raise ConfigError("spec-zoo warmup: model.runtime=eager has nothing to compile; "
                              "pass model.runtime=compiled.")
        with quiet_loading():
            decoder = build_decoder(cfg, target=target)  # compiles: the drafter attached, its draft model or heads
        for name, part in compiled_parts(decoder):
            served = "from the cache" if part.compile_cached else "compiled afresh"  # type: ignore[attr-defined]
            print(f"{name}: compiled in {part.warm_up():.1f} s ({served})")  # type: ignore[attr-defined]
        return
    decoder = build_decoder(cfg, target=target)  # compiles what runs compiled: compiling is not drafting
    drafter = decoder.drafter
    key = getattr(getattr(drafter, "length", None), "cost_key", None)
    if drafter.name != "none" and key is None:
        raise ConfigError(f"spec-zoo costs drafter={drafter.name}: it has no draft length to price; measure its "
                          "members one by one (drafter=eagle, drafter=ngram, ...).")
    before = cached_table(target)
    # a drafter's cost joins the stored table; t(M) is measured when there is none or no drafter
    table = before if before is not None and key is not None else measure(target)
    table.drafts = dict(before.drafts) if before else {}  # other drafters' measured costs stay
    if key is not None:
        # t(1) now, at the table's context: the draft's cost is in steps of this moment's machine
        step = measure(target, max_tokens=1, contexts=[table.past], progress=False).seconds[0]
        prompt = [(7 * i) % target.vocab_size for i in range(table.past)]
        if decoder.cost_table is not None:  # draft as if unmeasured: a stored dear cost would stop the drafting
            decoder.cost_table = replace(decoder.cost_table, drafts={k: v for k, v in table.drafts.items() if k != key})
        seconds, levels = map(sum, zip(*(measure_draft(decoder, prompt) for _ in range(3))))
        if levels == 0:
            raise ConfigError(f"spec-zoo costs drafter={drafter.name}: it drafted nothing in three decodes of the "
                              "measuring prompt, so there is no cost per drafted level to store; give it a fixed "
                              "length (drafter.adaptive=false) and measure again.")
        table.drafts[key] = seconds / levels / step
    path = table.save(table_path(target))
    print(f"t(M) of {table.model} on {table.runtime}/{table.dtype}, {table.threads} thread(s):")
    for past, curve in table.curves().items():
        print(f"after {past} cached tokens: " + "  ".join(
            f"M={m}: {s * 1e3:.1f} ms ({s / curve[0]:.2f}x)" for m, s in enumerate(curve, 1)
            if m <= 8 or m in (12, 16, 24, 32)))
    if table.drafts:
        print("drafting, per drafted level, in target steps t(1): "
              + ", ".join(f"{name}: {cost:.3f}" for name, cost in sorted(table.drafts.items())))
    print(f"saved {path} and {plot_table(table, path.with_suffix('.png'))}")


def usage() -> str:
    """``spec-zoo --help``: the groups spec-zoo takes, with their options (Hydra's own help
    would list every folder of the config dir, bench presets included)."""
    from spec_zoo.registry import option_names

    lines = ["spec-zoo [group=option ...] [key=value ...]: speculative decoding of one prompt.", "",
             "Config groups (spec-zoo show group=option prints an option's keys with their comments):"]
    lines += [f"  {g:<11} {', '.join(option_names(g))}" for g in GROUPS]
    lines += ["", "Top-level keys: prompt (prompt=- reads stdin; quote commas: \"prompt='a, b'\"), prompt_file, seed;",
              "prompts_file=FILE batch_size=N out=RESULTS.jsonl: many requests, batched (docs/batching.md).",
              "Also: spec-zoo list (every drafter, verifier, bench method), spec-zoo --cfg job (the composed config),",
              "spec-zoo warmup model.runtime=compiled [drafter=...] (compile target and draft ahead of time), "
              "spec-zoo costs [model...] (measure t(M)),",
              "spec-zoo --hydra-help (Hydra's flags: multirun, config dirs). Every key: docs/configs.md."]
    return "\n".join(lines)


def show_option(choice: str) -> str:
    """The YAML of ``group=option`` as shipped, comments included, parents first (an option
    that extends another shows both); an installed plugin shows its keys and defaults."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from spec_zoo.api import compose_config
    from spec_zoo.registry import option_names
    from spec_zoo.schema import fail

    group, _, name = choice.partition("=")
    if group not in GROUPS:
        raise fail("show", f"{choice!r} is not group=option", f"e.g. spec-zoo show drafter=eagle ({', '.join(GROUPS)})")
    if name not in option_names(group):
        raise fail(group, f"{name!r} is not an option", f"choose one of {', '.join(option_names(group))}")
    path = Path(CONF_DIR) / group / f"{name}.yaml"
    if not path.is_file():  # an installed plugin (ConfigStore)
        node = compose_config([f"{group}={name}"])[group]
        return f"# --- {group}={name} (installed plugin)\n{OmegaConf.to_yaml(node)}"
    defaults = cast(DictConfig, OmegaConf.load(path)).get("defaults", [])
    parents = [p for p in defaults if isinstance(p, str) and p != "_self_"]
    return "\n".join([*(show_option(f"{group}={p}") for p in parents),
                      f"# --- conf/{group}/{name}.yaml\n{path.read_text(encoding='utf-8').rstrip()}"])


def make_draft(argv: list[str] | None = None) -> None:
    """``spec-zoo-make-draft``: save an embedded target cut to its first N layers, the
    untrained default draft of ``drafter=small_model`` (made on first use anyway for the default
    target; this makes it ahead of time, with another N, or for ``--model gemma3-270m``, whose
    draft ``drafter.path`` then names). The trained draft ships as ``drafter=distilled``."""
    from spec_zoo.artefacts import check_out_dir
    from spec_zoo.models import EMBEDDED, MODEL_RECORD, TRUNCATED, load_target, make_truncated_draft
    from spec_zoo.paths import cache_root

    parser = argparse.ArgumentParser(prog="spec-zoo-make-draft", description=make_draft.__doc__)
    parser.add_argument("--layers", type=int, default=4, help="layers to keep (default: 4)")
    parser.add_argument("--model", default="smollm2-135m", choices=list(EMBEDDED),
                        help="the embedded target to cut (default: smollm2-135m)")
    parser.add_argument("--out", help="output dir (default: <cache>/<model>-trunc<N>): new, empty, or a "
                                      "previous truncated draft (a directory with other files is refused)")
    parser.add_argument("--overwrite", action="store_true",
                        help="also replace another spec-zoo artefact or model dir at --out (never other files)")
    args = parser.parse_args(argv)
    if args.layers < 1:  # before the model loads (the upper bound needs the target)
        _fail(ConfigError(f"--layers={args.layers}; keep at least 1 layer, e.g. --layers 4."))
    out = args.out or cache_root() / f"{args.model}-trunc{args.layers}"
    try:
        check_out_dir(out, MODEL_RECORD, TRUNCATED, "--out", args.overwrite)  # before the target loads
        with quiet_loading():
            target = load_target(args.model)
            path = make_truncated_draft(target.model, args.layers, out, tokenizer=target.tokenizer,
                                        overwrite=args.overwrite)
    except ConfigError as e:
        _fail(e)
    print(path)
