"""Server files the browser may read (issue 20.3): only under the data roots, symlinks resolved, dataset names
never paths."""

import pytest

from analysis.core.dataroots import browser_source, data_roots, hub_dataset_name, server_files, within_roots
from analysis.core.inputs import InputError


@pytest.fixture
def root(tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.csv").write_text("text,label\nx,1\n")
    (data / "sub" / "b.txt").write_text("x\n")
    (data / "notes.md").write_text("not data")
    secret = tmp_path / "secret.csv"
    secret.write_text("password,1\n")
    (data / "link.csv").symlink_to(secret)
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(data))
    return data


def test_files_under_the_roots_and_nothing_else(root, tmp_path):
    from analysis.core.dataroots import BUNDLED

    # the bundled data and the uploads: always roots (issue 34.12: LAYERLENS_DATA_DIRS adds, it does not replace)
    assert data_roots()[:2] == [BUNDLED.resolve(), root.resolve()] and data_roots()[2].name == "uploads"
    assert server_files(roots=[root]) == [root / "a.csv", root / "sub" / "b.txt"]
    assert within_roots(root / "sub" / ".." / "a.csv") == root / "a.csv"
    for outside in (tmp_path / "secret.csv", root / "link.csv", root / ".." / "secret.csv", "/etc/hostname"):
        with pytest.raises(InputError, match="not under the dashboard's data folders") as err:
            within_roots(outside)
        assert "password" not in str(err.value)  # never the file's content


def test_a_runs_own_files_are_not_offered_as_data(tmp_path):
    """A LayerLens run folder under a data root (a folder with run.json) holds results: its layers.csv and the
    files below it are not offered as texts or labelled rows; a corpus beside it still is."""
    (tmp_path / "corpus.txt").write_text("a text\n")
    run = tmp_path / "runs" / "probe1"
    (run / "artifacts").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "layers.csv").write_text("layer,accuracy\n0,0.5\n")
    (run / "artifacts" / "predictions.csv").write_text("text,label\nx,1\n")
    (tmp_path / "runs" / "texts.csv").write_text("text\nx\n")
    assert server_files(roots=[tmp_path]) == [tmp_path / "corpus.txt", tmp_path / "runs" / "texts.csv"]


def test_default_roots_are_the_bundled_data_and_the_uploads(monkeypatch, tmp_path):
    monkeypatch.delenv("LAYERLENS_DATA_DIRS", raising=False)
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    assert [r.name for r in data_roots()] == ["data", "uploads"]
    assert any(p.name == "demo_sentiment.csv" for p in server_files())


@pytest.mark.parametrize("name", ["/etc", "../x", "", "a b", "tests", "~/data"])
def test_dataset_names_are_names(name):
    with pytest.raises(InputError, match="not a Hugging Face dataset name"):
        hub_dataset_name(name)


def test_browser_sources(root):
    assert browser_source("demo") == "demo" and browser_source("hf:glue/sst2:train") == "hf:glue/sst2:train"
    assert browser_source(str(root / "a.csv")) == str(root / "a.csv")
    for bad in ("hf:/etc:train", "/etc/passwd", str(root / "link.csv")):
        with pytest.raises(InputError):
            browser_source(bad)


@pytest.fixture
def model_root(tmp_path, monkeypatch):
    """A model root holding one model folder, a folder outside it and a symlink leading out (issue 25.14b)."""
    root, outside = tmp_path / "models", tmp_path / "private"
    for folder in (root / "mine", outside):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "bert"}')
    (root / "escape").symlink_to(outside)
    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(root))
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    return root


def test_model_folders_typed_in_the_browser_are_confined_to_the_model_roots(model_root, tmp_path):
    from analysis.core.dataroots import browser_model, model_roots

    home = tmp_path / "home"
    assert model_roots() == [model_root.resolve(), (home / "exports").resolve(), (home / "jobs").resolve()]
    for allowed in ("demo", "bert-base-uncased", "textattack/bert-base-uncased-SST-2", str(model_root / "mine"),
                    f"random:{model_root / 'mine'}", "random:bert-base-uncased"):
        assert browser_model(allowed) == allowed
    messages = {}
    for refused in (tmp_path / "private", model_root / "escape", model_root / "absent", tmp_path / "absent",
                    model_root / "mine" / ".." / ".." / "private", "/etc", f"random:{tmp_path / 'private'}",
                    "~/x", "../private"):
        with pytest.raises(InputError) as err:
            browser_model(str(refused))
        messages[str(refused)] = str(err.value).replace(str(refused), "NAME")
    # one message whether the folder exists outside the roots or does not exist: nothing says which
    assert len(set(messages.values())) == 1, messages
    assert "not a model folder under the dashboard's model folders" in next(iter(messages.values()))


