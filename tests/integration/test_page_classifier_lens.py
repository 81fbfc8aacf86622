"""AppTest of the classifier lens page: without a classifier it says how to get one; with two finished jobs it reads
both on the same rows, and its table is the task's."""

import pandas as pd

from analysis.core.inputs import read_file
from analysis.core.task import QuietContext
from analysis.tasks.classifier_lens import ClassifierLens, ClassifierLensOptions
from tests.support.jobs import finished_job
from tests.support.pages import run_page
from ui.inputs import DEMO_LABELLED

PAGE = "pages/11_Classifier_lens.py"


def test_without_a_classifier_the_page_says_how_to_get_one(home):  # noqa: F811
    at = run_page(PAGE)
    assert not at.exception and not at.error
    assert "no classification head" in at.info[0].value and "Fine-tune" in at.info[0].value


def test_two_jobs_side_by_side_on_the_same_rows(home, bert4, tmp_path):  # noqa: F811
    from analysis.training.finetune import Splits

    rows = read_file(DEMO_LABELLED, label_column="label")
    splits = Splits(rows.subset(list(range(0, 60))), rows.subset(list(range(60, 90))))
    cls, attention = finished_job(home, bert4, "cls", splits), finished_job(home, bert4, "attention", splits)
    at = run_page(PAGE)
    # a job's held-out rows are the default data (issue 53 item 9); these fake jobs' files are gone: the demo set
    assert at.radio(key="clens_source").options[0].startswith("Held-out rows of job #")
    at.radio(key="clens_source").set_value("Demo sentiment set").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.selectbox(key="clens_second").set_value(at.selectbox(key="clens_second").options[1]).run()
    at.button(key="clens_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 4
    first = at.selectbox(key="clens_first").value
    job = cls if f"#{cls} " in first else attention
    expected = ClassifierLens().read(ClassifierLensOptions(model=str(home.get(job).artifacts / "checkpoint"),
                                                           data=DEMO_LABELLED, device="cpu"), rows,
                                     QuietContext(tmp_path))
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected.layers, check_dtype=False)
