"""A page's remembered request (ui.results.wait_for_run) holds every input of its result, the sidebar's model
included: changing the model in the sidebar after a run shows the page's hint and starts nothing until the Run
button is clicked again (issue 34, item 10)."""

import pytest

import analysis.compare.run
import analysis.probe.reconstruction
from tests.support.pages import run_page
from ui.sidebar import KEY_DTYPE, KEY_MODEL, KEY_OTHER, OTHER

COMPARE, PROBE = "pages/7_Compare_checkpoints.py", "pages/1_Reconstruction.py"


@pytest.fixture(autouse=True)
def fresh_results(monkeypatch):
    """A result store of this test's own: a result another test left under the same key would be shown without
    a run, and the count of runs would read 0 (seen in a full-suite run after the Reconstruction page's tests)."""
    import ui.results

    fresh = ui.results.ResultStore()
    monkeypatch.setattr(ui.results, "result_store", lambda: fresh)


def counting(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` (an engine function a page imports when it runs) by a wrapper that records each
    call's first argument; the pages import it anew on every rerun, so they call the wrapper."""
    calls, real = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def choose_model(at, path: str):
    at.sidebar.selectbox(key=KEY_MODEL).set_value(OTHER).run()
    return at.sidebar.text_input(key=KEY_OTHER).set_value(path).run()


@pytest.mark.slow  # three comparisons' worth of page runs
def test_changing_the_sidebar_model_does_not_rerun_a_comparison(monkeypatch, tiny_dirs):
    calls = counting(monkeypatch, analysis.compare.run, "compare")
    at = run_page(COMPARE, model=str(tiny_dirs["bert"]))
    at.text_input(key="compare_model").set_value("random").run()  # B: A's architecture with random weights
    at.checkbox(key="compare_recon").uncheck().run()  # CKA, probes and movers are enough here
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert len(calls) == 1 and len(at.dataframe) > 0

    choose_model(at, str(tiny_dirs["distilbert"]))  # a new A, with B, the rows and the options unchanged
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "distilbert" in at.sidebar.success[0].value  # the new model loaded ...
    assert len(calls) == 1  # ... and no comparison started
    assert not at.dataframe and any("then compare" in c.value for c in at.caption)

    at.button(key="compare_run").click().run()  # the click runs it
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert len(calls) == 2 and calls[-1][0].spec.name == str(tiny_dirs["distilbert"])


def test_changing_the_sidebar_model_or_precision_does_not_rerun_the_probe(monkeypatch, tiny_dirs):
    calls = counting(monkeypatch, analysis.probe.reconstruction, "probe")
    at = run_page(PROBE, model=str(tiny_dirs["bert"]))
    at.text_area(key="probe_text").set_value("the film is good .\nfun and very dull !").run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error and len(calls) == 1 and at.dataframe

    at.sidebar.selectbox(key=KEY_DTYPE).set_value("bfloat16").run()  # the same model in another precision
    assert not at.exception and not at.error and "bfloat16" in at.sidebar.success[0].value
    assert len(calls) == 1 and not at.dataframe and any("then run the probe" in c.value for c in at.caption)

    at.sidebar.selectbox(key=KEY_DTYPE).set_value("auto").run()  # back to the request that was run: its result
    assert len(calls) == 1 and at.dataframe  # is shown again, from the shared store

    choose_model(at, str(tiny_dirs["distilbert"]))
    assert not at.exception and not at.error and "distilbert" in at.sidebar.success[0].value
    assert len(calls) == 1 and not at.dataframe
