"""``spec-zoo-train <command> [key=value ...]``: Hydra entry points for draft training.

Commands: ``distill`` (conf/train_distill.yaml), ``early_exit`` (conf/train_early_exit.yaml),
``eagle`` (conf/train_eagle.yaml), ``medusa`` (conf/train_medusa.yaml), and ``report``
(conf/train_report.yaml): held-out acceptance of trained artefacts by position and category, and
``translations`` (conf/train_translations.yaml): German-to-English prompts written by the target, and
``export`` (conf/train_export.yaml, ``--format medusa|eagle3|speculators``): a head in a published layout.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from spec_zoo.api import CONF_DIR
from spec_zoo.errors import ConfigError


def _run(train, cfg: DictConfig, config_name: str) -> None:
    from spec_zoo.cli import _quiet_transformers
    from spec_zoo.schema import validate

    _quiet_transformers()
    try:
        validate(cfg, config_name)  # types and ranges before the teacher loads
        print(train(cfg))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


@hydra.main(config_path=CONF_DIR, config_name="train_distill", version_base="1.3")
def _distill(cfg: DictConfig) -> None:
    from spec_zoo.drafters.distilled.train import distill

    _run(distill, cfg, "train_distill")


@hydra.main(config_path=CONF_DIR, config_name="train_early_exit", version_base="1.3")
def _early_exit(cfg: DictConfig) -> None:
    from spec_zoo.drafters.early_exit.train import train_exit_adapter

    _run(train_exit_adapter, cfg, "train_early_exit")


@hydra.main(config_path=CONF_DIR, config_name="train_eagle", version_base="1.3")
def _eagle(cfg: DictConfig) -> None:
    from spec_zoo.drafters.eagle.train import train_eagle

    _run(train_eagle, cfg, "train_eagle")


@hydra.main(config_path=CONF_DIR, config_name="train_medusa", version_base="1.3")
def _medusa(cfg: DictConfig) -> None:
    from spec_zoo.drafters.medusa.train import train_medusa

    _run(train_medusa, cfg, "train_medusa")


@hydra.main(config_path=CONF_DIR, config_name="train_report", version_base="1.3")
def _report(cfg: DictConfig) -> None:
    from spec_zoo.train.report import run_report

    _run(run_report, cfg, "train_report")


@hydra.main(config_path=CONF_DIR, config_name="train_translations", version_base="1.3")
def _translations(cfg: DictConfig) -> None:
    from spec_zoo.train.translations import make_translations

    _run(make_translations, cfg, "train_translations")


@hydra.main(config_path=CONF_DIR, config_name="train_export", version_base="1.3")
def _export(cfg: DictConfig) -> None:
    from spec_zoo.train.export import export

    _run(export, cfg, "train_export")


def _format_flag(argv: list[str]) -> list[str]:
    """``--format NAME`` / ``--format=NAME`` as the override ``export.format=NAME``."""
    out, args = [], iter(argv)
    for arg in args:
        if arg == "--format":
            out.append(f"export.format={next(args, '')}")
        elif arg.startswith("--format="):
            out.append(f"export.format={arg.split('=', 1)[1]}")
        else:
            out.append(arg)
    return out


COMMANDS = {"distill": _distill, "early_exit": _early_exit, "eagle": _eagle, "medusa": _medusa, "report": _report,
            "translations": _translations, "export": _export}


def main() -> None:
    """``spec-zoo-train <command> [key=value ...]``; the command line is checked first (one line, exit 2)."""
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"usage: spec-zoo-train {{{','.join(COMMANDS)}}} [key=value ...]  (--help after the command "
              "lists the config)", file=sys.stderr)
        sys.exit(2)
    from spec_zoo.cli import checked_command_line

    command = sys.argv.pop(1)
    if command == "export":
        sys.argv[1:] = _format_flag(sys.argv[1:])
    sys.argv[0] = f"spec-zoo-train {command}"
    checked_command_line(f"train_{command}")
    COMMANDS[command]()


if __name__ == "__main__":
    main()
