"""``spec-zoo-train <command> [key=value ...]``: Hydra entry points for draft training.

Commands: ``distill`` (conf/train_distill.yaml), ``early_exit`` (conf/train_early_exit.yaml),
``eagle`` (conf/train_eagle.yaml), ``medusa`` (conf/train_medusa.yaml), and ``report``
(conf/train_report.yaml): held-out acceptance of trained artefacts by position and category, and
``translations`` (conf/train_translations.yaml): German-to-English prompts written by the target, and
``export`` (conf/train_export.yaml, ``--format medusa|eagle3|speculators``): a head in a published layout.
"""

from __future__ import annotations

import importlib
import sys

import hydra
from omegaconf import DictConfig

from spec_zoo.errors import ConfigError
from spec_zoo.registry import CONF_DIR

# command -> the function it runs ("module:function", imported when the command runs); its
# config is conf/train_<command>.yaml
COMMANDS = {
    "distill": "spec_zoo.drafters.distilled.train:distill",
    "early_exit": "spec_zoo.drafters.early_exit.train:train_exit_adapter",
    "eagle": "spec_zoo.drafters.eagle.train:train_eagle",
    "medusa": "spec_zoo.drafters.medusa.train:train_medusa",
    "report": "spec_zoo.train.report:run_report",
    "translations": "spec_zoo.train.translations:make_translations",
    "export": "spec_zoo.train.export:export",
}


def entry_point(command: str):
    """The Hydra app of ``command``: its config validated (types and ranges before the teacher
    loads), then its function run; bad input ends as one ``error:`` line, exit 2."""
    config_name = f"train_{command}"

    @hydra.main(config_path=CONF_DIR, config_name=config_name, version_base="1.3")
    def app(cfg: DictConfig) -> None:
        from spec_zoo.api import quiet_loading
        from spec_zoo.schema import validate

        module, _, function = COMMANDS[command].partition(":")
        try:
            with quiet_loading():
                validate(cfg, config_name)
                print(getattr(importlib.import_module(module), function)(cfg))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    return app


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
    entry_point(command)()


if __name__ == "__main__":
    main()
