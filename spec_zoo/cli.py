"""Command-line entry points: ``spec-zoo`` (Hydra) and ``spec-zoo-make-draft``."""

from __future__ import annotations

import argparse
import sys

import hydra
from omegaconf import DictConfig

from spec_zoo.api import CONF_DIR, build_decoder, label, run
from spec_zoo.errors import ConfigError
from spec_zoo.schema import check_command_line


def _quiet_transformers() -> None:
    """Progress bars and load reports would interleave with the streamed text."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def _fail(error: ConfigError) -> None:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    """Generate ``prompt`` with the configured target, drafter and verifier, stream the
    text, then print one summary line (tau, alpha, speed)."""
    from hydra.core.hydra_config import HydraConfig

    _quiet_transformers()
    try:
        decoder = build_decoder(cfg)
        out = run(cfg, decoder, on_text=lambda text: print(text, end="", flush=True))
    except ConfigError as e:
        _fail(e)
    print()
    print(f"{label(cfg, decoder, HydraConfig.get().runtime.choices.get('drafter'))} | {out.stats.summary()}")


def checked_command_line(config_name: str, prog: str = "error") -> None:
    """Validate ``sys.argv`` for ``config_name`` before Hydra runs it; one line and exit 2 if bad."""
    try:
        check_command_line(config_name, sys.argv[1:])
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
    except ConfigError as e:
        _fail(e)
    checked_command_line("config")
    _hydra_main()


def make_draft(argv: list[str] | None = None) -> None:
    """``spec-zoo-make-draft``: save the default target cut to its first N layers, the
    default draft of ``drafter=small_model`` until a trained draft exists."""
    from spec_zoo.models import cache_root, load_target, make_truncated_draft

    parser = argparse.ArgumentParser(prog="spec-zoo-make-draft", description=make_draft.__doc__)
    parser.add_argument("--layers", type=int, default=4, help="layers to keep (default: 4)")
    parser.add_argument("--out", help="output dir (default: <cache>/smollm2-135m-trunc<N>)")
    args = parser.parse_args(argv)
    if args.layers < 1:  # before the model loads (the upper bound needs the target)
        _fail(ConfigError(f"--layers={args.layers}; keep at least 1 layer, e.g. --layers 4."))
    _quiet_transformers()
    out = args.out or cache_root() / f"smollm2-135m-trunc{args.layers}"
    try:
        target = load_target()
        path = make_truncated_draft(target.model, args.layers, out, tokenizer=target.tokenizer)
    except ConfigError as e:
        _fail(e)
    print(path)
