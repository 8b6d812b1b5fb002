"""The console scripts (pyproject's ``[project.scripts]``), each its command run under one wrapper,
`console`: bad input that escapes a command's own checks still ends as one ``error:`` line and
exit 2, and Ctrl-C as one ``interrupted; <what was kept>`` line and exit 130, never a traceback.
The command is imported inside the wrapper, so an interrupt during the seconds of imports
(torch, transformers) is caught too; this module imports nothing heavy."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

#: what an interrupted command leaves behind, said in its ``interrupted;`` line; a command that
#: learns more as it runs (the bench: where its records are) replaces it with `keep`
_kept: dict[str, str] = {}


def keep(note: str) -> None:
    """Say what an interrupt now leaves behind (e.g. the records written so far, and how to resume)."""
    _kept["note"] = note


def console(target: str, prog: str, kept: str, argv: bool = False, cache: bool = True) -> Callable[[], None]:
    """The console script running ``module:function`` as ``prog``; ``kept`` says what an interrupt
    leaves; ``argv``: the function takes ``sys.argv[1:]`` and returns an exit code; ``cache``: it
    keeps things in spec-zoo's cache, whose path (``SPEC_ZOO_CACHE``) is checked first."""

    def script() -> None:
        from spec_zoo.errors import ConfigError  # light: no torch
        from spec_zoo.paths import cache_root

        _kept["note"] = kept
        try:
            if cache:
                cache_root()  # a file there is one line now, not a traceback deep in a model load
            module, _, name = target.partition(":")
            function = getattr(importlib.import_module(module), name)
            code = function(sys.argv[1:]) if argv else function()
        except KeyboardInterrupt:
            print(f"{prog}: interrupted; {_kept['note']}", file=sys.stderr)
            sys.exit(130)
        except ConfigError as err:  # a command's own handler usually said it already
            print(f"{prog}: error: {err}", file=sys.stderr)
            sys.exit(2)
        if argv:
            sys.exit(code)

    script.__doc__ = f"``{prog}``: `{target}` under `console`."
    return script


NOTHING = "nothing was written"
spec_zoo = console("spec_zoo.cli:main", "spec-zoo", f"the text so far is above; {NOTHING}")
bench = console("spec_zoo.bench.cli:main", "spec-zoo-bench", NOTHING)
report = console("spec_zoo.report.cli:main", "spec-zoo-report", f"{NOTHING} (reports are written whole)",
                 argv=True, cache=False)
project = console("spec_zoo.report.cli:project", "spec-zoo-project", NOTHING, argv=True, cache=False)
make_draft = console("spec_zoo.cli:make_draft", "spec-zoo-make-draft",
                     f"{NOTHING} (a draft is written whole or not at all)", argv=True)
train = console("spec_zoo.train.cli:main", "spec-zoo-train",
                "teacher-data shards and checkpoints written so far are kept (rerun the same command to resume); "
                "the artefact is written whole at the end or not at all")
