"""The import contract of the layout (docs/architecture.md), read from the code's own imports.

Every package is covered: the CLI is a leaf nothing imports; streamlit only in app.py, pages/ and ui/; pages
build no figure (no plotly import: ui.results.chart draws what the techniques' plots modules build); no two files
import each other in a loop; no private name (``_x``) is imported across packages; no module over 500 lines
(tests and benchmarks aside); ``analysis.core`` imports only itself and ``models``; a technique (a package under
``analysis/`` other than ``core`` and ``tasks``) imports only itself, ``core`` and ``models``, never a task
(``compare`` too: what it reads through another technique, the task layer passes in); ``analysis/tasks`` (the
task layer) may import any technique; ``models`` imports none of the others; the library never imports
``jobs``; ``jobs`` reaches the techniques only through ``jobs/kinds.py``.

``KNOWN`` lists the violations the tree still has while the redesign is under way: the test fails on a new one
and on a listed one that is gone (remove it from the list), so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("analysis", "jobs", "models", "ui", "pages", "cli")
UI = ("app.py", "pages/", "ui/")
MAX_LINES = 500
TASKS = "analysis/tasks"  # the task layer (issue 45): it may import any technique, and no technique imports it


def sources() -> list[Path]:
    files = [ROOT / "app.py"]
    for top in TOP:
        files += sorted((ROOT / top).rglob("*.py")) if (ROOT / top).is_dir() else []
    return [f for f in files if "/data/" not in f.as_posix()[len(str(ROOT)):]]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def module_file(module: str) -> str | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return rel(candidate)
    return None


def imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(internal file imported, names taken) for every import in ``path``, function-level ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = rel(path)[:-3].replace("/", ".").removesuffix(".__init__").split(".")
    if not path.name == "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in TOP and (target := module_file(alias.name)):
                    found.append((target, ()))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] not in TOP:
                continue
            names = tuple(a.name for a in node.names)
            submodules = [module_file(f"{base}.{n}") for n in names]
            if any(submodules):
                found += [(s, ()) for s in submodules if s]
            if (target := module_file(base)) and not all(submodules):
                found.append((target, tuple(n for n, s in zip(names, submodules, strict=True) if not s)))
    return found


def package_of(file: str) -> str:
    """cli | ui | jobs | models | core | a technique (analysis/<name>) | analysis (a flat module, not yet sorted)."""
    parts = file.split("/")
    if parts[0] == "cli" or (parts[0] == "analysis" and (parts[-1].startswith("cli") or parts[-1] == "__main__.py")):
        return "cli"
    if file == "app.py" or parts[0] in ("pages", "ui"):
        return "ui"
    if parts[0] in ("jobs", "models"):
        return parts[0]
    if parts[0] == "analysis" and len(parts) > 2:
        return "core" if parts[1] == "core" else f"analysis/{parts[1]}"
    return "analysis"


def violations() -> set[str]:
    found: set[str] = set()
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sources():
        file, text = rel(path), path.read_text()
        if len(text.splitlines()) > MAX_LINES:
            found.add(f"size: {file}")
        if "import streamlit" in text or "from streamlit" in text:
            if not file.startswith(UI):
                found.add(f"streamlit: {file}")
        if file.startswith("pages/") and ("import plotly" in text or "from plotly" in text):
            found.add(f"a page builds a figure: {file}")  # figures come from the techniques' plots modules
        mine = package_of(file)
        for target, names in imports(path):
            if target == file:
                continue
            graph[file].add(target)
            theirs = package_of(target)
            if theirs == "cli" and mine != "cli":
                found.add(f"cli imported: {file} -> {target}")
            if theirs != mine and any(n.startswith("_") and not n.startswith("__") for n in names):
                found.add(f"private: {file} -> {target}")
            if mine == "core" and theirs not in ("core", "models"):
                found.add(f"core: {file} -> {target}")
            if mine.startswith("analysis/") and theirs.startswith("analysis/") and theirs != mine \
                    and mine != TASKS:
                found.add(f"technique: {file} -> {target}")
            if mine == "models" and theirs != "models":
                found.add(f"models: {file} -> {target}")
            if (mine == "core" or mine.startswith("analysis")) and theirs == "jobs":
                found.add(f"library imports jobs: {file} -> {target}")
            if mine == "jobs" and (theirs.startswith("analysis/") and theirs != "core") \
                    and file != "jobs/kinds.py":
                found.add(f"jobs: {file} -> {target}")
    for loop in circles(graph):
        found.add("circle: " + " <-> ".join(sorted(loop)))
    packages: dict[str, set[str]] = defaultdict(set)
    for file, targets in graph.items():
        packages[package_of(file)] |= {package_of(t) for t in targets} - {package_of(file)}
    for loop in circles(packages):
        found.add("package circle: " + " <-> ".join(sorted(loop)))
    return found


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


# Today's violations, while the redesign moves the code (issue 35). Only ever remove lines: none are left.
KNOWN: set[str] = set()


def test_the_import_contract_holds_but_for_the_known_violations():
    found = violations()
    new, gone = sorted(found - KNOWN), sorted(KNOWN - found)
    assert not new, "new violations of the layout:\n" + "\n".join(new)
    assert not gone, "fixed: remove these from KNOWN in tests/unit/test_layout.py:\n" + "\n".join(gone)


def test_the_reader_of_imports_finds_what_it_should():
    """The contract's reader on known imports (a reader that found nothing would pass every rule)."""
    found = dict.fromkeys(t for t, _ in imports(ROOT / "analysis" / "tokens" / "search.py"))
    assert "analysis/core/inputs.py" in found
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]


def test_run_json_has_one_writer():
    """Issue 45: every run.json is written by analysis.core.task.RunRecord (the task, the versions, the facts)."""
    import re

    writes = re.compile(r'"run\.json"\)?\.write_text|write_json\([^)]*"run\.json"')
    found = [rel(p) for p in sources() if writes.search(p.read_text()) and rel(p) != "analysis/core/task.py"]
    assert not found, found
