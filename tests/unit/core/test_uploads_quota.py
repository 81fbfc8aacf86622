"""The uploads folder is bounded (issue 34.15): a browser could fill the disk one 50 MB upload at a time. Its total
size is capped (``LAYERLENS_UPLOADS_MAX_MB``), a refusal says the cap, the use and how to make room, and the pages
that save uploads list them with a way to delete them (only inside the uploads folder)."""

from __future__ import annotations

import os

import pytest

from analysis.core.inputs import InputError
from jobs.store import JobStore
from tests.support.pages import run_page

MB = 1 << 20


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    monkeypatch.setenv("LAYERLENS_UPLOADS_MAX_MB", "1")
    return tmp_path / "home"


def rows(n_bytes: int, seed: int) -> bytes:
    """A CSV file of about ``n_bytes`` (distinct per ``seed``: uploads are named by their content's hash)."""
    line = f"a text of seed {seed},pos\n".encode()
    return b"text,label\n" + line * (n_bytes // len(line))


def test_an_upload_over_the_cap_is_refused_saying_the_cap_the_use_and_how_to_delete(home):
    from analysis.core.dataroots import save_upload, uploads

    first = save_upload(rows(600_000, 1), "a.csv")
    assert save_upload(rows(600_000, 1), "again.csv") == first  # the same content again takes no more room
    before = sorted(p.name for p in uploads().iterdir())
    with pytest.raises(InputError) as caught:
        save_upload(rows(600_000, 2), "b.csv")
    message = str(caught.value)
    assert "'b.csv'" in message and "cap of 1 MB" in message and "LAYERLENS_UPLOADS_MAX_MB" in message, message
    assert f"holds {first.stat().st_size / MB:.2f} MB in 1 file" in message, message
    assert "delete" in message and "\n" not in message, message
    assert sorted(p.name for p in uploads().iterdir()) == before  # nothing written, nothing partial left
    from analysis.core.dataroots import list_uploads

    assert [(u.name, u.size) for u in list_uploads()] == [(first.name, first.stat().st_size)]


def test_a_partial_file_left_by_a_killed_save_is_cleared_and_counted_until_then(home):
    """A save killed mid-write (SIGKILL) leaves its hidden temporary file: it takes room, so it counts, and the
    next save (which holds the folder's lock, so no other save is writing) removes it."""
    from analysis.core.dataroots import save_upload, uploads, uploads_used

    folder = uploads()
    folder.mkdir(parents=True)
    stale = folder / ".0123456789abcdef.csv.99999.1.part"
    stale.write_bytes(b"x" * 900_000)
    assert uploads_used() == 900_000
    saved = save_upload(rows(600_000, 3), "c.csv")
    assert not stale.exists() and saved.exists() and uploads_used() == saved.stat().st_size


@pytest.mark.parametrize("setting", ["0", "-5", "lots", "1.5"])
def test_a_bad_cap_setting_is_one_line(home, monkeypatch, setting):
    from analysis.core.dataroots import save_upload

    monkeypatch.setenv("LAYERLENS_UPLOADS_MAX_MB", setting)
    with pytest.raises(InputError, match="LAYERLENS_UPLOADS_MAX_MB must be a whole number of at least 1"):
        save_upload(b"text\nx\n", "x.csv")


def test_the_default_cap(home, monkeypatch):
    from analysis.core.dataroots import UPLOADS_MAX_MB, uploads_cap

    monkeypatch.delenv("LAYERLENS_UPLOADS_MAX_MB")
    assert uploads_cap() == UPLOADS_MAX_MB * MB == 1024 * MB


def test_delete_reaches_only_the_uploads_folder(home, tmp_path):
    from analysis.core.dataroots import delete_upload, list_uploads, save_upload, uploads

    saved = save_upload(rows(1000, 4), "a.csv")
    outside = tmp_path / "keep.csv"
    outside.write_text("text\nmine\n")
    (uploads() / "link.csv").symlink_to(outside)
    (uploads() / ".lock").touch(exist_ok=True)
    assert [u.name for u in list_uploads()] == [saved.name]  # the symlink and hidden files are not uploads
    for name in ("../keep.csv", str(outside), "link.csv", ".lock", "", ".", "..", "missing.csv", "sub/a.csv"):
        with pytest.raises(InputError, match="not an upload"):
            delete_upload(name)
    assert outside.read_text() == "text\nmine\n" and (uploads() / "link.csv").is_symlink()
    delete_upload(saved.name)
    assert not saved.exists() and list_uploads() == []


@pytest.mark.slow  # three pages opened
def test_the_pages_that_save_uploads_list_them_and_delete_them(home, tiny_dirs):
    """The jobs, Linguistic structure and Token atlas pages list the uploads (name, size) with the folder's use
    against the cap; Delete removes the chosen file, and a file a queued job reads cannot be chosen."""
    from analysis.core.dataroots import list_uploads, save_upload

    for page, key, radio in (("pages/5_Fine_Tune_Jobs.py", "job", ("job_source", "Upload a file")),
                             ("pages/6_Linguistic_structure.py", "structure", None),
                             ("pages/8_Token_atlas.py", "tokens", None)):
        kept, doomed = save_upload(rows(3000, 5), "kept.csv"), save_upload(rows(2000, 6), "doomed.csv")
        JobStore(home / "jobs").submit({"train": str(kept), "model": "demo"}, "cpu", "reads kept.csv")
        at = run_page(page, model=str(tiny_dirs["bert"]))
        if radio:
            at.radio(key=radio[0]).set_value(radio[1]).run()
        assert not at.exception, page
        table = next(d.value for d in at.dataframe if list(d.value.columns) == ["file", "MB", "saved"])
        assert sorted(table["file"]) == sorted([kept.name, doomed.name]), page
        sizes = dict(zip(table["file"], table["MB"], strict=True))
        assert sizes[kept.name] == pytest.approx(kept.stat().st_size / MB, abs=0.005)
        use = sum(p.stat().st_size for p in (kept, doomed)) / MB
        assert any(f"{use:.2f} MB of its 1 MB" in c.value for c in at.caption), page
        pick = at.multiselect(key=f"{key}_uploads_pick")
        assert pick.options == [doomed.name], page  # kept.csv is read by a queued job
        pick.set_value([doomed.name]).run()
        at.button(key=f"{key}_uploads_delete").click().run()
        assert not at.exception and not doomed.exists() and kept.exists(), page
        assert [u.name for u in list_uploads()] == [kept.name]
        os.remove(kept)
