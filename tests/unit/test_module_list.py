"""docs/modules.md is the generated module list (issue 45, "Docs"): it lists every module there is, with its
docstring's first sentence, and nothing that is gone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_docs_modules_md_is_what_the_generator_prints():
    spec = importlib.util.spec_from_file_location("module_list", ROOT / "scripts" / "module_list.py")
    module_list = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_list)
    expected = module_list.render()
    assert (ROOT / "docs" / "modules.md").read_text(encoding="utf-8") == expected, \
        "docs/modules.md is stale: python scripts/module_list.py > docs/modules.md"
    assert "`analysis/tasks/heads.py`" in expected and "`cli/main.py`" in expected  # every package is read


def test_the_first_sentence_stops_at_the_sentence_not_at_an_abbreviation(tmp_path):
    spec = importlib.util.spec_from_file_location("module_list", ROOT / "scripts" / "module_list.py")
    module_list = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_list)
    path = tmp_path / "m.py"
    path.write_text('"""Head importance, Michel et al. 2019 (Fig. 2. here). The rest."""\n')
    assert module_list.first_sentence(path) == "Head importance, Michel et al. 2019 (Fig. 2. here)."
    path.write_text("x = 1\n")
    assert module_list.first_sentence(path) == "(no docstring)"
