"""The tracked tree stays small: a clone, an install, every CI run and each call to a GPU
machine (64 MiB of working tree at most) carry all of it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the goal for the tracked files together (`git ls-files -z | xargs -0 du -cb`): a GPU call carries 64 MiB
GOAL = 40 * 2**20
#: what they may take: the goal, met (issue 60): the shipped artefacts store int8 / int6 matrices with a scale per
#: 64 weights and nothing the target holds (32.3 MB, 76 MiB of float16 before; docs/training.md "Artefact
#: storage"), figures are 256-colour palettes and the shipped prompt sets gzipped: 39.5 MiB
BUDGET = GOAL
#: what a GPU window may send (docs/devices.md): the tree as the device tool counts it plus the carried `.whl/`,
#: under the tool's 64 MiB with room for the window's own results
WINDOW = 60 * 2**20
WHEELS = ROOT / "docs/devices/wheels.txt"  # the sizes of the wheels docs/devices/wheels.sh puts in .whl/


def tracked_sizes(root: Path) -> dict[str, int] | None:
    """Size in bytes of every file git tracks under ``root``, as ``du -b`` counts it (a link
    as itself; a tracked file deleted from the work tree as nothing); None outside a git
    checkout of ``root`` (an exported tree, an installed package)."""
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, check=True).stdout.strip()
        names = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    if Path(top).resolve() != root:
        return None  # a tree inside someone else's repository
    return {n: os.lstat(root / n).st_size for n in names if n and os.path.lexists(root / n)}


def sent_sizes(root: Path) -> dict[str, int]:
    """What the device tool sends of ``root`` beside the carried paths: every tracked file and every
    untracked file git does not ignore (a developer's scratch file counts, as it does there)."""
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    untracked = {n: os.lstat(root / n).st_size for n in names if n and os.path.lexists(root / n)}
    return {**(tracked_sizes(root) or {}), **untracked}


def wheel_sizes(root: Path) -> dict[str, int]:
    """The carried wheels: `.whl/` as it is where it was made, else the sizes wheels.sh recorded."""
    made = root / ".whl"
    if made.is_dir():
        return {f".whl/{p.name}": p.stat().st_size for p in made.iterdir() if p.is_file()}
    rows = (line.split(maxsplit=1) for line in WHEELS.read_text().splitlines() if line.strip())
    return {f".whl/{name}": int(size) for size, name in rows}


def over_budget(sizes: dict[str, int], budget: int, largest: int = 10) -> str | None:
    """What to say when ``sizes`` add up to more than ``budget``: the total and the largest files."""
    total = sum(sizes.values())
    if total <= budget:
        return None
    top = sorted(sizes.items(), key=lambda kv: -kv[1])[:largest]
    lines = "\n".join(f"  {size / 2**20:7.2f} MiB  {name}" for name, size in top)
    return (f"the tracked tree is {total / 2**20:.1f} MiB, over its {budget / 2**20:.0f} MiB budget; "
            f"the largest tracked files:\n{lines}")


def test_the_tracked_tree_fits_its_budget():
    sizes = tracked_sizes(ROOT)
    if sizes is None:
        pytest.skip("not a git checkout (an exported tree or an installed package): nothing tracked to measure")
    problem = over_budget(sizes, BUDGET)
    assert problem is None, problem


def test_the_message_names_the_largest_files():
    sizes = {"docs/traces.jsonl": 30 * 2**20, "drafters/x/artefacts/a/w.safetensors": 20 * 2**20, "README.md": 10}
    message = over_budget(sizes, GOAL, largest=2)
    assert message is not None and message.startswith("the tracked tree is 50.0 MiB, over its 40 MiB budget")
    assert message.index("docs/traces.jsonl") < message.index("w.safetensors") and "README.md" not in message
    assert over_budget({"README.md": 10}, GOAL) is None


def test_outside_a_checkout_there_is_nothing_to_measure(tmp_path):
    (tmp_path / "README.md").write_text("exported")
    assert tracked_sizes(tmp_path.resolve()) is None


def test_the_gpu_window_travels():
    """The prepared GPU window (docs/devices/window.sh) fits one device call: tree + `.whl/` <= 60 MiB."""
    if tracked_sizes(ROOT) is None:
        pytest.skip("not a git checkout (an exported tree or an installed package): nothing sent to measure")
    wheels = wheel_sizes(ROOT)
    assert any(name.startswith(".whl/transformers-") for name in wheels), "docs/devices/wheels.txt lists no wheels"
    problem = over_budget({**sent_sizes(ROOT), **wheels}, WINDOW)
    assert problem is None, f"a GPU window cannot carry this: {problem}"
