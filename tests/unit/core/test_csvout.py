"""CSV outputs never carry a live spreadsheet formula (issue 20.8), and keep numbers and single characters."""

import pandas as pd

from analysis.core.csvout import neutralise, safe
from cli.main import main

HOSTILE = ["=HYPERLINK(\"http://x\",\"y\")", "@SUM(A1)", "+1+cmd|' /C calc'!A0", "-2+3", "\tTAB", "\rCR"]


def test_formula_starts_get_an_apostrophe_and_nothing_else_changes():
    assert [neutralise(v) for v in HOSTILE] == ["'" + v for v in HOSTILE]
    for kept in ("-1", "+0.5", "-", "=", "plain text", 3, -1.5, None, "a=b"):
        assert neutralise(kept) == kept
    frame = pd.DataFrame({"text": ["=1+1", "ok"], "label": ["-1", "@x"], "x": [-1.0, 2.0]})
    assert safe(frame).to_dict("list") == {"text": ["'=1+1", "ok"], "label": ["-1", "'@x"], "x": [-1.0, 2.0]}
    assert frame["text"][0] == "=1+1"  # the result itself keeps the exact text


def test_cli_files_are_safe_and_parquet_keeps_the_text(tmp_path, tiny_dirs):
    data = tmp_path / "hostile.csv"
    pd.DataFrame({"text": [f"{h} the film is good ." for h in HOSTILE] * 2,
                  "label": ["=cmd|x", "@neg"] * len(HOSTILE)}).to_csv(data, index=False)
    model = str(tiny_dirs["bert"])
    assert main(["probe", "--model", model, "--input", str(data), "--out", str(tmp_path / "p")]) == 0
    assert main(["atlas", "--model", model, "--data", str(data), "--folds", "2", "--out", str(tmp_path / "a")]) == 0
    for path in (tmp_path / "p" / "decoded.csv", tmp_path / "a" / "coords.csv"):
        frame = pd.read_csv(path, keep_default_na=False, dtype=str)
        cells = [c for column in frame.columns for c in frame[column]]
        assert not [c for c in cells if len(c) > 1 and c[0] in "=+@\t\r" and c[0] != "'"], path
    coords = pd.read_csv(tmp_path / "a" / "coords.csv", keep_default_na=False)
    assert set(coords["label"]) == {"'=cmd|x", "'@neg"}
    tokens = pd.read_parquet(tmp_path / "p" / "tokens.parquet")
    assert len(tokens)  # parquet: exact tokens, nothing prefixed
    assert not tokens["input_token"].astype(str).str.startswith("'").any()


def test_tables_on_the_pages_show_formula_cells_neutralised():
    """Streamlit's own table toolbar downloads what the table shows: every table the pages draw (ui.results.table,
    the data preview, the jobs tables) shows text cells neutralised as our CSV files write them."""
    from streamlit.testing.v1 import AppTest

    def page():
        import pandas as pd

        from ui.results import table

        table(pd.DataFrame({"text": ["=cmd|' /C calc'!A0", "plain", "-1.5"], "accuracy": [0.5, 0.25, 1.0]}),
              {"accuracy": ("accuracy", "help")})

    at = AppTest.from_function(page).run()
    assert not at.exception
    shown = at.dataframe[0].value
    assert shown["text"].tolist() == ["'=cmd|' /C calc'!A0", "plain", "-1.5"]
    assert shown["accuracy"].tolist() == [0.5, 0.25, 1.0]


def test_the_jobs_table_shows_names_neutralised(tmp_path):
    from jobs.store import JobStore
    from ui.jobs import job_table, shown

    store = JobStore(tmp_path / "jobs")
    store.submit({"model": "demo", "train": "demo"}, "cpu", "=HYPERLINK(\"http://x\")")
    assert shown(job_table(store.list()))["name"].tolist() == ["'=HYPERLINK(\"http://x\")"]


def test_an_undefined_value_in_a_page_table_is_a_dash_not_none():
    """Streamlit draws a missing number as a grey 'None' (a Styler's na_rep does not reach it): the pages' tables
    (ui.results.table) ask for a dash instead, and keep the number column numeric."""
    from streamlit.testing.v1 import AppTest

    def page():
        import pandas as pd

        from ui.results import table

        table(pd.DataFrame({"layer": [1, 2], "cka": [0.5, float("nan")]}), {"cka": ("CKA", "help")})

    at = AppTest.from_function(page).run()
    assert not at.exception
    assert at.dataframe[0].proto.placeholder == "—"
    assert at.dataframe[0].value["cka"].isna().tolist() == [False, True]


def test_every_table_a_page_draws_says_how_a_missing_value_looks():
    """Every ``st.dataframe`` of the dashboard passes ``placeholder`` (Streamlit's grey "None" otherwise: seen on the
    Linguistic structure page's summary), unless it draws the jobs table's text cells (ui.jobs.shown)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    bare, seen = [], 0
    for path in [*root.glob("pages/*.py"), *root.glob("ui/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "dataframe":
                seen += 1
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Call) and getattr(first.func, "id", None) == "shown":
                    continue
                if not any(k.arg in ("placeholder", None) for k in node.keywords):  # None: **kwargs carry it
                    bare.append(f"{path.relative_to(root)}:{node.lineno}")
    assert seen >= 10 and not bare, (seen, bare)
