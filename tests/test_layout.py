"""The layout's rules, read from the source: imports run one way (core <- methods <-
training) with no circle among the project's modules (imports inside functions included),
the core's own layers in order, inference never imports training, and
docs/architecture.md's module map lists every module of the package (and nothing that does
not exist)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from spec_zoo import SpeculativeDecoder
from spec_zoo.registry import option_names

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("spec_zoo", "drafters", "verifiers")
# consumers of methods (they sit above them): training, and the test harness for plugin authors
ABOVE_METHODS = ("spec_zoo/train/", "spec_zoo/testing.py")


def modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for top in SOURCES for p in (ROOT / top).rglob("*.py"))


def imported(path: str) -> set[str]:
    """Every module name ``path`` imports (top level or inside functions)."""
    tree = ast.parse((ROOT / path).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# The core's layers, lowest first: a module imports its own layer or lower ones, never a
# higher one (the dotted name under spec_zoo; "" is the package itself; the engine's modules,
# spec_zoo/runtime/, each by its own name). Methods sit above the core, then the tools built on
# both, then training. A new module takes its place here.
CORE_LAYERS = [
    ("errors", "paths", "inputs", "outputs", "draft", "stats", "lockstep"),
    ("sampling", "runtime.layers", "partial", "artefacts", "costs", "runtime.cpp_kernels", "runtime.skinny_gemm",
     "runtime.amx_gemm", "runtime.quant_gemm", "runtime.attention_kernel", "runtime.compile_cache"),
    ("runtime.target", "interfaces", "draft_head"),
    ("draft_length", "runtime.compiled", "runtime", "registry"),
    ("chain", "trees", "staged", "runtime.host_fit", "models", "schema", "runtime.compiled_head",
     "runtime.compiled_module", "batch_policy"),
    ("decoder",),
    ("auto",),
    ("api", ""),
]
METHODS, TOOLS, TRAINING = len(CORE_LAYERS), len(CORE_LAYERS) + 1, len(CORE_LAYERS) + 2
TOOL_MODULES = ("cli", "batch_run", "console", "testing", "certify", "bench", "report")


def module_name(path: Path, root: Path) -> str:
    """The dotted name a source file is imported as (drafters/ and verifiers/ ship inside spec_zoo)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] in ("drafters", "verifiers"):
        parts.insert(0, "spec_zoo")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, tops: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its source (inside functions and
    ``TYPE_CHECKING`` blocks too; relative imports resolved)."""
    files = {module_name(p, root): p for top in tops for p in (root / top).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + [base] * bool(base))
                wanted = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for w in wanted:
                while w and w not in files:  # `from pkg import name`: the longest module prefix
                    w = w.rpartition(".")[0]
                if w and w != name:
                    deps.add(w)
        graph[name] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports once, as the modules on it (strongly connected components of
    more than one module, by Tarjan's algorithm)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def layer(module: str) -> int:
    if is_training(module):
        return TRAINING
    if module.startswith(("spec_zoo.drafters", "spec_zoo.verifiers")):
        return METHODS
    first = module.removeprefix("spec_zoo").removeprefix(".").split(".")[0]
    if first in TOOL_MODULES:
        return TOOLS
    if first == "runtime" and module != "spec_zoo.runtime":  # the engine's folder: each module in its place
        first = ".".join(module.split(".")[1:3])
    found = [i for i, names in enumerate(CORE_LAYERS) if first in names]
    assert found, f"spec_zoo.{first} has no layer: add it to CORE_LAYERS in tests/test_layout.py"
    return found[0]


def test_no_import_circle():
    cycles = import_cycles(import_graph(ROOT, SOURCES))
    assert not cycles, f"import circles (imports inside functions count): {cycles}"


def test_a_planted_circle_is_found(tmp_path):
    """The check itself: two modules importing each other, one only inside a function."""
    (tmp_path / "spec_zoo").mkdir()
    (tmp_path / "spec_zoo" / "a.py").write_text("from spec_zoo.b import g\n")
    (tmp_path / "spec_zoo" / "b.py").write_text("def g():\n    from spec_zoo import a\n")
    (tmp_path / "spec_zoo" / "c.py").write_text("from . import b\n")
    graph = import_graph(tmp_path, ("spec_zoo",))
    assert graph["spec_zoo.c"] == {"spec_zoo.b"}
    assert import_cycles(graph) == [["spec_zoo.a", "spec_zoo.b"]]


def test_imports_follow_the_layers():
    graph = import_graph(ROOT, SOURCES)
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if layer(d) > layer(m))
    assert not upward, f"imports against the layering (a lower module importing a higher one): {upward}"


def is_training(module: str) -> bool:
    return module.startswith("spec_zoo.train") or (
        module.startswith("spec_zoo.drafters.") and module.endswith(".train"))


def test_core_imports_no_method():
    core = [m for m in modules() if m.startswith("spec_zoo/") and not m.startswith(ABOVE_METHODS)]
    bad = {m: sorted(i for i in imported(m) if i.startswith(("spec_zoo.drafters", "spec_zoo.verifiers")))
           for m in core}
    assert not {m: v for m, v in bad.items() if v}, "the core must build methods by name, not import them"


def test_inference_imports_no_training():
    inference = [m for m in modules() if not m.startswith("spec_zoo/train/") and not m.endswith("/train.py")
                 and m != "spec_zoo/train/__init__.py"]
    bad = {m: sorted(i for i in imported(m) if is_training(i)) for m in inference}
    assert not {m: v for m, v in bad.items() if v}


def test_no_top_level_generic_packages():
    text = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"packages = \[(.*?)\]", text, re.S).group(1)
    assert all(p.strip().strip('"').startswith("spec_zoo") for p in packages.split(",") if p.strip())


def test_architecture_module_map_is_complete_and_true():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"`((?:spec_zoo|drafters|verifiers)/[\w/]+\.py)`", doc))
    markers = {m for m in modules() if m.endswith("__init__.py") and m.startswith("drafters/")}
    missing = [m for m in modules() if m not in listed and m not in markers]
    assert not missing, f"add these modules to docs/architecture.md's module map: {missing}"
    assert not [m for m in listed if not (ROOT / m).is_file()], "the module map lists files that do not exist"


def test_every_experiment_preset_and_method_composes(tmp_path, monkeypatch):
    """Every preset and bench method resolves after the move (no model loads); the peer
    engines' methods see a stand-in venv (resolving checks theirs is there)."""
    from hydra import compose, initialize_config_dir

    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    from spec_zoo.bench.peers import PEERS
    from spec_zoo.bench.specs import resolve_methods

    for engine in PEERS:  # every engine's, so the test never leans on a venv this checkout happens to have
        monkeypatch.setenv(f"SPEC_ZOO_{engine.upper()}_VENV", str(tmp_path / "venv"))
    from spec_zoo.registry import CONF_DIR, option_names

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for preset in option_names("experiment"):
            cfg = compose("bench", overrides=[f"+experiment={preset}"])
            specs, _ = resolve_methods(cfg.methods, list(cfg.default_methods), cfg)
            assert specs, preset
    specs, notes = resolve_methods(option_names("method"), [])
    assert len(specs) == len(option_names("method")) and not notes


