"""The HTML report of a run folder (analysis.report, analysis.tasks.report): self-contained (plotly.js inlined once,
no src/href to any host), every text from the data escaped, its stated size its real size, large files named and not
embedded, embedded files byte-identical, bad folders one line. Fake run folders: no model is loaded."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from analysis.core.inputs import InputError
from analysis.core.task import QuietContext, RunRecord
from analysis.report.html import build_report, write_report

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
VERSIONS = {"python": "3.11", "torch": "2.x", "transformers": "4.x", "layerlens": "0.1.0"}
SPEC = {"name": "demo", "revision": None, "device": "cpu", "dtype": "auto", "allow_pickle": False, "head_from": None}


def probe_layers(states: int = 5) -> pd.DataFrame:
    accuracy = [round(0.9 - 0.1 * i, 3) for i in range(states)]
    return pd.DataFrame({"layer": range(states), "tokens": 100, "correct": [int(a * 100) for a in accuracy],
                         "accuracy": accuracy, "sentence_mean": accuracy, "ci_low": [a - 0.05 for a in accuracy],
                         "ci_high": [a + 0.05 for a in accuracy]})


def probe_run(folder: Path, hostile: bool = True) -> Path:
    """A probe's run folder as `layerlens probe` writes it (layers.csv, decoded.csv, run.json), with hostile text in
    a table, a label column, a file name and the options when ``hostile``."""
    folder.mkdir(parents=True, exist_ok=True)
    probe_layers().to_csv(folder / "layers.csv", index=False)
    texts = [SCRIPT, IMG, "evil\u202eexe.txt"] if hostile else ["a", "b", "c"]
    pd.DataFrame({"text_id": [0, 0, 1], "layer": [0, 1, 0], "text": texts}).to_csv(folder / "decoded.csv", index=False)
    if hostile:  # a generic chart with the hostile labels as its legend
        pd.DataFrame({"layer": [0, 1, 0, 1], "label": [SCRIPT, SCRIPT, IMG, IMG],
                      "score": [0.1, 0.2, 0.3, 0.4]}).to_csv(folder / "scores.csv", index=False)
        (folder / f"{IMG}.csv").write_text("a,b\n1,2\n")
    RunRecord("probe", {"model": "demo", "model_spec": SPEC, "options": {"top_k": 3, "seed": 0},
                        "input": IMG if hostile else "texts.txt", "column": SCRIPT if hostile else "text",
                        "texts": 3, "fingerprint": "sha256:abc123"}, versions=VERSIONS).write(folder)
    return folder


class Tags(HTMLParser):
    """Every start tag with its attributes (script and style contents are not parsed as tags)."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def report_of(folder: Path, **kw) -> str:
    from analysis.core.task import read_run
    from analysis.tasks.report import command_for, figures_for

    record = read_run(folder)
    return build_report(folder, figures=figures_for(folder, record), command=command_for(record), **kw)


