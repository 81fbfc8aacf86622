"""AppTest of the series page: a series typed as a folder under the model roots runs, its heat map and the slider's
per-checkpoint view are drawn, and its table is the CLI's; a folder outside the roots is refused."""

import pandas as pd

from cli.main import main
from tests.support.models import make_series, save_tiny
from tests.support.pages import run_page

PAGE = "pages/12_Across_checkpoints.py"


def test_a_typed_series_runs_and_matches_the_cli(tmp_path, monkeypatch):
    series = make_series(save_tiny("bert", tmp_path / "base"), tmp_path / "further", steps=1)
    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(tmp_path))
    at = run_page(PAGE)
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.selectbox(key="series_source").set_value(at.selectbox(key="series_source").options[-1]).run()
    at.text_input(key="series_typed").set_value(str(series)).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.button(key="series_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) >= 2  # the heat map and the checkpoint's own figures
    at.button(key="series_report").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "series" in at.session_state["series_report_html"].decode()[:2000]
    chosen = at.selectbox(key="series_input").value
    assert main(["series", "--analysis", "probe", "--checkpoints", str(series), "--input", str(chosen), "--device",
                 "cpu", "--out", str(tmp_path / "cli")]) == 0
    shown = at.dataframe[0].value.reset_index(drop=True)
    cli = pd.read_csv(tmp_path / "cli" / "series.csv")
    pd.testing.assert_series_equal(shown["value"], cli["value"], check_names=False)


def test_a_folder_outside_the_model_roots_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(tmp_path / "roots"))
    at = run_page(PAGE)
    at.selectbox(key="series_source").set_value(at.selectbox(key="series_source").options[-1]).run()
    outside = tmp_path / "elsewhere"
    for name in ("step-1", "step-2"):
        save_tiny("bert", outside / name, copy_steps=0)
    at.text_input(key="series_typed").set_value(str(outside)).run()
    assert not at.exception and at.error and "not a model folder under the dashboard's model folders" in \
        at.error[0].value



def test_outside_and_missing_give_the_same_message_and_nothing_outside_is_read(tmp_path, monkeypatch):
    """Issue 53 item 5: /etc, an outside folder of sub-folders, an outside job folder with a damaged metrics.json
    and a missing folder all give the one refusal, the same words, and nothing of them is read (no sub-folder
    named, no exception box); A,B,C of outside folders too."""
    import analysis.series.checkpoints as checkpoints

    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(tmp_path / "roots"))
    (tmp_path / "roots").mkdir()
    outside = tmp_path / "elsewhere"
    (outside / "secret-step-1").mkdir(parents=True)
    (outside / "secret-step-1" / "config.json").write_text("{}")
    job = tmp_path / "job"
    (job / "epochs").mkdir(parents=True)
    (job / "metrics.json").write_text("not json {")
    read = []
    real_folder, real_epochs = checkpoints.folder, checkpoints.job_epochs
    monkeypatch.setattr(checkpoints, "folder", lambda p: read.append(p) or real_folder(p))
    monkeypatch.setattr(checkpoints, "job_epochs", lambda p, h: read.append(p) or real_epochs(p, h))
    at = run_page(PAGE)
    at.selectbox(key="series_source").set_value(at.selectbox(key="series_source").options[-1]).run()
    messages = []
    for typed in ("/etc", str(outside), str(job), str(tmp_path / "missing"), f"{outside}/a,{outside}/b"):
        at.text_input(key="series_typed").set_value(typed).run()
        assert not at.exception, (typed, at.exception)
        assert at.error, typed
        text = at.error[0].value
        assert "secret" not in text and "checkpoint(s)" not in text, text
        messages.append(text.replace(typed.split(",")[0], "X"))
    assert read == []
    assert all("not a model folder under the dashboard's model folders" in m for m in messages), messages
