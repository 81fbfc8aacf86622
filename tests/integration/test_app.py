"""AppTest for the shell: home page and model anatomy page, with the demo model and tiny local models."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from models.loading import ModelSpec, load_model
from tests.support.pages import run_page
from ui.sidebar import KEY_DTYPE, KEY_MODEL, KEY_OTHER, OTHER

TIMEOUT = 120
ROOT = Path(__file__).resolve().parents[2]


def test_home_loads_the_demo_model_by_default():
    at = run_page("app.py")
    assert not at.exception
    assert at.title[0].value.endswith("LayerLens")
    assert at.sidebar.selectbox(key=KEY_MODEL).value == "demo"
    assert not at.sidebar.error
    summary = load_model(ModelSpec("demo", device="cpu")).summary()
    assert f"{summary['layers']} layers" in at.sidebar.success[0].value
    assert "Precision: exact: float32" in at.sidebar.success[0].value  # the mode is named


def test_the_sidebar_names_the_approximate_mode():
    from ui.sidebar import KEY_DTYPE

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    at.session_state[KEY_DTYPE] = "bfloat16"
    at.run()
    assert not at.exception and "Precision: approximate: encoder and head in bfloat16" in at.sidebar.success[0].value


def test_home_names_every_analysis():
    at = run_page("app.py")
    links = [getattr(e, "label", None) or getattr(e.proto, "label", "") for e in at.get("page_link")]
    text = " ".join([m.value for m in at.markdown] + links)
    for title in ["Reconstruction probing", "Layer atlas", "Layer duplication", "Layer weights", "Fine-tuning jobs"]:
        assert title in text


def test_bad_model_name_is_a_message_not_a_traceback(tmp_path):
    at = run_page("app.py", model=str(tmp_path / "missing"))
    assert not at.exception
    assert "is not a model folder under the dashboard's model folders" in at.sidebar.error[0].value


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_anatomy_page_numbers_match_the_model(tiny_dirs, family):
    at = run_page("pages/0_Model_anatomy.py", model=str(tiny_dirs[family]))
    assert not at.exception and not at.sidebar.error
    model = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu")).model
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Encoder layers"] == str(model.config.num_hidden_layers)
    assert metrics["Parameters"] == f"{sum(p.numel() for p in model.parameters()):,}"
    table = at.dataframe[0].value
    assert len(table) == model.config.num_hidden_layers + 1  # embeddings, then each layer
    embeddings = model.base_model.embeddings
    assert table["parameters"].iloc[0] == sum(p.numel() for p in embeddings.parameters())
    if family == "albert":
        assert table["same module as"].iloc[2:].tolist() == [1] * (model.config.num_hidden_layers - 1)
    else:
        first = model.base_model.encoder.layer[0]
        assert table["parameters"].iloc[1] == sum(p.numel() for p in first.parameters())
        assert "same module as" not in table.columns
    head = model.cls if family == "bert" else model.predictions
    assert f"{sum(p.numel() for p in head.parameters()):,} parameters" in " ".join(m.value for m in at.markdown)


def test_other_model_without_a_name_asks_for_one():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    at.sidebar.selectbox(key=KEY_MODEL).set_value(OTHER).run()
    assert not at.exception and not at.sidebar.error
    assert "Type a Hugging Face hub id" in at.sidebar.info[0].value


def test_model_choice_survives_a_page_switch(tiny_dirs):
    at = run_page("pages/0_Model_anatomy.py", model=str(tiny_dirs["distilbert"]))
    at.switch_page("app.py").run()
    assert at.sidebar.text_input(key=KEY_OTHER).value == str(tiny_dirs["distilbert"])
    assert "distilbert" in at.sidebar.success[0].value


@pytest.mark.slow
def test_an_incompatible_mlm_head_blocks_only_the_pages_that_need_a_head(tiny_dirs):
    """A head that cannot be lent (another family) is refused with its reason where a head is needed (probe,
    duplication preview), while the pages that need only the encoder (atlas, jobs, anatomy) work."""
    from ui.sidebar import KEY_HEAD_FROM

    def page(path):
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
        at.session_state[KEY_MODEL] = OTHER
        at.session_state[KEY_OTHER] = str(tiny_dirs["bert"])
        at.session_state[KEY_HEAD_FROM] = str(tiny_dirs["roberta"])
        at.run()
        at.switch_page(path).run()
        assert not at.exception
        return at

    for path in ("pages/2_Layer_Atlas.py", "pages/5_Fine_Tune_Jobs.py", "pages/0_Model_anatomy.py"):
        at = page(path)
        assert not any("Choose a model" in i.value for i in at.info), path
        assert "bert" in at.sidebar.success[0].value, path
        assert any("cannot read" in w.value and "family bert vs roberta" in w.value for w in at.sidebar.warning)
    for path in ("pages/1_Reconstruction.py", "pages/4_Layer_Duplication.py"):
        at = page(path)
        assert any("needs an MLM head" in e.value and "family bert vs roberta" in e.value for e in at.error), path


def test_the_servers_file_watcher_skips_the_venv(monkeypatch):
    """Streamlit watches the imported modules under the app's folder; .venv is there and must not be watched
    (read as the server reads its options, from the folder it starts in)."""
    import streamlit.config

    monkeypatch.chdir(ROOT)
    streamlit.config.get_config_options(force_reparse=True)
    assert ".venv" in streamlit.config.get_option("server.folderWatchBlacklist")


def open_url(query: dict) -> AppTest:
    """The app opened from a URL with ``query`` (a reload, or a link someone shared): a fresh session."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    for name, value in query.items():
        at.query_params[name] = value
    return at.run()


