"""The slow layer: the real server driven by headless Chromium (Playwright), one scenario per user task.

Marked ``browser``; skipped with a reason when Playwright or Chromium is missing (``.ci/run`` installs both).
Screenshots go to the test's output folder (``pytest --basetemp`` decides where).
"""

import os
import time
from pathlib import Path

import pytest

from tests.browser_support import HOME, assert_no_error, browser, open_page, playwright, server  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]  # every test here takes more than ~5 s
PAGES = ["/", "/Model_anatomy", "/Reconstruction", "/Layer_Atlas", "/Layer_Weights", "/Layer_Duplication",
         "/Fine_Tune_Jobs", "/Linguistic_structure", "/Compare_checkpoints", "/Token_atlas", "/Attention_heads",
         "/Neurons"]


@pytest.fixture
def page(browser, server, tmp_path):
    p = browser.new_page(viewport={"width": 1400, "height": 1800})
    p.set_default_timeout(120_000)
    yield p
    p.screenshot(path=str(tmp_path / "screenshot.png"), full_page=True)
    p.close()


def test_every_page_opens_without_an_error(page, server):
    """Each page in turn in one tab (one tab: the test costs the pages, not a new tab and screenshot each)."""
    for path in PAGES:
        open_page(page, server, path)
        try:
            assert_no_error(page)
        except AssertionError as exc:
            raise AssertionError(f"{path}: {exc}") from None


def test_probe_the_prefilled_sentences(page, server):
    open_page(page, server, "/Reconstruction")
    page.get_by_role("button", name="Run the probe").click()
    page.wait_for_selector(".js-plotly-plot")
    page.wait_for_selector("[data-testid='stDataFrame']")
    assert_no_error(page)


def upload_texts(page, path: Path) -> None:
    page.get_by_text("Upload a file").click()
    page.locator("input[type='file']").set_input_files(str(path))
    page.get_by_text(f"{path.name}").first.wait_for()
    time.sleep(1.0)


def test_two_sessions_probe_at_once_and_get_identical_results(browser, server, tmp_path):
    texts = [f"review {i} : the film is {'charming and often affecting' if i % 3 else 'a dull , loud mess'} ."
             for i in range(300)]
    data = tmp_path / "reviews.txt"
    data.write_text("\n".join(texts) + "\n")
    sessions = [browser.new_context().new_page() for _ in range(2)]  # two contexts: two Streamlit sessions
    for p in sessions:
        p.set_default_timeout(180_000)
        p.set_viewport_size({"width": 1400, "height": 1800})
        open_page(p, server, "/Reconstruction")
        upload_texts(p, data)
    for p in sessions:  # back to back: both runs are in flight together (each takes seconds)
        p.get_by_role("button", name="Run the probe").click()
    tables = []
    for i, p in enumerate(sessions):
        p.get_by_role("button", name="Download layers.csv").wait_for()
        assert_no_error(p)
        with p.expect_download() as download:
            p.get_by_role("button", name="Download layers.csv").click()
        tables.append(Path(download.value.path()).read_text())
        p.screenshot(path=str(tmp_path / f"session{i}.png"), full_page=True)
    assert tables[0] == tables[1]

    from analysis.core.inputs import TextInputs
    from analysis.probe.reconstruction import probe
    from models.loading import ModelSpec, load_model

    expected = probe(load_model(ModelSpec("demo", device="cpu")), TextInputs(tuple(texts))).layers
    assert tables[0] == expected.to_csv(index=False)
    for p in sessions:
        p.context.close()


def test_a_long_probe_can_be_stopped(page, server, tmp_path):
    data = tmp_path / "long.txt"
    data.write_text("\n".join(f"long run {i} : the acting , costumes , music and sound are all astounding ."
                              for i in range(2000)) + "\n")
    open_page(page, server, "/Reconstruction")
    upload_texts(page, data)
    page.get_by_role("button", name="Run the probe").click()
    page.get_by_text("texts").and_(page.locator("[data-testid='stProgress'] *")).first.wait_for()
    page.get_by_role("button", name="Stop").click()
    page.get_by_text("The probe stopped; nothing was kept from it.").wait_for(timeout=60_000)
    page.get_by_role("button", name="Stop").wait_for(state="detached", timeout=30_000)  # the rerun has finished
    assert page.get_by_role("button", name="Download layers.csv").count() == 0
    assert_no_error(page)


def error_text(page) -> str:
    page.locator("[data-testid='stAlertContentError']").first.wait_for()
    return page.locator("[data-testid='stAlertContentError']").first.inner_text()


