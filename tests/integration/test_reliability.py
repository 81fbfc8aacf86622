"""Issue 20.6 and 20.10: bad input and odd states give one readable line (CLI) or a message (pages), never an
'unexpected' error or a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli.main import main
from jobs.store import JobStore
from tests.support.pages import run_page


@pytest.mark.parametrize("argv, message", [
    (["atlas", "--model", "demo", "--hf-dataset", "", "--out", "OUT"], "no dataset name given"),
    (["finetune", "--model", "demo", "--train", "hf:/etc:train", "--out", "OUT"], "no dataset name given"),
    (["atlas", "--model", "demo", "--data", "analysis/data/demo_sentiment.csv", "--seed", "-1", "--out", "OUT"],
     "seed: must be at least 0, got '-1'"),
    (["probe", "--model", "demo", "--input", "analysis/data/demo_sentiment.csv", "--seed", "-2", "--out", "OUT"],
     "seed: must be at least 0, got '-2'"),
    (["finetune", "--model", "demo", "--train", "demo", "--weight-decay", "-0.1", "--out", "OUT"],
     "weight_decay (weight decay): must be at least 0"),
    (["probe", "--model", "demo", "--input", "analysis/data/demo_sentiment.csv", "--out", "FILE/sub"],
     "a part of the path is a file"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    (tmp_path / "file").write_text("x")
    argv = [a.replace("OUT", str(tmp_path / "out")).replace("FILE", str(tmp_path / "file")) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and message in errors[0], err
    assert "unexpected" not in err and "Traceback" not in err


def test_layer_weights_that_are_not_numbers_are_a_message(tmp_path, monkeypatch, bert4):  # noqa: F811
    from tests.integration.test_page_jobs import WEIGHTS
    from tests.support.jobs import finished_job

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    store = JobStore(tmp_path / "jobs")
    job_id = finished_job(store, bert4, "attention")
    (store.directory(job_id) / "artifacts" / "layer_weights.csv").write_text("example_id,layer_0\n1,abc\n")
    at = run_page(WEIGHTS, model=str(bert4))
    assert not at.exception and "column layer_0 holds values that are not numbers" in at.error[0].value


@pytest.mark.slow
def test_a_job_whose_artifacts_were_deleted_says_so(tmp_path, monkeypatch, bert4):  # noqa: F811
    import shutil

    from tests.integration.test_page_jobs import JOBS, WEIGHTS
    from tests.support.jobs import finished_job

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    store = JobStore(tmp_path / "jobs")
    kept, gone = finished_job(store, bert4, "attention"), finished_job(store, bert4, "cls")
    shutil.rmtree(store.directory(gone) / "artifacts")
    assert store.get(gone).shown_status == "succeeded · artifacts deleted"
    at = run_page(JOBS, model=str(bert4))
    assert not at.exception
    assert "succeeded · artifacts deleted" in set(at.dataframe[0].value["status"])
    at = run_page(WEIGHTS, model=str(bert4))
    assert not at.exception and any(f"#{gone}" in c.value and "deleted" in c.value for c in at.caption)
    assert [o.split(" ")[0] for o in at.selectbox(key="lw_job").options] == [f"#{kept}"]


@pytest.mark.slow
def test_jobs_list_reads_a_read_only_home(tmp_path):
    """A read-only LAYERLENS_HOME (permissions, as another user sees a shared one): jobs list and show work,
    cancel says it cannot write. As root (CI), the commands run without the capabilities that override file
    permissions."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    home = Path(tempfile.mkdtemp(prefix="layerlens-ro-"))
    try:
        store = JobStore(home / "jobs")
        store.submit({"model": "demo"}, "cpu", "old job")
        for path in (home, home / "jobs", *(home / "jobs").rglob("*")):
            path.chmod(0o555 if path.is_dir() else 0o444)

        # root ignores permissions unless it drops the capabilities that override them (util-linux's setpriv)
        drop = (["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                 "--inh-caps=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else [])

        def run(*argv):
            return subprocess.run([*drop, sys.executable, "-m", "analysis", "jobs", *argv], capture_output=True,
                                  text=True, env={**os.environ, "LAYERLENS_HOME": str(home)},
                                  cwd=Path(__file__).resolve().parents[2], timeout=60)

        listed = run("list")
        assert listed.returncode == 0 and "old job" in listed.stdout, listed.stderr
        shown = run("show", "1")
        assert shown.returncode == 0 and json.loads(shown.stdout)["name"] == "old job"
        cancel = run("cancel", "1")
        assert cancel.returncode == 2 and "read-only" in cancel.stderr and "Traceback" not in cancel.stderr
    finally:
        for path in (home, *home.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def test_an_unknown_key_in_a_finetune_config_names_the_file(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-4\nheads: cls\n")
    assert main(["finetune", "--config", str(path), "--out", str(tmp_path / "o")]) == 2
    assert f"{path}: unknown option(s) heads" in capsys.readouterr().err


@pytest.mark.slow
def test_a_read_only_out_is_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    texts = tmp_path / "texts.txt"
    texts.write_text("the film is good .\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    drop = (["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search",
             "--"] if os.geteuid() == 0 else [])
    try:
        done = subprocess.run([*drop, sys.executable, "-m", "analysis", "probe", "--model", "demo", "--input",
                               str(texts), "--out", str(locked / "out")], capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parents[2])
    finally:
        locked.chmod(0o755)
    assert done.returncode == 2 and f"no permission to write in {locked}" in done.stderr, done.stderr[-1000:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("damage", ["not a database", "a damaged page"])
def test_a_corrupt_job_database_is_one_line_naming_it(damage, tmp_path, monkeypatch, capsys, bert4):  # noqa: F811
    """Issue 25.9b: the store, the CLI and the worker name the file and say what to do."""
    from jobs.store import StoreError

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    db = tmp_path / "jobs" / "jobs.db"
    if damage == "not a database":
        db.parent.mkdir()
        db.write_bytes(b"this is not a database\n" * 200)
    else:
        store = JobStore(db.parent)
        for i in range(200):
            store.submit({"model": str(bert4), "train": "demo", "note": "x" * 200}, "cpu", name=f"job {i}")
        data = bytearray(db.read_bytes())
        data[4096 * 2:4096 * 4] = b"\xff" * 8192  # pages 3 and 4: the file opens, reading the jobs fails
        db.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="move it aside"):
        JobStore(db.parent).list()
    assert main(["jobs", "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(db) in err and "move it aside" in err and "unexpected" not in err, err
    from tests.integration.test_page_jobs import WEIGHTS

    at = run_page(WEIGHTS, model=str(bert4))  # the pages say the same line, never Streamlit's redacted error
    assert not at.exception and "move it aside" in at.error[0].value
