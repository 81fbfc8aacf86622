"""The jobs table shows every kind's job as it is (issue 43, item 3): a heads job has no fine-tuning cells, a live
stage from its kind (:func:`jobs.kinds.stage`), "resumed after N" once it has resumed, and a job asked to stop
reads "cancelling…" until its process has stopped."""

from __future__ import annotations

from jobs import kinds
from jobs.store import JobStore
from ui.jobs import job_table, shown

HEADS = {"kind": "heads", "action": "parse", "model": "demo", "treebank": "t.conllu"}


def test_a_running_heads_job_shows_its_stage_and_no_fine_tuning_cells(tmp_path):
    store = JobStore(tmp_path / "jobs")
    job_id = store.submit(HEADS, "cpu", "heads parse")
    store.claim("cpu", 1)
    store.update_progress(job_id, {"stage": "attention", "step": 120, "total_steps": 300, "fraction": 0.4})
    job = store.get(job_id)
    assert kinds.stage(job) == "attention: 120 of 300 sentences · 40% of the job"
    row = job_table([job]).iloc[0]
    assert row["status"] == "running" and row["stage"] == kinds.stage(job) and row["progress"] == 0.4
    assert_no_missing_cells(shown(job_table([job])))
    for column in ("epoch", "batch loss", "val accuracy", "accuracy", "majority class", "macro-F1"):
        assert row[column] in ("", None) or row[column] != row[column], (column, row[column])  # empty cells


def assert_no_missing_cells(frame):
    """Streamlit draws a missing cell of a number column as a grey 'None' whatever a Styler says (seen in
    Chromium): the frame the page shows holds no missing value at all."""
    missing = {column: int(frame[column].isna().sum()) for column in frame.columns if frame[column].isna().any()}
    assert not missing, missing
    assert not any(str(v) in ("None", "nan", "<NA>") for v in frame.to_numpy().ravel())


def test_the_tables_of_mixed_kinds_have_no_missing_cells(tmp_path):
    """A finished fine-tuning job beside a heads, a probe and a tokens job: the kinds without scores show empty
    cells, and 'one class' is said only for a job that has a score."""
    from ui.jobs import comparison_table

    store = JobStore(tmp_path / "jobs")
    ids = [store.submit(config, "cpu", config["kind"]) for config in (
        {"kind": "finetune", "model": "demo", "train": "demo"}, HEADS, {"kind": "probe", "model": "demo", "input": "x"},
        {"kind": "tokens", "model": "demo", "corpus": "c.txt"})]
    for _ in ids:
        store.claim("cpu", 4)
    store.finish(ids[0], "succeeded", metrics={"accuracy": 0.75, "macro_f1": 0.7, "baseline": {"accuracy": 0.5},
                                               "one_class": False, "evaluated_on": "validation"})
    for job_id in ids[1:]:
        store.finish(job_id, "succeeded", metrics={"kind": "x"})
    table = shown(job_table(store.list()))
    assert_no_missing_cells(table)
    by_id = table.set_index("id")
    assert by_id.loc[ids[0], "accuracy"] == "0.750" and by_id.loc[ids[0], "one class"] == "no"
    assert (by_id.loc[ids[1:], ["accuracy", "batch loss", "one class"]] == "").all().all()
    assert_no_missing_cells(shown(comparison_table(store.list())))


def test_a_finished_heads_job_that_resumed_says_so(tmp_path):
    store = JobStore(tmp_path / "jobs")
    job_id = store.submit({**HEADS, "action": "importance", "input": "t.txt"}, "cpu", "heads importance")
    store.claim("cpu", 1)
    store.finish(job_id, "succeeded", metrics={"kind": "heads", "action": "importance", "resumed_after": 4})
    row = job_table([store.get(job_id)]).iloc[0]
    assert "resumed after 4 passes" in row["stage"]


def test_a_job_asked_to_stop_reads_cancelling_until_it_has_stopped(tmp_path):
    store = JobStore(tmp_path / "jobs")
    job_id = store.submit(HEADS, "cpu", "heads parse")
    store.claim("cpu", 1)
    store.update_progress(job_id, {"stage": "attention", "step": 159, "total_steps": 300, "fraction": 0.53})
    store.request_cancel(job_id)
    row = job_table([store.get(job_id)]).iloc[0]
    assert row["status"] == "cancelling…" and row["stage"].startswith("cancelling")
    store.finish(job_id, "cancelled")
    assert job_table([store.get(job_id)]).iloc[0]["status"] == "cancelled"


def test_structure_and_tokens_stages_come_from_their_kinds(tmp_path):
    store = JobStore(tmp_path / "jobs")
    a = store.submit({"kind": "structure", "model": "demo"}, "cpu", "s")
    b = store.submit({"kind": "tokens", "model": "demo", "corpus": "c.txt"}, "cpu", "t")
    for _ in (a, b):
        store.claim("cpu", 2)
    store.update_progress(a, {"stage": "probes", "step": 3, "total_steps": 20, "fraction": 0.72})
    store.update_progress(b, {"stage": "index", "step": 1, "total_steps": 5, "fraction": 0.6})
    assert kinds.stage(store.get(a)) == "probes: 3 of 20 steps · 72% of the job"
    assert kinds.stage(store.get(b)) == "index: layer 2 of 5 · 60% of the job"


def test_a_running_task_job_shows_the_stage_and_progress_its_task_reports(tmp_path):
    """A task's job (issue 45: every task is a job kind) reports through its context: the jobs table shows the
    task's stage and a bar (it showed neither while the context wrote other keys than the table reads)."""
    from analysis.tasks.kind import JobContext
    from jobs.run import Control

    store = JobStore(tmp_path / "jobs")
    job_id = store.submit({"kind": "probe", "model": "demo", "input": "x.csv"}, "cpu", "probe")
    store.claim("cpu", 1)
    JobContext(tmp_path / "out", Control(store, store.get(job_id))).progress("probing layers", 2, 5)
    job = store.get(job_id)
    row = job_table([job]).iloc[0]
    assert kinds.stage(job) == row["stage"] == "probing layers: 2 of 5" and row["progress"] == 0.4
