"""Server files the browser may read (issue 20.3): only under the data roots, symlinks resolved, dataset names
never paths."""

import pytest

from analysis.dataroots import browser_source, data_roots, hub_dataset_name, server_files, within_roots
from analysis.inputs import InputError


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
    assert data_roots()[0] == root.resolve() and data_roots()[1].name == "uploads"  # uploads: always a root
    assert server_files() == [root / "a.csv", root / "sub" / "b.txt"]
    assert within_roots(root / "sub" / ".." / "a.csv") == root / "a.csv"
    for outside in (tmp_path / "secret.csv", root / "link.csv", root / ".." / "secret.csv", "/etc/hostname"):
        with pytest.raises(InputError, match="not under the dashboard's data folders") as err:
            within_roots(outside)
        assert "password" not in str(err.value)  # never the file's content


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
    from analysis.dataroots import browser_model, model_roots

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
    from analysis.dataroots import model_roots
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
    from analysis.dataroots import save_upload

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    saved = save_upload(b"1\tx\n", name)
    assert saved.parent == tmp_path / "uploads" and saved.name.endswith(suffix) and ".." not in saved.name
    assert saved.read_bytes() == b"1\tx\n" and saved.name.count(".") == suffix.count(".")
    with pytest.raises(InputError, match="cannot read"):
        save_upload(b"x", "model.bin")