def test_the_model_chosen_in_the_sidebar_is_kept_in_the_url_and_a_reload_keeps_it(tiny_dirs):
    from ui.sidebar import KEY_DTYPE

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    assert "model" not in at.query_params  # the demo model: a clean URL
    at.sidebar.selectbox(key=KEY_MODEL).set_value(OTHER).run()
    at.sidebar.text_input(key=KEY_OTHER).set_value(str(tiny_dirs["distilbert"])).run()
    at.sidebar.selectbox(key=KEY_DTYPE).set_value("bfloat16").run()
    assert not at.exception and not at.sidebar.error
    query = dict(at.query_params)
    assert query["model"] == str(tiny_dirs["distilbert"]) and query["precision"] == "bfloat16"

    reloaded = open_url(query)
    assert not reloaded.exception and not reloaded.sidebar.error
    assert reloaded.sidebar.text_input(key=KEY_OTHER).value == str(tiny_dirs["distilbert"])
    assert "distilbert" in reloaded.sidebar.success[0].value and "bfloat16" in reloaded.sidebar.success[0].value

    at.sidebar.selectbox(key=KEY_MODEL).set_value("demo").run()  # back to the demo: the parameter goes
    assert "model" not in at.query_params


def test_a_suggested_model_in_the_url_is_selected():
    at = open_url({"model": "bert-base-uncased"})
    assert not at.exception and at.sidebar.selectbox(key=KEY_MODEL).value == "bert-base-uncased"


def test_a_model_in_the_url_passes_the_model_roots_check(tmp_path):
    """The query parameter is user input: a folder outside the model roots is refused as a typed one is."""
    outside = Path("/usr/share")  # a folder, not under the tests' model roots
    at = open_url({"model": str(outside), "head_from": "../../etc", "device": "tpu", "precision": "int3"})
    assert not at.exception and not at.sidebar.success
    assert "is not a model folder under the dashboard's model folders" in at.sidebar.error[0].value
    assert at.sidebar.selectbox(key="ll_device").value == "auto"  # values not offered are ignored
    assert at.sidebar.selectbox(key="ll_dtype").value == "auto"


def test_the_server_watches_no_files_unless_a_developer_asks(monkeypatch):
    """The file watcher is off (it flooded the log with "Inotify queue overflowed" while tests wrote files in the
    clone); `make dev` turns it on for development (read as the server reads its options)."""
    import subprocess

    import streamlit.config

    monkeypatch.chdir(ROOT)
    streamlit.config.get_config_options(force_reparse=True)
    assert streamlit.config.get_option("server.fileWatcherType") == "none"
    dev = subprocess.run(["make", "-n", "dev"], cwd=ROOT, capture_output=True, text=True)
    assert dev.returncode == 0 and "layerlens dashboard" in dev.stdout and "--dev" in dev.stdout
    import cli.dashboard

    started = []
    monkeypatch.setattr(cli.dashboard.os, "execv", lambda path, argv: started.append(argv))
    from cli.main import main

    assert main(["dashboard", "--dev"]) == 0 and main(["dashboard"]) == 0
    dev_argv, plain_argv = started
    assert dev_argv[1:4] == ["-m", "streamlit", "run"] and dev_argv[4] == str(ROOT / "app.py")
    assert "--server.fileWatcherType=auto" in dev_argv and "--server.fileWatcherType=none" not in dev_argv
    assert "--server.fileWatcherType=none" in plain_argv and "--server.fileWatcherType=auto" not in plain_argv


def test_the_sidebar_says_bfloat16_is_slower_on_a_cpu_without_bf16_units(tiny_dirs, monkeypatch):
    """Issue 43 item 15: bfloat16 chosen for the CPU where it has no bf16 units is said to be slower there, with
    this CPU's measured speed; with bf16 units (forced) nothing is said."""
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", "0")
    at = run_page("pages/0_Model_anatomy.py", model=str(tiny_dirs["bert"]))
    at.sidebar.selectbox(key=KEY_DTYPE).set_value("bfloat16").run()
    assert not at.exception
    notes = [w.value for w in at.sidebar.warning if "no bfloat16 units" in w.value]
    assert len(notes) == 1 and "x the speed of float32" in notes[0]
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", "1")
    at.run()
    assert not [w for w in at.sidebar.warning if "no bfloat16 units" in w.value]
