"""AppTest of the neurons page: the form is the schema's, the ablation table is the engine's, bad options are a
message."""

import pandas as pd

from analysis.core.inputs import read_file
from analysis.neurons.ablation import neurons
from analysis.neurons.options import NeuronsConfig
from models.loading import ModelSpec, load_model
from tests.support.pages import run_page
from ui.inputs import DEMO_LABELLED

PAGE = "pages/10_Neurons.py"


def test_the_page_shows_the_engines_ablation(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error
    at.number_input(key="neurons_k").set_value(4).run()
    at.number_input(key="neurons_random_seeds").set_value(2).run()
    at.button(key="neurons_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    expected = neurons(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                       read_file(DEMO_LABELLED, label_column="label"), NeuronsConfig(k=4, random_seeds=2))
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected.ablation,
                                  check_dtype=False)
    assert len(at.get("plotly_chart")) == 2


def test_bad_layers_are_a_message(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="neurons_layers").set_value("").run()
    assert not at.exception and at.error
