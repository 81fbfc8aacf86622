"""AppTest for the shell: home page and model anatomy page, with the demo model and tiny local models."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from models.loading import ModelSpec, load_model
from ui.sidebar import KEY_MODEL

TIMEOUT = 120
ROOT = Path(__file__).resolve().parents[1]


def run_page(path: str, model: str | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / path), default_timeout=TIMEOUT)
    if model is not None:
        at.session_state[KEY_MODEL] = model
    return at.run()


def test_home_loads_the_demo_model_by_default():
    at = run_page("app.py")
    assert not at.exception
    assert at.title[0].value.endswith("LayerLens")
    assert at.sidebar.selectbox(key=KEY_MODEL).value == "demo"
    assert not at.sidebar.error
    summary = load_model(ModelSpec("demo", device="cpu")).summary()
    assert f"{summary['layers']} layers" in at.sidebar.success[0].value


def test_home_names_every_analysis():
    at = run_page("app.py")
    text = " ".join(m.value for m in at.markdown)
    for title in ["Reconstruction probing", "Layer atlas", "Layer duplication", "Layer pooling"]:
        assert title in text


def test_bad_model_name_is_a_message_not_a_traceback(tmp_path):
    at = run_page("app.py", model=str(tmp_path / "missing"))
    assert not at.exception
    assert "is not a directory" in at.sidebar.error[0].value


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_anatomy_page_numbers_match_the_model(tiny_dirs, family):
    at = run_page("pages/1_Model_anatomy.py", model=str(tiny_dirs[family]))
    assert not at.exception and not at.sidebar.error
    model = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu")).model
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Encoder layers"] == str(model.config.num_hidden_layers)
    assert metrics["Parameters"] == f"{sum(p.numel() for p in model.parameters()):,}"
    table = at.dataframe[0].value
    assert len(table) == model.config.num_hidden_layers + 2  # embeddings, each layer, the head
    embeddings = model.base_model.embeddings
    assert table["parameters"].iloc[0] == sum(p.numel() for p in embeddings.parameters())
    if family == "albert":
        assert table["same module as"].iloc[2:-1].tolist() == [1] * (model.config.num_hidden_layers - 1)
    else:
        first = model.base_model.encoder.layer[0]
        assert table["parameters"].iloc[1] == sum(p.numel() for p in first.parameters())