def test_bad_uploads_get_messages(page, server, tmp_path):
    open_page(page, server, "/Reconstruction")
    page.get_by_text("Upload a file").click()
    upload = page.locator("input[type='file']")
    upload.set_input_files({"name": "latin1.txt", "mimeType": "text/plain", "buffer": "café noir\n".encode("latin-1")})
    assert "not UTF-8" in error_text(page)
    upload.set_input_files({"name": "empty.txt", "mimeType": "text/plain", "buffer": b""})
    page.get_by_text("is empty").wait_for()
    big = tmp_path / "big.txt"
    big.write_bytes(b"a long line of text\n" * (51 * 2**20 // 20 + 1))  # over server.maxUploadSize (50 MB)
    upload.set_input_files(str(big))
    page.get_by_text("50.0MB or smaller").or_(page.get_by_text("50MB or smaller")).first.wait_for()
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=str(tmp_path / "too_big.png"), full_page=True)


def test_an_uploaded_table_probes_its_text_column_not_its_ids(page, server, tmp_path):
    """id,sentence,source: the probe reads 'sentence' (by name), says so and shows the first rows."""
    open_page(page, server, "/Reconstruction")
    page.get_by_text("Upload a file").click()
    rows = "id,sentence,source\n" + "".join(f"{i},the film number {i} is good .,imdb\n" for i in range(1, 5))
    page.locator("input[type='file']").set_input_files({"name": "ids.csv", "mimeType": "text/csv",
                                                         "buffer": rows.encode()})
    page.get_by_text("Using column 'sentence': 4 rows").wait_for()
    page.locator("[data-testid='stDataFrame']").first.wait_for()  # the preview (drawn on a canvas)
    assert_no_error(page)


def test_an_upload_named_like_a_path_stays_in_the_uploads_folder(page, server, tmp_path):
    open_page(page, server, "/Fine_Tune_Jobs")
    page.get_by_text("Upload a file").click()
    rows = "text,label\n" + "".join(f"=cmd|' /C calc'!A{i} good film,{i % 2}\n" for i in range(20))
    page.locator("input[type='file']").set_input_files(
        {"name": "../../escape.csv", "mimeType": "text/csv", "buffer": rows.encode()})
    page.get_by_text("Label column").wait_for()
    assert_no_error(page)
    home = HOME[-1]
    assert not (home.parent / "escape.csv").exists() and not (home.parent.parent / "escape.csv").exists()
    saved = [p for p in (home / "uploads").iterdir() if not p.name.startswith(".")]  # .lock: the folder's lock
    assert any(p.read_text() == rows for p in saved) and all(p.suffix == ".csv" and "escape" not in p.name
                                                             for p in saved)


def test_atlas_of_an_uploaded_tsv(page, server, tmp_path):
    rows = ["text\tlabel"] + [f"{'good fun film' if i % 2 else 'dull bad movie'} number {i}\t{i % 2}"
                              for i in range(60)]
    data = tmp_path / "rows.tsv"
    data.write_text("\n".join(rows) + "\n")
    open_page(page, server, "/Layer_Atlas")
    page.get_by_text("Upload a file").click()
    page.locator("input[type='file']").set_input_files(str(data))
    page.get_by_role("button", name="Draw the atlas").click()
    grid = page.locator(".js-plotly-plot").first
    grid.wait_for()
    # the demo model has 4 layers: the default "-6:" is all 5 hidden states (6 on a model with 5+ layers)
    assert grid.locator("g.cartesianlayer > g.subplot").count() == 5
    assert_no_error(page)


def test_duplication_preview(page, server):
    open_page(page, server, "/Layer_Duplication")
    page.get_by_role("button", name="Preview").click()
    page.wait_for_selector(".js-plotly-plot")
    assert page.locator(".js-plotly-plot").count() == 2
    assert_no_error(page)


def submit_demo_job(page, server, epochs: int) -> None:
    """The jobs page's default job (demo model, demo set) with the attention head and ``epochs`` epochs."""
    open_page(page, server, "/Fine_Tune_Jobs")
    # as a person would: the whole form on screen before the first change (a change while the page's first run
    # is still under way interrupts it; on a loaded machine that left the number fields at their minimum)
    page.get_by_role("button", name="Submit the job").wait_for(timeout=120_000)
    time.sleep(1.0)
    page.get_by_label("Head", exact=True).click()  # the form starts at the schema's default head, cls
    page.keyboard.type("attention")  # the option list is virtualised: filter it
    page.get_by_role("option", name="attention", exact=True).click()
    time.sleep(1)
    page.get_by_label("Epochs", exact=True).fill(str(epochs))
    page.get_by_label("Epochs", exact=True).press("Enter")
    time.sleep(1)
    page.get_by_role("button", name="Submit the job").click()


def test_fine_tune_then_layer_weights(page, server):
    submit_demo_job(page, server, epochs=1)
    page.get_by_text("Compare finished runs").wait_for(timeout=300_000)  # shown once a run has succeeded
    assert_no_error(page)
    open_page(page, server, "/Layer_Weights")
    page.wait_for_selector(".js-plotly-plot")
    assert page.get_by_text("Layer weights per example").count() >= 1
    assert_no_error(page)


SHOTS = {"/": ("screenshot_home", None), "/Model_anatomy": ("screenshot_anatomy", None),
         "/Reconstruction": ("screenshot_reconstruction", "Run the probe"),
         "/Layer_Atlas": ("screenshot_atlas", "Draw the atlas (PCA)"),
         "/Layer_Weights": ("screenshot_layer_weights", None),
         "/Layer_Duplication": ("screenshot_duplication", "Preview"), "/Fine_Tune_Jobs": ("screenshot_jobs", None)}


def test_every_page_after_a_fine_tune(page, server, tmp_path):
    """Every page with results on it, once a job has finished: no error box, one screenshot each (to
    LAYERLENS_SCREENSHOTS when set, e.g. docs/ to refresh the README's; else the test's folder)."""
    from jobs.store import JobStore

    if not any(j.status == "succeeded" for j in JobStore(HOME[-1] / "jobs").list()):
        submit_demo_job(page, server, epochs=1)
        page.get_by_text("Compare finished runs").wait_for(timeout=300_000)
    out = Path(os.environ.get("LAYERLENS_SCREENSHOTS") or tmp_path)
    for path, (name, button) in SHOTS.items():
        open_page(page, server, path)
        if button:
            page.get_by_role("button", name=button).click()
            page.wait_for_selector(".js-plotly-plot", timeout=180_000)
        if path in ("/Layer_Weights", "/Fine_Tune_Jobs"):
            page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        time.sleep(2)
        assert_no_error(page)
        page.screenshot(path=str(out / f"{name}.png"), full_page=True)


def test_cancel_a_job(page, server):
    submit_demo_job(page, server, epochs=100)
    page.get_by_role("button", name="Cancel").wait_for(timeout=120_000)
    page.get_by_role("button", name="Cancel").click()
    page.get_by_role("button", name="Cancel").wait_for(state="detached", timeout=60_000)  # the job has ended
    from jobs.store import JobStore

    assert JobStore(HOME[-1] / "jobs").list()[0].status == "cancelled"
    assert_no_error(page)


def test_a_structure_job_from_the_page_opens_its_results(page, server):
    """A fresh clone's first look: the page on the bundled sample, submitted as a job, its results opened."""
    open_page(page, server, "/Linguistic_structure")
    # the sidebar's model alert comes before the page body: on a loaded machine the body may still be rendering
    page.get_by_text("A small sample").wait_for(timeout=60_000)
    assert page.get_by_text("A small sample").count() == 1
    layers = page.get_by_role("textbox", name="Layers", exact=True)
    layers.fill("0,4")
    layers.press("Enter")
    time.sleep(2.0)  # the rerun the new value starts
    page.get_by_text("Run it as a background job").click()
    time.sleep(1.0)
    page.get_by_role("button", name="Submit as a job", exact=True).click()
    page.get_by_text("queued").first.wait_for(timeout=60_000)
    assert_no_error(page)
    page.get_by_role("radiogroup").get_by_text("Open a finished job", exact=True).click()
    page.wait_for_selector(".js-plotly-plot", timeout=300_000)  # offered once it has finished (the view refreshes)
    page.get_by_text("Where each task lives").wait_for()
    assert page.get_by_text("the bundled small sample").count() == 1
    assert_no_error(page)


def test_attention_heads_of_the_demo_beside_its_random_twin(page, server):
    """The Attention heads page as a researcher uses it: the prefilled texts read for the demo model and its
    random-weights twin (heat maps, the difference), the head view with the three-panel comparison, and a sentence
    over the model's limit refused in one message."""
    open_page(page, server, "/Attention_heads")
    compare = page.get_by_role("textbox", name="Compare with (optional)")
    compare.fill("random")
    compare.press("Enter")
    time.sleep(1.0)
    page.get_by_role("button", name="Read the heads").click()
    page.get_by_text("What each head attends to", exact=True).wait_for()
    page.get_by_text("Heads clustered by behaviour", exact=True).wait_for()
    assert_no_error(page)
    page.get_by_text("difference", exact=True).click()
    page.get_by_text("with random weights − demo").first.wait_for()
    page.get_by_role("tab", name="One sentence (head view)").click()
    page.get_by_text("Beside demo with random weights").first.wait_for()
    assert_no_error(page)
    sentence = page.get_by_role("textbox", name="Sentence", exact=True)
    sentence.fill(" ".join(["word"] * 600))
    sentence.press("Enter")
    error = page.locator("[data-testid='stAlertContentError']").first
    error.wait_for()
    assert "limit" in error.inner_text() and "\n" not in error.inner_text().strip()
    assert page.locator("[data-testid='stException']").count() == 0
