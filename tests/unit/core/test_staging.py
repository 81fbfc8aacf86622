"""Outputs are whole or absent (issue 20.4): a staging folder renamed into place, the old result kept until then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from analysis.core.inputs import InputError
from analysis.core.staging import check_replaceable, clean_stale, staged
from cli.main import main

ROOT = Path(__file__).resolve().parents[3]


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".staging-" in p.name]


def test_staged_replaces_only_on_success(tmp_path):
    out = tmp_path / "out"
    with staged(out) as stage:
        (stage / "run.json").write_text("{}")
        (stage / "a.csv").write_text("first")
    assert snapshot(out) == {"run.json": b"{}", "a.csv": b"first"}
    with pytest.raises(RuntimeError), staged(out) as stage:
        (stage / "run.json").write_text("{}")
        (stage / "b.csv").write_text("half")
        raise RuntimeError("interrupted")
    assert snapshot(out) == {"run.json": b"{}", "a.csv": b"first"} and leftovers(tmp_path) == []
    with staged(out) as stage:
        (stage / "run.json").write_text("{}")
    assert snapshot(out) == {"run.json": b"{}"}  # a new result replaces the old one whole, no stale files


def test_a_folder_of_your_own_is_never_replaced(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="LayerLens did not write"):
        check_replaceable(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        check_replaceable(tmp_path / "file")


def test_stale_staging_of_a_dead_process_is_cleaned(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".out.staging-{dead.pid}-abc"
    stale.mkdir()
    mine = tmp_path / f".out.staging-{os.getpid()}-abc"
    mine.mkdir()
    assert clean_stale(tmp_path / "out") == [stale] and mine.exists()


def probe_twice(tmp_path, tiny_dirs, monkeypatch, on_second_file) -> tuple[Path, dict, list]:
    """Probe into ``out``, then patch the CLI's writer so that ``on_second_file()`` runs as the second output file
    (decoded.csv, after layers.csv) is written by the next probe of another text. Returns ``out``, its
    snapshot after the first probe and the files the second has begun; the caller runs the second probe."""
    texts = tmp_path / "texts.txt"
    texts.write_text("the film is good .\nit was dull .\n")
    out = tmp_path / "out"
    assert main(probe_argv(tmp_path, tiny_dirs)) == 0
    before = snapshot(out)
    texts.write_text("a different text .\n")
    import analysis.tasks.probe

    calls = []

    def to_csv(frame, path=None, index=False):
        calls.append(path)
        if len(calls) == 2:
            assert leftovers(tmp_path)  # it is writing into its staging folder
            on_second_file()
        return frame.to_csv(path, index=index)

    monkeypatch.setattr(analysis.tasks.probe, "to_csv", to_csv)
    return out, before, calls


def probe_argv(tmp_path, tiny_dirs) -> list[str]:
    return ["probe", "--model", str(tiny_dirs["bert"]), "--input", str(tmp_path / "texts.txt"),
            "--out", str(tmp_path / "out")]


def test_a_probe_that_fails_while_writing_keeps_the_previous_result(tmp_path, tiny_dirs, monkeypatch, capsys):
    def disk_full():
        raise OSError("disk full")

    out, before, _ = probe_twice(tmp_path, tiny_dirs, monkeypatch, disk_full)
    assert main(probe_argv(tmp_path, tiny_dirs)) == 1 and "disk full" in capsys.readouterr().err
    assert snapshot(out) == before and leftovers(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_a_probe_killed_midway_keeps_the_previous_result(tmp_path, tiny_dirs, sig):
    """A real process signalled while it probes: exit 130, one line, no traceback, the previous result whole.
    (Signalled when its progress bar shows: a signal during Python's own start-up is not the CLI's to catch.)"""
    texts = tmp_path / "texts.txt"
    texts.write_text("the film is good .\n")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "analysis", "probe", "--model", str(tiny_dirs["bert"]), "--input", str(texts),
            "--batch-size", "1", "--out", str(out)]
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    before = snapshot(out)
    texts.write_text("".join(f"the film {i} is good and not very dull .\n" for i in range(2000)))
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err, probing = [], threading.Event()

    def read():  # the progress bar rewrites one line with \r: read what comes, not lines
        while chunk := os.read(proc.stderr.fileno(), 4096):
            err.append(chunk)
            if b"probing" in b"".join(err[-2:]):
                probing.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert probing.wait(120), b"".join(err).decode()[-2000:]
    assert proc.poll() is None, "the probe of 2,000 texts one at a time ended before it could be signalled"
    proc.send_signal(sig)
    proc.wait(timeout=60)
    reader.join(timeout=10)
    text = b"".join(err).decode(errors="replace")
    assert proc.returncode == 130 and "interrupted" in text and "Traceback" not in text, text[-2000:]
    assert snapshot(out) == before and leftovers(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_outputs_are_written_keeps_the_previous_result(tmp_path, tiny_dirs, sig, monkeypatch,
                                                                          capsys):
    """The signal arrives between two of the output files (layers.csv written into the staging folder, decoded.csv
    next): the command says it was interrupted, and the previous result is whole and nothing else is left. In this
    process, so that the signal lands at that point every time (from outside it raced the write's end)."""
    # handled at the next bytecode: within the second file's write
    out, before, calls = probe_twice(tmp_path, tiny_dirs, monkeypatch, lambda: os.kill(os.getpid(), sig))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    # Ctrl-C as in the command's own process (an earlier test's library may have replaced the handler in this one);
    # main() makes SIGTERM act like Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(probe_argv(tmp_path, tiny_dirs)) == 130 and "interrupted" in capsys.readouterr().err
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    assert len(calls) == 2 and snapshot(out) == before and leftovers(tmp_path) == []


def test_a_one_class_training_set_leaves_no_output_folder(tmp_path, tiny_dirs, capsys):
    data = tmp_path / "one.csv"
    data.write_text("text,label\n" + "".join(f"the film {i} .,pos\n" for i in range(10)))
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(tiny_dirs["bert"]), "--train", str(data), "--out", str(out)]) == 2
    assert "single class" in capsys.readouterr().err
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_full_disk_anywhere_in_a_command_is_one_line_naming_the_folder(tmp_path, monkeypatch, capsys):
    """Issue 43 (low): an ENOSPC that no writer turned into NoSpace said 'unexpected OSError: [Errno 28]' without
    the folder. The CLI's one handler now names the file's folder, or --out."""
    import errno

    import cli.main as cli_main

    out = tmp_path / "out"

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "probe.csv"))
    monkeypatch.setitem(cli_main.COMMANDS, "info", (full, "info", lambda p: None))
    assert cli_main.main(["info", "--model", "demo", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: no space left on device under {out}"), err
    assert "unexpected" not in err[0]


def test_a_file_written_whole_gets_the_mode_open_would_give(tmp_path):
    """Issue 53 item 17: reports (and every file written whole) were left 0600 by the temporary file's mode."""
    import os
    import stat

    from analysis.core.staging import write_atomic

    write_atomic(tmp_path / "report.html", lambda p: p.write_text("x"))
    plain = tmp_path / "plain.html"
    plain.write_text("x")
    assert stat.S_IMODE(os.stat(tmp_path / "report.html").st_mode) == stat.S_IMODE(os.stat(plain).st_mode)
