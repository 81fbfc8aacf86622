"""Issue 53 item 3: every option of a job a page submits is on that page's form, or named by its schema as kept from
the browser (``browser_kept``, with the reason). Each form is driven as the browser drives it, its submit captured:
the options it sends, plus those kept, are every field of the kind's schema."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.support.pages import run_page

TREEBANK = "tests/data/ud_tiny_train.conllu"


def lens_form():
    from models.spec import ModelSpec
    from ui.jobs import lens_job_form

    lens_job_form(ModelSpec("demo"))


def structure_form():
    from analysis.structure.options import StructureOptions
    from models.spec import ModelSpec
    from ui.jobs import structure_job_form

    labelled = {"label_data": "demo", "text_column": "text", "label_column": "label", "pair_column": None,
                "label_pooling": "cls"}  # what the page's labelled set gives (pages/6: label_job_config)
    structure_job_form(ModelSpec("demo"), "tests/data/ud_tiny_train.conllu", "tests/data/ud_tiny_test.conllu",
                       StructureOptions(), lambda: labelled)


def tokens_form():
    from models.spec import ModelSpec
    from ui.jobs import tokens_job_form

    tokens_job_form(ModelSpec("demo"), "tests/data/ud_tiny_train.conllu")


def heads_form():
    import streamlit as st

    from models.spec import ModelSpec
    from ui.jobs import heads_job_form

    st.session_state.setdefault("heads_job_action", st.session_state.get("wanted_action", "stats"))
    heads_job_form(ModelSpec("demo"))


FORMS = {"lens": (lens_form, "lens", None), "structure": (structure_form, "structure", "structure_job"),
         "tokens": (tokens_form, "tokens_job", "tokens_job"), "heads stats": (heads_form, "heads_job", "heads_job"),
         "heads parse": (heads_form, "heads_job", "heads_job"),
         "heads importance": (heads_form, "heads_job", "heads_job")}


@pytest.fixture
def sent(monkeypatch):
    import jobs.submit

    captured = []
    monkeypatch.setattr(jobs.submit, "submit", lambda config, *a, **k: captured.append(config) or 1)
    return captured


def schema_of(config: dict):
    from analysis.tasks import TASKS
    from jobs import kinds

    if config.get("kind") == "heads":
        return TASKS[f"heads {config['action']}"].Options
    return kinds.of(config).OPTIONS


def check(config: dict) -> None:
    schema = schema_of(config)
    kept = schema.kept_from_browser()
    assert all(isinstance(why, str) and len(why) > 20 for why in kept.values()), kept
    assert not set(kept) - set(schema.model_fields), "kept names a field the schema does not have"
    missing = set(schema.model_fields) - set(config) - set(kept)
    assert not missing, f"{config.get('kind')}: options neither on the form nor kept from the browser: {missing}"
    assert not set(kept) & {k for k, v in config.items() if k != "kind"}, "a kept option is on the form"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_option_of_a_page_job_is_on_its_form_or_kept(home, sent, form, monkeypatch):
    import ui.inputs

    monkeypatch.setattr(ui.inputs, "server_file", lambda *a, **k: "tests/data/ud_tiny_train.conllu")
    script, prefix, placement = FORMS[form]
    at = AppTest.from_function(script, default_timeout=60)
    if form.startswith("heads"):
        at.session_state["wanted_action"] = form.split()[1]
    at.run()
    assert not at.exception, at.exception
    if placement:  # the Slurm fields are on the form once Slurm is chosen
        at.selectbox(key=f"{placement}_backend").set_value("slurm").run()
    at.button(key=f"{prefix}_submit").click().run()
    assert not at.exception, at.exception
    assert len(sent) == 1, [e.value for e in at.error]
    check(sent[0])


def test_the_fine_tuning_form_has_every_option_and_starts_a_series_job(home, tiny_dirs):
    """The Across checkpoints page sends the user here to tick "save each epoch's encoder" and to further
    pre-train: both are on the form, and what they set is what is submitted."""
    at = run_page("pages/5_Fine_Tune_Jobs.py", model=str(tiny_dirs["bert"]))
    at.checkbox(key="job_save_epoch_checkpoints").check().run()
    at.number_input(key="job_further_pretrain_steps").set_value(20).run()
    at.button(key="job_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (job,) = home.list()
    assert job.config["save_epoch_checkpoints"] is True and job.config["further_pretrain_steps"] == 20
    shown = {key.removeprefix("job_") for key in at.session_state if key.startswith("job_")}
    check({"kind": "finetune", **{k: v for k, v in job.config.items() if k in shown or k in (
        "model", "train", "text_column", "pair_column", "label_column", "preset")}})
