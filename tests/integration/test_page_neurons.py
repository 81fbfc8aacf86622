"""AppTest of the neurons page: the form is the schema's, the ablation table is the engine's, bad options are a
message."""

import pandas as pd

from analysis.core.inputs import read_file
from analysis.neurons.ablation import neurons
from analysis.neurons.options import NeuronsConfig
from models.loading import ModelSpec, load_model
from tests.support.pages import run_page
from ui.inputs import DEMO_LABELLED

PAGE = "pages/10_Neurons.py"


def test_the_page_shows_the_engines_ablation(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error
    at.number_input(key="neurons_k").set_value(4).run()
    at.number_input(key="neurons_random_seeds").set_value(2).run()
    at.button(key="neurons_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    expected = neurons(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                       read_file(DEMO_LABELLED, label_column="label"), NeuronsConfig(k=4, random_seeds=2))
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected.ablation,
                                  check_dtype=False)
    assert len(at.get("plotly_chart")) == 2


def test_bad_layers_are_a_message(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="neurons_layers").set_value("").run()
    assert not at.exception and at.error


def test_the_page_runs_the_task_and_its_run_json_is_the_clis(tiny_dirs, tmp_path):
    """Issue 45: a page is its form, the task's run and the task's result. The result the page holds (and reports)
    is the task's own, and its run.json is the one `layerlens neurons` writes for the same options and rows, but for
    the timing."""
    import json

    from analysis.core.task import QuietContext
    from analysis.tasks import TASKS
    from analysis.tasks.neurons import NeuronsRun
    from ui.results import result_store
    from ui.tasks import page_options, task_key

    task = TASKS["neurons"]
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.number_input(key="neurons_k").set_value(4).run()
    at.number_input(key="neurons_random_seeds").set_value(2).run()
    at.button(key="neurons_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    data = read_file(DEMO_LABELLED, label_column="label")
    options = page_options(task, ModelSpec(str(tiny_dirs["bert"]), device="cpu"), data, k=4,
                           random_seeds=2)
    held = result_store().get(task_key(task, options, data))
    assert isinstance(held, NeuronsRun)
    (tmp_path / "page").mkdir()
    held.write(tmp_path / "page")
    cli = task.run(options, QuietContext(tmp_path / "cli"))
    cli.write(tmp_path / "cli")
    page_run, cli_run = (json.loads((tmp_path / side / "run.json").read_text()) for side in ("page", "cli"))
    for record in (page_run, cli_run):
        record.pop("seconds")
    assert page_run == cli_run and page_run["data"] == str(DEMO_LABELLED) and page_run["options"]["k"] == 4
    for name in ("ranking.csv", "ablation.csv"):  # the weights agree to the saga solver's tolerance (threads)
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "page" / name), pd.read_csv(tmp_path / "cli" / name),
                                      check_exact=False, rtol=1e-3, atol=1e-3)