def test_an_option_is_composed_once_inside_and_outside_a_hydra_app():
    """A bench resolves hundreds of options (~0.4 s a compose): composing one inside the shipped
    config dir's Hydra context and outside any app must share one cache entry."""
    from hydra import initialize_config_dir

    from spec_zoo.registry import CONF_DIR, _composed_option, compose_option

    _composed_option.cache_clear()
    outside = compose_option("drafter", "ngram")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        inside = compose_option("drafter", "ngram")
    assert inside == outside and _composed_option.cache_info().misses == 1


OPTION_PROMPT = "Write a Python function that reverses a list."


@pytest.fixture(scope="module")
def plain_option_ids(smollm2_native):
    """Plain greedy decoding's 12 tokens on the options' prompt (computed once per worker)."""
    decoder = SpeculativeDecoder(smollm2_native)
    return decoder.generate(decoder.encode(OPTION_PROMPT), 12).ids


@pytest.mark.real_model
@pytest.mark.parametrize("option", option_names("drafter"))
def test_every_shipped_drafter_option_loads_and_decodes_as_plain_greedy(smollm2_native, plain_option_ids, option):
    """Every conf/drafter option (shipped artefacts included) builds from its YAML on the
    real target as the bare `spec-zoo` runs it (its own 4-bit weights: heads reading its layers
    read them as floats, the quantized copy remakes them) and, under greedy verification,
    prints plain greedy decoding's tokens (one test per option, so the test workers share them)."""
    from spec_zoo.api import build_decoder, compose_config

    overrides = [f"drafter={option}", f"prompt={OPTION_PROMPT}", "generation.max_new_tokens=12"]
    cfg = compose_config(overrides)
    if cfg.drafter.get("runtime") == "compiled":  # its compiled draft is proven in test_batching (tiny model);
        cfg = compose_config([*overrides, "drafter.runtime=eager"])  # compiling the real one here costs a CI minute
    decoder = build_decoder(cfg, target=smollm2_native)
    assert decoder.generate(decoder.encode(cfg.prompt), 12).ids == plain_option_ids, option

