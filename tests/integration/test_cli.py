import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
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


def test_probe_writes_the_contract_files(tiny_dirs, tmp_path):
    import pandas as pd

    from analysis.core.inputs import TextInputs
    from analysis.probe.reconstruction import ProbeConfig, probe

    texts = tmp_path / "texts.tsv"
    texts.write_text("text\tlabel\nthe film is good .\t1\ni hated it !\t0\nfun\t1\n")
    out = tmp_path / "out"
    argv = ["probe", "--model", str(tiny_dirs["bert"]), "--input", str(texts), "--out", str(out), "--top-k", "2"]
    assert main(argv) == 0
    layers = pd.read_csv(out / "layers.csv")
    assert list(layers.columns) == ["layer", "tokens", "correct", "accuracy", "sentence_mean", "ci_low", "ci_high"]
    expected = probe(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                     TextInputs(("the film is good .", "i hated it !", "fun")), ProbeConfig(top_k=2)).layers
    pd.testing.assert_frame_equal(layers, expected, check_dtype=False)
    decoded = pd.read_csv(out / "decoded.csv", keep_default_na=False)
    assert list(decoded.columns) == ["text_id", "layer", "text"] and len(decoded) == 3 * len(layers)
    tokens = pd.read_parquet(out / "tokens.parquet")
    assert {"text_id", "layer", "position", "input_token", "predicted_token", "correct", "prob", "rank",
            "top_tokens"} <= set(tokens.columns)
    assert len(tokens) == layers["tokens"].iloc[0] * len(layers)
    run = json.loads((out / "run.json").read_text())
    assert run["options"]["top_k"] == 2 and run["texts"] == 3 and "transformers" in run["versions"]