def test_default_model_roots(monkeypatch, tmp_path):
    from analysis.core.dataroots import model_roots
    from models.spec import DEMO_DIR

    monkeypatch.delenv("LAYERLENS_MODEL_DIRS", raising=False)
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import importlib

    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)
    try:
        roots = model_roots()
    finally:
        monkeypatch.undo()
        importlib.reload(huggingface_hub.constants)
    assert roots == [DEMO_DIR.resolve(), (tmp_path / "hub").resolve(), (tmp_path / "exports").resolve(),
                     (tmp_path / "jobs").resolve()]


@pytest.mark.parametrize("name,suffix", [("ud.conllu", ".conllu"), ("../../UD.CoNLLU.gz", ".conllu.gz"),
                                         ("corpus.txt.gz", ".txt.gz"), ("rows.csv", ".csv")])
def test_an_uploaded_treebank_or_gzipped_text_is_saved_under_its_type(name, suffix, monkeypatch, tmp_path):
    """A new user's report: uploading a .conllu on the Linguistic structure page raised instead of saving it."""
    from analysis.core.dataroots import save_upload

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    saved = save_upload(b"1\tx\n", name)
    assert saved.parent == tmp_path / "uploads" and saved.name.endswith(suffix) and ".." not in saved.name
    assert saved.read_bytes() == b"1\tx\n" and saved.name.count(".") == suffix.count(".")
    with pytest.raises(InputError, match="cannot read"):
        save_upload(b"x", "model.bin")


@pytest.fixture
def ewt_folder(tmp_path, monkeypatch):
    """A treebank's folder added to the data roots as the README says: its LICENSE.txt, README.md and a .conllu
    (issue 34.12)."""
    import shutil

    from tests.support.data import FIXTURES

    folder = tmp_path / "ud_english_ewt"
    folder.mkdir()
    (folder / "LICENSE.txt").write_text("Attribution-ShareAlike 4.0 International\n\nSection 1 - Definitions.\n")
    (folder / "README.md").write_text("# UD English EWT\n")
    shutil.copy(FIXTURES / "ud_tiny_train.conllu", folder / "en_ewt-ud-dev.conllu")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(folder))
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    return folder


BUNDLED_SAMPLE = ["en_ewt-ud-dev-first300.conllu.gz", "en_ewt-ud-test-first150.conllu.gz"]


def test_added_data_folders_keep_the_bundled_data_and_each_picker_offers_what_its_page_reads(ewt_folder):
    from analysis.core.dataroots import BUNDLED, LABELLED_SUFFIXES, TREEBANK_SUFFIXES, server_file_picker_label, uploads

    assert data_roots() == [BUNDLED.resolve(), ewt_folder.resolve(), uploads().resolve()]
    assert [p.name for p in server_files(TREEBANK_SUFFIXES)] == [*BUNDLED_SAMPLE, "en_ewt-ud-dev.conllu"]
    assert [p.name for p in server_files(LABELLED_SUFFIXES)] == ["demo_sentiment.csv", "demo_wordorder.csv"]
    texts = [p.name for p in server_files()]  # texts (.txt one per line): a licence is text a page can read
    assert "LICENSE.txt" in texts and "README.md" not in texts and "en_ewt-ud-dev.conllu" not in texts
    assert server_file_picker_label(BUNDLED / "demo_sentiment.csv") == "bundled/demo_sentiment.csv"
    assert server_file_picker_label(ewt_folder / "LICENSE.txt") == "ud_english_ewt/LICENSE.txt"


@pytest.mark.slow  # three pages opened
def test_the_pages_keep_the_bundled_data_and_default_to_the_sample(ewt_folder, tiny_dirs):
    """Issue 34.12: with the EWT folder added, the Token atlas's default corpus was LICENSE.txt (one text per
    licence line) and the bundled sample and demo sets had vanished from every picker."""
    from tests.support.pages import run_page

    at = run_page("pages/8_Token_atlas.py", model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error, [e.value for e in at.error]
    corpus = at.selectbox(key="tokens_file")
    assert corpus.value.name == BUNDLED_SAMPLE[0]
    assert {"bundled/demo_sentiment.csv", "ud_english_ewt/en_ewt-ud-dev.conllu"} <= set(corpus.options)

    at = run_page("pages/6_Linguistic_structure.py", model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error, [e.value for e in at.error]
    train, test = at.selectbox(key="structure_train"), at.selectbox(key="structure_test")
    assert (train.value.name, test.value.name) == tuple(BUNDLED_SAMPLE)
    assert train.options == [*(f"bundled/ud_english_ewt_sample/{n}" for n in BUNDLED_SAMPLE),
                             "ud_english_ewt/en_ewt-ud-dev.conllu"]

    at = run_page("pages/5_Fine_Tune_Jobs.py", model=str(tiny_dirs["bert"]))
    at.radio(key="job_source").set_value("A file on the server").run()
    assert not at.exception
    assert at.selectbox(key="job_server_file").options == ["bundled/demo_sentiment.csv", "bundled/demo_wordorder.csv"]
