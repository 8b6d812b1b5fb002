"""``spec-zoo-train <command> [key=value ...]``: Hydra entry points for draft training.

Commands: one per trained method, found where each registers itself
(`spec_zoo.train.methods`: ``distill``, ``eagle``, ``early_exit``, ``medusa`` ship), run on
``conf/train_<method>.yaml``; and the pipeline's own tools: ``report`` (conf/train_report.yaml):
held-out acceptance of trained artefacts by position and category, ``translations``
(conf/train_translations.yaml): German-to-English prompts written by the target, and ``export``
(conf/train_export.yaml, ``--format medusa|eagle3|speculators``): a head in a published layout, and
``vocab`` (conf/train_vocab.yaml): coverage and cost of each draft-vocabulary size.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import hydra
from omegaconf import DictConfig

from spec_zoo.errors import ConfigError
from spec_zoo.registry import CONF_DIR
from spec_zoo.schema import Keys
from spec_zoo.train.keys import pipeline_keys
from spec_zoo.train.methods import recipes

# the pipeline's own commands -> the function each runs ("module:function", imported when it
# runs); the config of a command is conf/train_<command>.yaml
TOOLS = {
    "report": "spec_zoo.train.report:run_report",
    "translations": "spec_zoo.train.translations:make_translations",
    "export": "spec_zoo.train.export:export",
    "vocab": "spec_zoo.train.vocab:run_vocab",
}


def commands() -> list[str]:
    """Every command: the registered methods' (by name), then the tools."""
    return [*recipes(), *TOOLS]


def command_keys(command: str) -> Keys:
    """The keys ``command``'s config is validated with: the pipeline's, and a method's own."""
    found = recipes().get(command)
    return pipeline_keys() | found.keys if found is not None else pipeline_keys()


def runner(command: str) -> Callable[[DictConfig], object]:
    """What ``command`` runs on its config: the method's recipe in the pipeline, or the tool's function."""
    found = recipes().get(command)
    if found is not None:
        from spec_zoo.train.loop import train_module

        return lambda cfg: train_module(cfg, found.from_config(cfg))
    module, _, function = TOOLS[command].partition(":")
    return getattr(importlib.import_module(module), function)


def entry_point(command: str) -> Callable[[], None]:
    """The Hydra app of ``command``: its config validated (types and ranges before the teacher
    loads), then its function run; bad input ends as one ``error:`` line, exit 2; a spent
    ``data.budget_s`` with its message on stderr, exit 0 (the same command continues)."""
    config_name = f"train_{command}"

    @hydra.main(config_path=CONF_DIR, config_name=config_name, version_base="1.3")
    def app(cfg: DictConfig) -> None:
        from spec_zoo.api import quiet_loading
        from spec_zoo.schema import validate
        from spec_zoo.train.store import BudgetSpent

        try:
            with quiet_loading():
                validate(cfg, config_name, command_keys(command))
                print(runner(command)(cfg))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except BudgetSpent as e:
            print(e, file=sys.stderr)

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
    if len(sys.argv) < 2 or sys.argv[1] not in commands():
        print(f"usage: spec-zoo-train {{{','.join(commands())}}} [key=value ...]  (--help after the command "
              "lists the config)", file=sys.stderr)
        sys.exit(2)
    from spec_zoo.cli import checked_command_line

    command = sys.argv.pop(1)
    if command == "export":
        sys.argv[1:] = _format_flag(sys.argv[1:])
    sys.argv[0] = f"spec-zoo-train {command}"
    checked_command_line(f"train_{command}", keys=command_keys(command))
    entry_point(command)()


if __name__ == "__main__":
    main()
