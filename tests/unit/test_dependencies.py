"""Issue 53 item 10: the default install (requirements.txt, what `pip install .` pulls) stays free of what the
optional Token atlas map brings (Embedding Atlas: litellm, openai, sentence-transformers and generic top-level
names such as editor, runs and xmod). Read from this environment's installed distributions: the closure of
requirements.txt's names over their dependencies (extras not asked for left out)."""

from __future__ import annotations

import importlib.metadata as metadata
import re
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {"embedding-atlas", "litellm", "openai", "sentence-transformers"}
GENERIC = {"editor", "runs", "xmod"}


def names(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            out.append(Requirement(line).name)
    return out


def closure(wanted: list[str]) -> dict[str, metadata.Distribution]:
    seen: dict[str, metadata.Distribution] = {}
    stack = list(wanted)
    while stack:
        name = stack.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(req.name)
    return seen


def top_level(dist: metadata.Distribution) -> set[str]:
    listed = dist.read_text("top_level.txt")
    if listed:
        return set(listed.split())
    return {str(f).split("/")[0].removesuffix(".py") for f in dist.files or ()
            if not str(f).split("/")[0].endswith((".dist-info", ".data"))}


def test_the_default_install_leaves_the_atlas_extra_out():
    base = closure(names(ROOT / "requirements.txt"))
    assert "torch" in base and "streamlit" in base  # the closure is read (not vacuous)
    assert not HEAVY & set(base), sorted(HEAVY & set(base))
    tops = set().union(*(top_level(d) for d in base.values()))
    assert not GENERIC & tops, sorted(GENERIC & tops)
    assert "embedding-atlas" in {Requirement(n).name for n in names(ROOT / "requirements-atlas.txt")}


def test_the_extra_is_declared_and_the_dev_install_tests_it():
    assert 'optional-dependencies = { atlas = { file = ["requirements-atlas.txt"] } }' in \
        (ROOT / "pyproject.toml").read_text()
    assert "-r requirements-atlas.txt" in (ROOT / "requirements-dev.txt").read_text()
