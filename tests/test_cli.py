import json
import subprocess
import sys

import pytest

from analysis.cli import main
from models.loading import ModelSpec, load_model


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "analysis", "--help"], capture_output=True, text=True, check=True)
    assert "info" in out.stdout


def test_info_writes_the_same_summary_it_prints(tiny_dirs, tmp_path, capsys):
    assert main(["info", "--model", str(tiny_dirs["roberta"]), "--device", "cpu", "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "info.json").read_text())
    expected = load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu")).summary()
    assert {k: v for k, v in written.items() if k != "load_seconds"} == \
        {k: v for k, v in expected.items() if k != "load_seconds"}
    assert written["family"] == "roberta" and written["layers"] == 2
    assert "roberta" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["info", "--model", "/no/such/dir"], "is not a directory"),
    (["info", "--batch-size", "0"], "must be at least 1"),
    (["info", "--dtype", "int4"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_on_stderr_and_nonzero(argv, message):
    out = subprocess.run([sys.executable, "-m", "analysis", *argv], capture_output=True, text=True,
                         env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]
    assert "Traceback" not in out.stderr


def test_out_must_be_a_directory(tiny_dirs, tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("x")
    assert main(["info", "--model", str(tiny_dirs["bert"]), "--out", str(target)]) == 2
    assert "is not a directory" in capsys.readouterr().err
