"""One definition of the fine-tuning options: a preset gives the same options from the CLI, a config file, a
job and the page's form; bad values are one message naming the option; the README's table is the schema's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.core.inputs import InputError
from analysis.core.options import markdown_table
from analysis.training.options import PRESETS, FinetuneOptions, resolve
from cli.main import main
from jobs.store import JobStore
from jobs.submit import SubmitError, submit
from tests.support.data import synthetic
from tests.support.pages import run_page
from tests.unit.training.test_training import write_tsv

ROOT = Path(__file__).resolve().parents[3]


def test_presets_are_the_papers_settings():
    sun = resolve({"preset": "sun2019", "model": "bert-base-uncased"})
    assert (sun.head, sun.batch_size, sun.lr, sun.layer_decay, sun.epochs, sun.truncation, sun.max_length,
            sun.warmup) == ("cls", 24, 2e-5, 0.95, 4, "head+tail", 512, 0.1)  # Sun et al. §5.1, §5.3
    gru = resolve({"preset": "grubert", "model": "bert-base-uncased"})
    assert (gru.head, gru.batch_size, gru.lr, gru.schedule, gru.epochs, gru.early_stopping, gru.max_length) == (
        "gru-share-3", 64, 1e-5, "epoch-decay", 15, True, 40)  # GRUBERT §2.3
    assert resolve({"preset": "sun2019", "model": "demo"}).lr == 2e-5  # a preset beats the model's default
    assert resolve({"model": "demo"}).lr == 1e-4 and resolve({"model": "x"}).lr == 2e-5
    assert resolve({"preset": "sun2019", "epochs": 1}).epochs == 1  # what is given beats the preset
    for preset in PRESETS.values():
        assert set(preset) <= set(FinetuneOptions.model_fields)


@pytest.mark.parametrize("given, message", [
    ({"num_processes": "abc"}, "num_processes (processes): expected a whole number, got 'abc'"),
    ({"num_processes": 0}, "num_processes (processes): must be at least 1"),
    ({"num_processes": -1}, "must be at least 1"),
    ({"lr": float("nan")}, "lr (learning rate)"), ({"truncation": "middle"}, "truncation: must be one of"),
    ({"early_stopping": "maybe"}, "early_stopping (early stopping): must be true or false"),
    ({"learning_rate": 1}, "unknown option(s) learning_rate"), ({"preset": "bert"}, "unknown preset 'bert'"),
])
def test_bad_values_are_one_message_naming_the_option(given, message):
    with pytest.raises(InputError) as info:
        resolve(given)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_a_preset_gives_the_same_options_from_the_cli_a_config_file_a_job_and_the_page(bert4, tmp_path,  # noqa: F811
                                                                                        monkeypatch):
    train = str(write_tsv(tmp_path / "train.tsv", synthetic(20)))
    given = {"model": str(bert4), "train": train, "preset": "sun2019", "max_steps": 1}
    assert main(["finetune", "--model", str(bert4), "--train", train, "--preset", "sun2019", "--max-steps", "1",
                 "--out", str(tmp_path / "cli")]) == 0
    from_cli = json.loads((tmp_path / "cli" / "run.json").read_text())["options"]
    config = tmp_path / "c.json"
    config.write_text(json.dumps(given))
    assert main(["finetune", "--config", str(config), "--out", str(tmp_path / "file")]) == 0
    assert json.loads((tmp_path / "file" / "run.json").read_text())["options"] == from_cli
    store = JobStore(tmp_path / "jobs")
    job = store.get(submit(given, store, start_worker=False))
    assert job.config == from_cli
    # the page: choosing the preset fills the form with its values before submitting
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(tmp_path))  # the page picks server files under the data roots
    at = run_page("pages/5_Fine_Tune_Jobs.py", model=str(bert4))
    at.radio(key="job_source").set_value("A file on the server").run()
    at.selectbox(key="job_server_file").set_value(Path(train).resolve()).run()
    at.selectbox(key="job_preset").set_value("sun2019").run()
    shown = {k: at.session_state[f"job_{k}"] for k in ("head", "epochs", "lr", "batch_size", "layer_decay",
                                                          "max_length", "truncation", "warmup")}
    assert shown == {"head": "cls", "epochs": 4, "lr": 2e-5, "batch_size": 24, "layer_decay": 0.95,
                     "max_length": 512, "truncation": "head+tail", "warmup": 0.1}
    at.button(key="job_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    page_job = JobStore(tmp_path / "home" / "jobs").list()[0]
    assert {k: v for k, v in page_job.config.items() if k != "max_steps"} == {
        k: v for k, v in from_cli.items() if k != "max_steps"}


@pytest.mark.slow
def test_job_code_does_not_import_the_cli():
    code = "import sys, jobs.submit, jobs.run, jobs.worker; print(sorted(m for m in sys.modules if 'cli' in m))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "cli.main" not in out, out


def imports_cli(source: str) -> bool:
    """Whether Python ``source`` imports the CLI (``cli`` or ``layerlens.cli``, any module of it), by its AST."""
    import ast

    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == "cli" or n.startswith(("cli.", "layerlens.cli")) for n in names):
            return True
    return False


def test_no_module_but_the_cli_imports_the_cli():
    """Every module of analysis, jobs, models, ui and pages (subpackages too: the earlier version read only
    ``analysis/*.py`` and so could never fail), and app.py; ``python -m analysis`` (analysis/__main__.py) is the
    one shim allowed. The checker itself is checked on planted sources."""
    assert imports_cli("from cli.common import UserError") and imports_cli("import cli.main as m")
    assert imports_cli("def f():\n    from layerlens.cli.main import main") and not imports_cli("import client")
    paths = [p for top in ("analysis", "jobs", "models", "ui", "pages") for p in (ROOT / top).rglob("*.py")
             if "demo" not in p.parts]
    assert len(paths) > 80
    for path in [*paths, ROOT / "app.py"]:
        if path == ROOT / "analysis" / "__main__.py":
            continue
        assert not imports_cli(path.read_text()), f"{path.relative_to(ROOT)} imports the CLI"


def test_the_readme_option_table_is_the_schema():
    readme = (ROOT / "README.md").read_text()
    assert markdown_table(FinetuneOptions) in readme, "regenerate: python -m analysis.training.options"


@pytest.mark.parametrize("value", ["abc", 0, -1, 2.5])
def test_a_job_with_bad_num_processes_is_not_queued(tmp_path, value):
    store = JobStore(tmp_path / "jobs")
    with pytest.raises(SubmitError, match="num_processes"):
        submit({"train": "demo", "num_processes": value}, store, start_worker=False)
    assert store.list() == []


def test_the_default_learning_rate_follows_the_models_size_not_its_name(tmp_path):
    """The demo model (hidden 256) and a deeper export of it get the same default; bert-base-sized models 2e-5."""
    from analysis.duplication.export import export
    from analysis.duplication.plan import duplicate_first
    from jobs.submit import job_name
    from models.loading import ModelSpec, load_model

    demo = load_model(ModelSpec("demo", device="cpu"))
    deeper = export(demo, duplicate_first(demo.num_layers, 1), tmp_path / "deeper")
    assert resolve({"model": "demo"}).lr == resolve({"model": str(deeper)}).lr == 1e-4
    assert resolve({"model": "bert-base-uncased"}).lr == 2e-5  # offline here: its config is unknown, so 2e-5
    name = job_name(resolve({"model": str(deeper), "train": "demo", "head": "attention", "epochs": 2}).to_dict())
    assert name == "attention · deeper · demo set · epochs 2"


def test_a_sweep_is_capped_before_it_is_expanded(monkeypatch):
    """Issue 25.6: 5 keys x 20 values (3.2 M points) or 12 x 10 (10^12) is refused from the value counts, before
    any point is built; LAYERLENS_MAX_SWEEP raises the cap (256 by default)."""
    import itertools

    from analysis.training.options import grid

    def never(*args, **kwargs):
        raise AssertionError("the points were being built")

    values = ",".join(str(i) for i in range(1, 21))
    five = [f"{k}={values}" for k in ("epochs", "batch_size", "patience", "folds", "max_length")]
    monkeypatch.setattr(itertools, "product", never)
    monkeypatch.delenv("LAYERLENS_MAX_SWEEP", raising=False)
    with pytest.raises(InputError, match=r"3,200,000 points.*256.*LAYERLENS_MAX_SWEEP"):
        grid(five)
    twelve = [f"{k}={','.join(str(i) for i in range(1, 11))}" for k in (
        "epochs", "batch_size", "patience", "folds", "max_length", "seed", "max_steps", "further_pretrain_steps",
        "lr", "dropout", "warmup", "weight_decay")]
    with pytest.raises(InputError, match=r"1,000,000,000,000 points"):
        grid(twelve)
    monkeypatch.undo()
    assert len(grid(["epochs=1,2,3,4,5,6,7,8", "seed=" + ",".join(map(str, range(32)))])) == 256
    with pytest.raises(InputError, match="261 points"):
        grid(["epochs=1,2,3,4,5,6,7,8,9", "seed=" + ",".join(map(str, range(29)))])  # 261
    monkeypatch.setenv("LAYERLENS_MAX_SWEEP", "300")
    assert len(grid(["epochs=1,2,3,4,5,6,7,8,9", "seed=" + ",".join(map(str, range(29)))])) == 261
    monkeypatch.setenv("LAYERLENS_MAX_SWEEP", "lots")
    with pytest.raises(InputError, match="LAYERLENS_MAX_SWEEP"):
        grid(["epochs=1,2"])


def test_the_cli_and_the_page_refuse_a_sweep_over_the_cap(tmp_path, monkeypatch, capsys):
    """Issue 25.6: the same cap, one line, nothing queued, from ``jobs submit --grid`` and the page."""
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    monkeypatch.delenv("LAYERLENS_MAX_SWEEP", raising=False)
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"model": "demo", "train": "demo"}))
    values = ",".join(str(i) for i in range(1, 21))
    five = [f"{k}={values}" for k in ("epochs", "batch_size", "patience", "folds", "max_length")]
    assert main(["jobs", "submit", "--config", str(config), "--no-worker", "--grid", *five]) == 2
    err = capsys.readouterr().err
    assert "3,200,000 points" in err and "256" in err and len(err.strip().splitlines()) == 1
    at = run_page("pages/5_Fine_Tune_Jobs.py")
    at.text_input(key="job_grid").set_value(" ".join(five)).run()
    assert not at.exception and "3,200,000 points" in at.error[0].value and at.button(key="job_submit").disabled
    assert JobStore(tmp_path / "jobs").list() == []
