"""Issue 53 item 11: a page's report button is never inside a collapsible section (an expander, a popover): there,
clicking it reruns the page with the section closed, and the download it offers is hidden. Read from the pages'
source: no report button call inside a ``with ...expander(...)`` or ``...popover(...)`` block."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PAGES = sorted((Path(__file__).resolve().parents[2] / "pages").glob("*.py"))
COLLAPSIBLE = {"expander", "popover"}
BUTTONS = {"report_button", "result_report_button"}


def _name(call: ast.AST) -> str | None:
    if isinstance(call, ast.Call):
        f = call.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return None


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_report_button_inside_a_collapsible_section(page):
    tree = ast.parse(page.read_text())
    inside = []
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(_name(item.context_expr) in COLLAPSIBLE for item in node.items):
            inside += [n.lineno for n in ast.walk(node) if _name(n) in BUTTONS]
    assert not inside, f"{page.name}: report button inside a collapsible section at line(s) {inside}"


def test_the_check_finds_a_button_in_an_expander():
    tree = ast.parse("with st.expander('x'):\n    result_report_button(run, 'k')\n")
    node = tree.body[0]
    assert any(_name(n) in BUTTONS for n in ast.walk(node)) and _name(node.items[0].context_expr) == "expander"
