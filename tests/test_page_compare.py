"""AppTest of the Compare checkpoints page: the table it shows is the engine's; a bad B is a message."""

import pandas as pd

from analysis.compare.run import CompareConfig, compare
from analysis.inputs import read_file
from models.loading import ModelSpec, load_model
from tests.test_app import run_page
from ui.inputs import DEMO_LABELLED

PAGE = "pages/7_Compare_checkpoints.py"


def test_the_page_shows_the_engines_layer_summary_and_refuses_other_tokenizers(tiny_dirs):
    at = run_page(PAGE)  # the demo model as A
    assert not at.exception and not at.error
    at.text_input(key="compare_model").set_value("random").run()
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    demo = load_model(ModelSpec("demo", device="cpu"))
    random = load_model(ModelSpec("random:demo", device="cpu"))
    want = compare([demo, random], read_file(DEMO_LABELLED, label_column="label"), CompareConfig()).layer_summary
    shown = at.dataframe[0].value.reset_index(drop=True)
    pd.testing.assert_frame_equal(shown, want.drop(columns=["model_a", "model_b"]), check_exact=False, atol=1e-9)
    assert len(at.get("plotly_chart")) == 3  # the CKA curve, the cross matrix, the shared map
    at.text_input(key="compare_model").set_value(str(tiny_dirs["roberta"])).run()
    at.button(key="compare_run").click().run()
    assert not at.exception and "different tokenizers" in at.error[0].value
