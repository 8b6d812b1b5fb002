"""``spec-zoo-train <command> [key=value ...]``: Hydra entry points for draft training.

Commands: ``distill`` (conf/train_distill.yaml).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from spec_zoo.api import CONF_DIR
from spec_zoo.errors import ConfigError

COMMANDS = {"distill": "train_distill"}


@hydra.main(config_path=CONF_DIR, config_name="train_distill", version_base="1.3")
def _distill(cfg: DictConfig) -> None:
    from spec_zoo.cli import _quiet_transformers
    from spec_zoo.train.distill import distill

    _quiet_transformers()
    try:
        print(distill(cfg))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"usage: spec-zoo-train {{{','.join(COMMANDS)}}} [key=value ...]  (--help after the command "
              "lists the config)", file=sys.stderr)
        sys.exit(2)
    command = sys.argv.pop(1)
    sys.argv[0] = f"spec-zoo-train {command}"
    {"distill": _distill}[command]()


if __name__ == "__main__":
    main()