def test_self_contained_plotly_once_and_no_host_anywhere(tmp_path):
    text = report_of(probe_run(tmp_path / "run"))
    assert text.count("plotly.js v") == 1  # the bundle's own header: inlined once
    figures = text.count("Plotly.newPlot(")
    assert figures >= 2  # the probe's accuracy curve and the generic chart of scores.csv
    tags = Tags(text).tags
    scripts = [attrs for tag, attrs in tags if tag == "script"]
    assert len(scripts) == 1 + figures and not any("src" in a for a in scripts)
    assert not [t for t, _ in tags if t in ("link", "iframe", "img", "object", "embed", "base", "form")]
    for tag, attrs in tags:
        for name in ("src", "href", "action", "data", "poster", "srcset"):
            value = (attrs.get(name) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//", "ftp:")), (tag, name, value[:80])
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text.split("/* plotly.js, inlined once */")[0]
                         + text.split("</script>", 1)[1])
    assert "MathJax" not in text.split("</script>", 1)[1]  # no MathJax loader after the bundle
    csp = next(a["content"] for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "connect-src 'none'" in csp and "default-src 'none'" in csp


def test_hostile_text_comes_out_inert(tmp_path):
    text = report_of(probe_run(tmp_path / "run"))
    assert SCRIPT not in text and IMG not in text and "<img" not in text  # nowhere raw, in any part of the file
    assert text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3  # the table cell, the option, run.json
    assert "&lt;img src=x onerror=alert(2)&gt;" in text  # the cell, the input option and the file's name
    # the legend of scores.csv's chart: Plotly shows it as typed (analysis.core.figures.plain), its JSON escaped
    assert "label = &lt;script&gt;alert(1)&lt;\\u002fscript&gt;" in text
    assert not any(t == "img" for t, _ in Tags(text).tags)
    assert "\u202e" not in text and "evil\\u202eexe.txt" in text  # a right-to-left override is written out


def test_the_stated_size_is_the_real_size(tmp_path):
    out = tmp_path / "report.html"
    written = write_report(probe_run(tmp_path / "run"), out)
    text = out.read_text(encoding="utf-8")
    stated = re.search(r"This file: <span id=\"report-size\">([\d.]+) MB \(([\d,]+) bytes\)", text)
    assert stated, text[:2000]
    assert int(stated[2].replace(",", "")) == out.stat().st_size == written
    assert f"{out.stat().st_size / 1e6:.1f}" == stated[1]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # the temporary file was renamed


def test_a_small_report_without_figures_states_its_size_too(tmp_path):
    folder = probe_run(tmp_path / "run", hostile=False)
    text = build_report(folder, figures=[])
    assert "plotly.js v" not in text and "Plotly.newPlot" not in text
    size = int(re.search(r"\(([\d,]+) bytes\)", text)[1].replace(",", ""))
    assert size == len(text.encode("utf-8")) < 1_000_000


def downloads(text: str) -> dict[str, str]:
    return {a["download"]: a["href"] for t, a in Tags(text).tags if t == "a" and "download" in a}


def test_embedded_files_decode_byte_identical(tmp_path):
    folder = probe_run(tmp_path / "run")
    links = downloads(build_report(folder, figures=[]))
    assert set(links) >= {"layers.csv", "decoded.csv", "run.json", f"{IMG}.csv"}
    for name in ("layers.csv", "decoded.csv", "run.json"):
        mime, data = links[name].split(",", 1)
        assert mime == {"run.json": "data:application/json;base64"}.get(name, "data:text/csv;base64")
        assert base64.b64decode(data) == (folder / name).read_bytes()


def test_a_file_over_the_cap_is_named_not_embedded(tmp_path):
    folder = probe_run(tmp_path / "run", hostile=False)
    big = pd.DataFrame({"layer": [i % 5 for i in range(400)], "token": [f"tok{i}" for i in range(400)],
                        "prob": [i / 400 for i in range(400)]})
    big.to_csv(folder / "tokens.csv", index=False)
    big.to_parquet(folder / "rows.parquet")
    size = (folder / "tokens.csv").stat().st_size
    assert size > 2000
    text = build_report(folder, figures=[], max_rows=7, max_embed_bytes=2000)
    links = downloads(text)
    assert "tokens.csv" not in links and "layers.csv" in links
    assert f"tokens.csv: {size / 1e3:.1f} kB, not embedded (over 2.0 kB); it is in the run folder" in text
    assert "the first 7 rows" in text  # the big CSV: its first rows only
    assert "the first 7 of 400 rows" in text  # the Parquet file: its first rows, its row count from the metadata
    assert "tok6" in text and "tok7" not in text


def test_the_embedded_files_have_a_total_cap(tmp_path):
    folder = probe_run(tmp_path / "run", hostile=False)
    for i in range(6):
        (folder / f"part{i}.csv").write_text("a\n" + "1\n" * 400)  # 802 bytes each
    links = downloads(text := build_report(folder, figures=[], max_embed_bytes=1000))
    assert sum(len(base64.b64decode(h.split(",", 1)[1])) for h in links.values()) <= 4 * 1000
    assert "would pass 4.0 kB in all" in text


def test_links_are_listed_never_followed(tmp_path):
    folder = probe_run(tmp_path / "run", hostile=False)
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    (folder / "leak.csv").symlink_to(secret)
    text = build_report(folder, figures=None)
    assert "hunter2" not in text and base64.b64encode(secret.read_bytes()).decode() not in text
    assert "leak.csv" in text and "a link: not followed" in text


@pytest.mark.parametrize("case, message", [
    ("missing", "has no run.json: not a LayerLens run folder"),
    ("not json", "is not JSON (Expecting value at line 1, column 1)"),
    ("a list", "holds a JSON list, not an object"),
    ("a file", "is not a folder"),
    ("nothing", "does not exist"),
])
def test_bad_folders_are_one_line(tmp_path, case, message):
    folder = tmp_path / "run"
    if case == "a file":
        folder.write_text("x")
    elif case != "nothing":
        folder.mkdir()
        if case != "missing":
            (folder / "run.json").write_text({"not json": "oops", "a list": "[1, 2]"}[case])
    with pytest.raises(InputError) as err:
        build_report(folder)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_figure_that_raises_is_a_note(tmp_path):
    from analysis.tasks.report import figures_for

    folder = tmp_path / "atlas"
    folder.mkdir()
    pd.DataFrame({"layer": [0, 1], "probe_accuracy": [0.5, 0.6]}).to_csv(folder / "separability.csv", index=False)
    record = {"task": "atlas", "model": "demo"}
    RunRecord("atlas", {"model": "demo"}, versions=VERSIONS).write(folder)
    figures = figures_for(folder, record)
    note = dict(figures)["Separability by layer"]
    assert isinstance(note, str) and note.startswith("not drawn: KeyError")
    broken = go.Figure()
    broken.to_html = lambda **kw: 1 / 0  # a figure that fails to be written
    text = build_report(folder, figures=[*figures, ("a table", pd.DataFrame({"x": [SCRIPT]})), ("broken", broken)])
    assert "not drawn: KeyError" in text and "not drawn: DataFrame is not a Plotly figure" in text
    assert "not drawn: ZeroDivisionError" in text and SCRIPT not in text
    assert "probe_accuracy by layer" in text  # the generic chart of the same table still drew


def test_each_task_gets_its_own_figures(tmp_path):
    from analysis.tasks.report import figures_for

    folder = probe_run(tmp_path / "run", hostile=False)
    titles = [title for title, fig in figures_for(folder, {"task": "probe", "model": "demo"})
              if not isinstance(fig, str)]
    assert titles == ["Reconstruction accuracy by layer"]  # decoded.csv is summarised, layers.csv drawn once
    layers = probe_layers()
    lens = pd.concat([layers.assign(lens="raw", kl_to_final=0.1, agreement=0.5),
                      layers.assign(lens="tuned", kl_to_final=0.05, agreement=0.7)])
    lens[["lens", *layers.columns, "kl_to_final", "agreement"]].to_csv(folder / "layers.csv", index=False)
    drawn = dict(figures_for(folder, {"task": "probe", "model": "demo"}))
    assert len(drawn["Reconstruction accuracy by layer"].data) == 6  # raw and tuned: band, mean, accuracy each
    assert "KL to the final layer and top-1 agreement with it" in drawn


def test_the_generic_chart_draws_each_numeric_column_by_layer(tmp_path):
    from analysis.report.figures import layer_figures

    folder = tmp_path / "run"
    folder.mkdir()
    pd.DataFrame({"layer": [0, 1, 2], "score": [0.1, 0.2, 0.3], "score_low": [0, 0.1, 0.2],
                  "score_high": [0.2, 0.3, 0.4], "example_id": [1, 2, 3], "name": ["a", "b", "c"]}
                 ).to_csv(folder / "table.csv", index=False)
    figures = layer_figures(folder)
    assert [t for t, _ in figures] == ["table.csv: score by layer"]  # its band, not charts of its own
    assert len(figures[0][1].data) == 2


def test_the_command_line(tmp_path):
    from analysis.report.command import command_line
    from analysis.tasks.report import command_for

    record = {"task": "probe", "model": "demo", "model_spec": {**SPEC, "dtype": "bfloat16"},
              "options": {"top_k": 7, "bogus": 1}, "input": "my texts.txt", "column": "sentence", "processes": 2}
    command, notes = command_for(record)
    assert command.startswith("layerlens probe --model demo --dtype bfloat16 --device cpu")
    assert "--top-k 7" in command and "--input 'my texts.txt'" in command and "--column sentence" in command
    assert command.endswith("--out OUT_DIR") and "bogus" not in command
    assert any("not flags of this command, left out: bogus" in n for n in notes)
    assert any("accelerate launch --num_processes 2" in n for n in notes)
    generic, notes = command_line({"task": "heads stats", "model": "demo", "options": {"input": "t.txt",
                                                                                       "clusters": False}})
    assert generic == "layerlens heads stats --model demo --input t.txt --out OUT_DIR"
    assert notes[0].startswith("approximate")
    assert command_line({"model": "demo"})[0] == "layerlens TASK --model demo --out OUT_DIR"
    atlas, notes = command_for({"task": "atlas", "model": "demo", "layers": [0, 4, 8], "method": "pca",
                                "data": "/data/set.csv"})
    assert atlas == "layerlens atlas --model demo --layers 0,4,8 --data /data/set.csv --out OUT_DIR"  # pca: default
    assert len(notes) == 1 and notes[0].startswith("not recorded in run.json, so their defaults are assumed: ")
    assert {"pooling", "seed", "max_rows"} <= set(notes[0].split(": ", 1)[1].split(", ")) and "layers" not in notes[0]


def test_the_task(tmp_path):
    from analysis.tasks.report import Report, ReportResult

    folder = probe_run(tmp_path / "run", hostile=False)
    task = Report()
    options = task.Options(run_dir=folder, out=tmp_path / "r.html")
    result = task.run(options, QuietContext())
    assert isinstance(result, ReportResult) and result.html.startswith("<!DOCTYPE html>")
    assert result.write_file(options.out) == options.out.stat().st_size
    assert result.write(tmp_path / "folder") == ["report.html"]
    assert (tmp_path / "folder" / "report.html").read_bytes() == options.out.read_bytes()
    assert re.fullmatch(r"wrote out/report.html \(\d+\.\d MB\)", result.done_line("out", ["report.html"]))
    with pytest.raises(InputError, match="run_dir"):
        task.Options(out=tmp_path / "r.html")
    with pytest.raises(InputError, match="has no run.json"):
        task.run(task.Options(run_dir=tmp_path, out=tmp_path / "r.html"), QuietContext())
    with pytest.raises(InputError, match="is a folder"):
        write_report(folder, tmp_path)
    for out in (folder, tmp_path):  # --out names the report's file: a folder (the run's own above all) is refused
        with pytest.raises(InputError, match="is a folder: give the report's file name"):
            task.run(task.Options(run_dir=folder, out=out), QuietContext())
    assert (folder / "layers.csv").is_file()
