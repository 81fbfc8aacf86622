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
