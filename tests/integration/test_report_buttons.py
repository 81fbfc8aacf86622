"""The report's door on the pages (issue 46, part 3): every page with a finished result offers "Make a report to
share", and a click gives the file ``layerlens report`` makes of the same run."""

from pathlib import Path

from tests.support.jobs import finished_job
from tests.support.pages import run_page

ROOT = Path(__file__).resolve().parents[2]
NO_RESULT = {"0_Model_anatomy.py"}  # a description of the model, not a run


def test_every_page_with_a_result_has_the_button():
    for page in sorted((ROOT / "pages").glob("*.py")):
        if page.name in NO_RESULT:
            continue
        text = page.read_text()
        assert "report_button(" in text, f"{page.name} offers no report"


def test_the_neurons_pages_report(tiny_dirs):
    at = run_page("pages/10_Neurons.py", model=str(tiny_dirs["bert"]))
    at.number_input(key="neurons_k").set_value(4).run()
    at.number_input(key="neurons_random_seeds").set_value(2).run()
    at.button(key="neurons_run").click().run()
    at.button(key="neurons_report").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    html = at.session_state["neurons_report_html"].decode()
    assert html.startswith("<!DOCTYPE html>") and "LayerLens report: neurons" in html and "ablation.csv" in html
    # both of the page's charts, the page's run named as such, and the command of the task the page ran
    assert "at the layer whose units are zeroed" in html and "at the last layer" in html
    assert "neurons run from the dashboard" in html and "layerlens neurons" in html and "--k 4" in html


def test_a_finished_jobs_report(home, bert4):  # noqa: F811
    from analysis.core.task import RunRecord

    job = finished_job(home, bert4, "attention")
    at = run_page("pages/5_Fine_Tune_Jobs.py")
    assert any("no run.json" in c.value for c in at.caption)  # a job from before the run record: said, no button
    record = home.get(job)
    RunRecord("finetune", {**record.config, **record.metrics}).write(record.artifacts)  # as the worker writes it
    at.run()
    at.button(key=f"job_{job}_report").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    html = at.session_state[f"job_{job}_report_html"].decode()
    assert "LayerLens report: finetune" in html and "layerlens finetune" in html