@pytest.mark.slow  # a real process per case (the one stderr line is the process's)
@pytest.mark.parametrize("content, extra, message", [
    (b"", [], "in.csv is empty"),
    (b"sentence\nhello\n", [], "no column 'text'"),
    (b"\x00\x01\x02binary", [], "binary"),
    (b"text\ncaf\xe9\n", [], "not UTF-8"),
    (b"text\nfine\n", ["--mode", "sideways"], "invalid choice"),
])
def test_probe_bad_input(tiny_dirs, tmp_path, content, extra, message):
    path = tmp_path / "in.csv"
    path.write_bytes(content)
    out = subprocess.run([sys.executable, "-m", "analysis", "probe", "--model", str(tiny_dirs["bert"]), "--input",
                          str(path), "--out", str(tmp_path / "o"), *extra], capture_output=True, text=True,
                         env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_probe_needs_out(tiny_dirs, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("hello\n")
    assert main(["probe", "--model", str(tiny_dirs["bert"]), "--input", str(path)]) == 2
    assert "--out DIR is required" in capsys.readouterr().err


def test_probe_reports_truncation(tiny_dirs, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("the film is good and fun and very good .\nfun\n")
    assert main(["probe", "--model", str(tiny_dirs["bert"]), "--input", str(path), "--out", str(tmp_path / "o"),
                 "--max-length", "6"]) == 0
    assert "1 text(s) longer than 6 tokens were cut" in capsys.readouterr().err


def readme_examples() -> list[str]:
    """The lines of the README's CLI example block (marked by a comment before it)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = text.split("<!-- cli examples:", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines()]


@pytest.mark.slow  # about a minute: every example of the README's CLI block on the demo model
def test_every_readme_example_runs_as_written(tmp_path, monkeypatch):
    """From the repository root, each example's own output folder under out/ (here under a temp dir), the jobs
    under a temp LAYERLENS_HOME; 'jobs submit' only queues (no worker) so nothing outlives the test."""
    import shlex
    from pathlib import Path

    from jobs.store import JobStore

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    examples = readme_examples()
    assert len(examples) >= 6
    outs = set()
    for line in examples:
        argv = shlex.split(line)
        assert argv[0] == "layerlens", line
        argv = [str(tmp_path / a) if a.startswith("out/") else a for a in argv[1:]]
        if "--out" in argv:
            outs.add(argv[argv.index("--out") + 1])
        if argv[:2] == ["jobs", "submit"]:
            argv.append("--no-worker")
        assert main(argv) == 0, line
    assert len(outs) == len([e for e in examples if "--out" in e])  # each its own folder
    assert (tmp_path / "out" / "finetune" / "metrics.json").is_file()
    assert [j.status for j in JobStore().list()] == ["queued"] * 3  # one job, then a sweep of two


def test_the_layerlens_command_is_the_cli():
    """`make install` installs this clone editable: the venv has a `layerlens` script that runs cli.main:main."""
    from pathlib import Path

    script = Path(sys.executable).with_name("layerlens")
    if not script.exists():
        pytest.skip("not installed with `make install` (no layerlens script beside this Python)")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: layerlens"), done.stderr
    assert "probe" in done.stdout and "finetune" in done.stdout


@pytest.mark.parametrize("argv", [["--help"], ["jobs", "list"], ["jobs", "show", "1"], ["jobs", "cancel", "1"],
                                  ["finetune", "--help"], ["jobs", "--help"]])
def test_status_commands_import_no_torch_transformers_or_streamlit(argv, tmp_path):
    code = ("import runpy, sys\nsys.argv = ['analysis', *sys.argv[1:]]\ntry:\n"
            "    runpy.run_module('analysis', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'streamlit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         env={**__import__("os").environ, "LAYERLENS_HOME": str(tmp_path)})
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


BILLION_LAUGHS = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize("content, message", [
    (BILLION_LAUGHS, "more than 50 YAML aliases"),
    (b"\x00\xff\xfe binary", "is not a text file"),
    ("- just\n- a list\n", "must hold a mapping"),
    ("lr: 1e-4\nnot_an_option: 3\n", "unknown option(s) not_an_option"),
])
def test_bad_config_files_are_one_line_naming_the_file(tmp_path, capsys, content, message):
    import time

    path = tmp_path / "job.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    start = time.perf_counter()
    assert main(["jobs", "submit", "--config", str(path), "--no-worker"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err and err.count("\n") == 1, err
    assert time.perf_counter() - start < 30  # (a guard against the alias bomb hanging the suite, not a benchmark)


def alias_doubling_bomb() -> str:
    """Issue 25.7's file: 12 KB and 50 aliases, under the alias cap; a 2,000-string list doubled 25 times
    expands to 67 billion strings when anything walks the value (the options' error message did: MemoryError)."""
    parts = ["&a0 [" + ", ".join(["xxxx"] * 2000) + "]"]
    parts += [f"&a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 26)]
    return "lr: [" + ",\n  ".join(parts) + "]\n"


@pytest.fixture
def memory_capped():
    """The address space of this process capped at 2 GiB above what it maps now, so that a regression fails with
    MemoryError instead of taking the machine's memory (the bomb needs more than 4 GB)."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 2 * 2**30, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("argv", [["finetune", "--out", "OUT", "--config"],
                                  ["jobs", "submit", "--no-worker", "--config"]])
def test_an_alias_bomb_under_the_alias_cap_is_refused_while_loading(tmp_path, capsys, argv, memory_capped):
    path = tmp_path / "job.yaml"
    path.write_text(alias_doubling_bomb())
    assert len(path.read_bytes()) < 13_000 and alias_doubling_bomb().count("*") == 50
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    assert main([*argv, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err, err
    assert "more than 100,000 YAML nodes" in err and "MemoryError" not in err
    assert not (tmp_path / "o").exists()


def test_a_recursive_alias_is_refused(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("lr: &a [1, *a]\n")
    assert main(["jobs", "submit", "--no-worker", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "refers to itself" in err, err


def test_a_huge_config_file_is_refused(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("lr: 1e-4\n" + "#" * 2**20)
    assert main(["jobs", "submit", "--config", str(path)]) == 2
    assert "at most 1,048,576" in capsys.readouterr().err


def test_probe_and_atlas_refuse_more_rows_than_the_limit_unless_raised(tmp_path, capsys, tiny_dirs):
    texts = tmp_path / "many.txt"
    texts.write_text("".join(f"the film {i} .\n" for i in range(30)))
    argv = ["probe", "--model", str(tiny_dirs["bert"]), "--input", str(texts), "--out", str(tmp_path / "o")]
    assert main([*argv, "--max-rows", "20"]) == 2
    assert "30 rows are more than the probe's limit of 20: raise it with --max-rows 30" in capsys.readouterr().err
    assert main([*argv, "--max-rows", "30"]) == 0


def test_a_duplication_plan_deeper_than_4x_is_refused_before_loading(tmp_path, capsys, tiny_dirs):
    plan = ",".join(["0"] * 2000)
    assert main(["duplicate", "--model", str(tiny_dirs["bert"]), "--plan", plan, "--out", str(tmp_path / "d")]) == 2
    assert "a plan of 2,000 layers is deeper than 12 (4x the model's 3 layers)" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_the_readme_tables_of_probe_atlas_and_compare_are_their_schemas():
    from analysis.atlas.options import ATLAS_FLAGS, AtlasConfig
    from analysis.compare.options import COMPARE_FLAGS, CompareConfig
    from analysis.core.options import command_flags, markdown_table
    from analysis.probe.options import PROBE_FLAGS, ProbeConfig
    from cli.main import build_parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    parser = build_parser()
    for command, schema, flags in (("probe", ProbeConfig, command_flags(PROBE_FLAGS)),
                                   ("atlas", AtlasConfig, command_flags(ATLAS_FLAGS)),
                                   ("compare", CompareConfig, COMPARE_FLAGS)):
        table = markdown_table(schema, flags)
        assert table in readme, f"the README's `layerlens {command}` table is not the schema's:\n{table}"
        sub = parser._subparsers._group_actions[0].choices[command]
        given = {flag for action in sub._actions for flag in action.option_strings}
        assert set(flags.values()) <= given, (command, set(flags.values()) - given)
