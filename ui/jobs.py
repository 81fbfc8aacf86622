"""Presentation helpers for the job pages: the table of jobs (the charts are in analysis.core.figures)."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from analysis.core.csvout import safe


def _ago(t: float | None) -> str:
    if not t:
        return ""
    s = time.time() - t
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.0f} h ago"


def score_line(metrics: dict | None) -> str:
    """``accuracy 0.713 (majority class 0.402), macro-F1 0.690``, flagged when every prediction is one class."""
    if not metrics or "accuracy" not in metrics:
        return "no score"
    base = metrics.get("baseline") or {}
    line = (f"accuracy {metrics['accuracy']:.3f} (majority class {base.get('accuracy', float('nan')):.3f}), "
            f"macro-F1 {metrics.get('macro_f1', float('nan')):.3f}")
    if metrics.get("scored_on_selection_rows"):
        line += (" · scored on the validation rows that also chose the epoch (early stopping): optimistic; give a "
                 "test set for an unbiased score")
    return line + (" · ONE CLASS PREDICTED" if metrics.get("one_class") else "")


def job_table(jobs) -> pd.DataFrame:
    """One row per job: id, name, status, where it runs, its sweep group, progress (0..1), epoch, loss,
    validation accuracy, the final accuracy with its majority-class baseline and macro-F1, whether it predicted
    one class only, created."""
    from jobs import kinds

    rows = []
    for j in jobs:
        p = j.progress or {}
        total = p.get("total_steps") or 0
        last = (p.get("history") or [{}])[-1]
        done = 1.0 if j.status == "succeeded" else p["fraction"] if "fraction" in p else (
            p.get("step", 0) / total if total else 0.0)  # a structure job's fraction covers its stages
        m = j.metrics or {}
        rows.append({"id": j.id, "name": j.name, "status": j.shown_status, "runs on": j.where, "group": j.group or "",
                     "progress": done, "stage": kinds.stage(j),
                     "epoch": f"{p.get('epoch', '')}/{p.get('epochs', '')}" if "epoch" in p else "",
                     "batch loss": p.get("loss"), "val accuracy": last.get("val_accuracy"),
                     "accuracy": m.get("accuracy"), "majority class": (m.get("baseline") or {}).get("accuracy"),
                     "macro-F1": m.get("macro_f1"), "one class": bool(m.get("one_class")), "created": _ago(j.created)})
    return pd.DataFrame(rows)


SCORE_COLUMNS = ("batch loss", "val accuracy", "accuracy", "majority class", "macro-F1", "macro_f1", "lr",
                 "layer decay")


def _number(v) -> str:
    return "" if v is None or v != v else f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.3f}"


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` as the page shows it: scores to 3 significant places as text, and an empty cell where a job has
    no such value (Streamlit draws a missing number as a grey "None" whatever a Styler says, so no cell is left
    missing); "one class" reads yes or no for a job with a score and is empty otherwise. Text cells are formula-
    neutralised, as in our CSV files, so the table toolbar's download is safe too."""
    table = safe(table).copy()
    scored = table["accuracy"].notna() if "accuracy" in table.columns else pd.Series(False, index=table.index)
    for column in table.columns:
        if column in SCORE_COLUMNS:
            table[column] = [_number(v) for v in table[column]]
        elif column == "one class":
            table[column] = [("yes" if v else "no") if s else "" for v, s in zip(table[column], scored, strict=True)]
        elif table[column].dtype == object or table[column].isna().any():  # some kinds leave it empty (epochs)
            table[column] = ["" if v is None or v != v else f"{v:g}" if isinstance(v, float) else v
                             for v in table[column]]
    return table


def comparison_table(jobs) -> pd.DataFrame:
    """Finished runs side by side: what differs between them (model, data, head, lr, epochs, layer decay) and
    their scores with the baseline, on which rows."""
    rows = []
    for j in jobs:
        m, c = j.metrics or {}, j.config
        rows.append({"job": j.id, "group": j.group or "", "model": c.get("model", "demo"), "data": c.get("train"),
                     "head": c.get("head"),
                     "lr": c.get("lr"), "epochs": c.get("epochs"), "layer decay": c.get("layer_decay"),
                     "evaluated on": m.get("evaluated_on"), "accuracy": m.get("accuracy"),
                     "accuracy low": (m.get("accuracy_interval") or [None, None])[0],
                     "accuracy high": (m.get("accuracy_interval") or [None, None])[1],
                     "majority class": (m.get("baseline") or {}).get("accuracy"), "macro_f1": m.get("macro_f1"),
                     "one class": bool(m.get("one_class"))})
    return pd.DataFrame(rows)


def queue(config: dict, then: str, extra=None) -> int | None:
    """THE submit of a page's job form: ``config`` (plus ``extra()``'s fields, read at Submit) checked as from the
    browser and queued, a worker started unless ``LAYERLENS_JOBS_NO_WORKER``; "Job N queued: ``then``" on the page,
    or its one-line refusal. Returns the job id, or None."""
    import os

    import streamlit as st

    from analysis.core.inputs import InputError
    from jobs.submit import SubmitError, submit

    try:
        job_id = submit({**config, **(extra() if extra else {})},
                        start_worker=not os.environ.get("LAYERLENS_JOBS_NO_WORKER"), browser=True)
    except (SubmitError, InputError) as exc:
        st.error(f"Not queued: {exc}")
        return None
    st.success(f"Job {job_id} queued: {then}")
    return job_id


def model_block(spec, schema=None) -> dict:
    """A job's model fields from the sidebar's model: name, revision, precision and the MLM head it borrows where
    ``schema`` reads one (its device is the job machine's own)."""
    block = {"model": spec.name, "revision": spec.revision, "dtype": spec.dtype}
    return block | ({"head_from": spec.head_from} if schema is not None and "head_from" in schema.model_fields else {})


def more_options(schema, shown: list[str], prefix: str, given: tuple[str, ...] = ()) -> dict:
    """The widgets of every option of ``schema`` a job form does not show already (``shown``, and ``given``: set
    by the form's own widgets or the sidebar's model), less those it keeps from the browser, in one expander: what
    a job can be asked for is all on its form (issue 53 item 3)."""
    import streamlit as st

    from analysis.core.options import PlacementOptions
    from ui.options import option_input

    skip = {*shown, *given, *schema.kept_from_browser(), *PlacementOptions.model_fields, "model", "revision",
            "dtype", "head_from", "kind"}
    names = [name for name in schema.model_fields if name not in skip]
    if not names:
        return {}
    with st.expander("More options"):
        cols = st.columns(4)
        return {name: option_input(cols[i % 4], name, prefix, options_schema=schema) for i, name in enumerate(names)}


LENS_FORM = ["steps", "batch_size", "max_length", "optimizer", "lr_scale", "positions", "eval_texts", "half"]


def lens_job_form(spec) -> None:
    """Queue a tuned-lens training job for ``model`` (the Reconstruction page's expander): the texts, the main
    options from :class:`analysis.probe.options.LensOptions`, Submit. It then runs like every job (jobs page)."""

    import streamlit as st

    from analysis.probe.options import LensOptions
    from ui.options import option_input

    source = st.radio("Texts", ["Demo set's texts", "A file on the server", "Hugging Face dataset"], horizontal=True,
                      key="lens_source")
    corpus, column = "demo", "text"
    if source != "Demo set's texts":
        from analysis.core.dataroots import browser_source
        from analysis.core.inputs import InputError
        from ui.inputs import server_file

        c1, c2 = st.columns([3, 1])
        try:
            corpus = (browser_source(c1.text_input("Dataset", "hf:wikitext/wikitext-2-raw-v1:train", key="lens_corpus",
                                                   help="hf:NAME[/CONFIG]:SPLIT, a dataset name from the hub"))
                      if source == "Hugging Face dataset" else server_file("lens_server_file", c1))
        except InputError as exc:
            st.error(str(exc))
            corpus = None
        column = c2.text_input("Text column", "text", key="lens_column")
    cols = st.columns(len(LENS_FORM))
    values = {name: option_input(col, name, "lens", options_schema=LensOptions)
              for col, name in zip(cols, LENS_FORM, strict=True)}
    values |= more_options(LensOptions, LENS_FORM, "lens", ("corpus", "text_column"))
    if st.button("Train the lens as a job", key="lens_submit", disabled=not corpus):
        queue({"kind": "lens", **model_block(spec, LensOptions), "corpus": corpus, "text_column": column, **values},
              "follow it (progress, Cancel, log) on the Fine-tuning jobs page. When it has finished, the lens is "
              "offered under 'Tuned lens' above.")


SLURM_FIELDS = ("slurm_partition", "slurm_time", "slurm_gpus")


def placement_inputs(backend_column, slurm_columns, key: str) -> dict:
    """Where a job from a page runs: the backend, and for Slurm its partition, time and GPUs (in
    ``slurm_columns``: three containers, or a callable that makes them only when Slurm is chosen), as the
    fine-tuning schema defines them. Returns the job options they give."""
    from analysis.training.options import FinetuneOptions
    from ui.options import option_input

    backend = option_input(backend_column, "backend", key, options_schema=FinetuneOptions)
    if backend != "slurm":  # the Slurm fields appear once Slurm is chosen
        return {"backend": backend}
    columns = slurm_columns() if callable(slurm_columns) else slurm_columns
    return {"backend": backend, **{name: option_input(col, name, key, options_schema=FinetuneOptions)
                                   for col, name in zip(columns, SLURM_FIELDS, strict=True)}}


def structure_job_form(spec, train, test, options, label_data=None) -> None:
    """Queue the Linguistic structure page's analysis (the chosen treebanks and ``options``, the sidebar's
    model and precision) as a ``structure`` job: where it runs (this machine's worker or Slurm), Submit. Its
    device is the job machine's own (a GPU when it has one). ``label_data``: called at Submit, the job's fields
    for the page's labelled set (``label_data``, its columns and pooling)."""

    import streamlit as st

    from analysis.structure.options import StructureJobOptions

    c1, c2, c3, c4 = st.columns([1.2, 1, 1, 1])
    placement = placement_inputs(c1, (c2, c3, c4), "structure_job")
    st.caption(f"The job runs **{spec.name}** (the sidebar's model) with the treebanks and options above, in a "
               "process of its own: on the job machine's GPU when it has one (local), or as a Slurm job. It goes on "
               "when this page is closed; its word vectors are cached for later runs of the same model and files.")
    if st.button("Submit as a job", key="structure_submit"):
        queue({"kind": "structure", **model_block(spec, StructureJobOptions), "train": str(train), "test": str(test),
               **options.to_dict(), **placement},
              "its progress shows under **Open a finished job** at the top of this page and on the Fine-tuning jobs "
              "page (Cancel, log). When it has finished, open its results there.", label_data)


def jobs_of(kind: str, store=None, stop: bool = True, limit: int = 200) -> list:
    """Every job of ``kind`` (the registry's reading of its options: a job naming none is a fine-tuning job), newest
    first. A damaged or unreadable jobs.db is one line naming it; then the page stops, or with ``stop=False`` this
    part of it has no jobs. ``limit``: the newest jobs of every kind read."""
    import streamlit as st

    from jobs import kinds
    from jobs.store import JobStore, StoreError

    try:
        return [j for j in (store or JobStore()).list(limit) if kinds.of(j.config).NAME == kind]
    except StoreError as exc:
        st.error(str(exc))
        if stop:
            st.stop()
        return []


def finished_jobs(kind: str) -> list:
    """The succeeded jobs of ``kind``, newest first (none when the job store cannot be read: said)."""
    return [j for j in jobs_of(kind, stop=False) if j.status == "succeeded"]


def finished_classifier_jobs() -> list:
    """The succeeded fine-tuning jobs that saved their classifier (``checkpoint/head.json``), newest first."""
    return [j for j in jobs_of("finetune", stop=False)
            if j.status == "succeeded" and (j.artifacts / "checkpoint" / "head.json").is_file()]


def _structure_jobs(store=None) -> list:
    return jobs_of("structure", store)


def finished_structure_jobs() -> list:
    """The succeeded ``structure`` jobs, newest first."""
    return [j for j in _structure_jobs() if j.status == "succeeded"]


def unfinished_structure_jobs() -> list:
    """The failed and cancelled ``structure`` jobs, newest first, each with why (its error's last line)."""
    return [j for j in _structure_jobs() if j.status in ("failed", "cancelled")]


def jobs_running(kind: str, store=None) -> bool:
    """The queued and running jobs of ``kind`` with their stage (``cancelling…`` after a Cancel), refreshed every
    3 s; the page reruns when one of them finishes (so that it is offered). Whether there are any."""
    import streamlit as st

    from jobs import kinds

    state = f"{kind}_active"

    @st.fragment(run_every=3)
    def live() -> None:
        active = [j for j in jobs_of(kind, store) if j.status in ("queued", "running")]
        ids = tuple(j.id for j in active)
        if st.session_state.setdefault(state, ids) != ids:  # one finished (or started): redraw all
            st.session_state[state] = ids
            st.rerun(scope="app")
        for j in active:
            st.caption(f"#{j.id} {j.name}: **{(kinds.stage(j) or 'starting') if j.status == 'running' else 'queued'}"
                       "** (Cancel and log on the Fine-tuning jobs page)")

    live()
    return bool(st.session_state.get(state))


def tokens_job_form(spec, corpus, text_column: str = "text", label_column: str | None = None,
                    limit: int | None = None, layers: str = "all", key: str = "tokens_job") -> int | None:
    """Queue a ``tokens`` job (the Token atlas page's expander): extract ``corpus``'s token vectors at ``layers``
    with the sidebar's model (``spec``: name, revision, precision) and build each layer's neighbour index, in a
    process of its own (this machine's worker or Slurm); the index kind, the batch size and where it runs are
    chosen here. A job of the same model, corpus and layers finds the shards an earlier one wrote (a cancelled
    job is resumed by submitting it again). Returns the job id when one was queued."""

    import streamlit as st

    from analysis.tokens.options import TokensJobOptions
    from ui.options import option_input

    c1, c2, c3 = st.columns(3)
    index = option_input(c1, "index", key, options_schema=TokensJobOptions)
    batch_size = option_input(c2, "batch_size", key, options_schema=TokensJobOptions)
    placement = placement_inputs(c3, lambda: st.columns(3), key)
    more = more_options(TokensJobOptions, ["index", "batch_size"], key,
                        ("corpus", "text_column", "label_column", "limit", "layers"))
    st.caption(f"The job extracts every token's vector of the corpus at hidden states **{layers}** with "
               f"**{spec.name}** (the sidebar's model) into the cache, shard by shard, then builds each layer's "
               "neighbour index (unless the index is none). It runs in a process of its own and goes on when this "
               "page is closed; Cancel and its log are on the Fine-tuning jobs page. A cancelled job is resumed "
               "by submitting the same options again: only the missing shards are computed.")
    if st.button("Extract as a job", key=f"{key}_submit", disabled=not corpus):
        return queue({"kind": "tokens", **model_block(spec, TokensJobOptions), "corpus": str(corpus),
                      "text_column": text_column, "label_column": label_column, "limit": limit, "layers": layers,
                      "index": index, "batch_size": batch_size, **more, **placement},
                     "its progress shows on the Fine-tuning jobs page (Cancel, log). When it has finished, its "
                     "extraction is offered among the finished token jobs here.")
    return None


def _extraction(job) -> str | None:
    """The vector set a tokens job extracted (its run.json names it) or indexed (its input), as the Token atlas
    lists it; None when it is gone."""
    from pathlib import Path

    from analysis.core.inputs import InputError
    from analysis.tokens.vectors import TokenVectors

    for folder in (job.artifacts, job.config.get("input")):
        try:
            if folder and Path(folder).is_dir():
                return str(TokenVectors.open(folder).directory)
        except (InputError, OSError, ValueError, KeyError):
            continue
    return None


# How each page that opens finished jobs is told which (its widgets' values; the job's kind names the page,
# jobs.kinds.opened_on): the jobs page's "open it" button fills them in.
OPEN_ON_PAGE = {
    "pages/8_Token_atlas.py": lambda job: {"tokens_source": "Open a cached extraction",
                                           **({"tokens_cached": d} if (d := _extraction(job)) else {})},
    "pages/6_Linguistic_structure.py": lambda job: {"structure_mode": "Open a finished job", "structure_job": job.id},
    "pages/9_Attention_heads.py": lambda job: {"heads_corpus": "A finished job", "heads_open": job.id},
}


def open_values(job, page: str) -> dict:
    """The widget values that make ``page`` show the finished ``job`` (none known: the page as it opens)."""
    return OPEN_ON_PAGE[page](job) if page in OPEN_ON_PAGE else {}


def tokens_jobs(store=None) -> list:
    """Every ``tokens`` job, newest first (a damaged jobs.db: one line on the page, which stops)."""
    return jobs_of("tokens", store)


def finished_tokens_jobs(store=None) -> list:
    """The succeeded ``tokens`` jobs, newest first. ``TokenVectors.open(job.artifacts)`` opens a job's
    extraction (its ``run.json`` names the cache directory; an :class:`analysis.core.inputs.InputError` when the cache
    was cleared since); ``job.metrics``: ``vectors``, ``rows``, ``layers``, ``hidden``, ``shards``, ``disk_bytes``,
    ``index`` (``index.csv``'s rows)."""
    return [j for j in tokens_jobs(store) if j.status == "succeeded"]


def tokens_summary(job) -> str:
    """``61,819 tokens x 5 hidden states x 256 in 8 shards (150.9 MiB; 6 computed by this job), index flat on 5
    layers``: what a succeeded tokens job left (its metrics)."""
    m = job.metrics or {}
    if "rows" not in m:
        return ""
    index = m.get("index") or []
    kinds = sorted({r.get("kind") for r in index})
    return (f"{m['rows']:,} tokens x {len(m.get('layers', []))} hidden states x {m.get('hidden')} in "
            f"{m.get('shards')} shards ({m.get('disk_bytes', 0) / 2**20:.1f} MiB; {m.get('computed_shards')} computed "
            f"by this job), " + (f"index {', '.join(kinds)} on {len(index)} layers" if index else "no index"))


# a job reads the whole file (limit: kept from the browser)
HEADS_FORM = {"stats": ["text_column", "batch_size", "clusters", "cluster_tokens", "seed"],
              "parse": ["batch_size", "reading", "tree", "min_count", "relations"],
              "importance": ["text_column", "batch_size", "steps", "random_orders", "mask_prob", "drop", "seed"]}


def heads_job_form(spec, key: str = "heads_job") -> int | None:
    """Queue a ``heads`` job (the Attention heads page's expander): its action (statistics, heads as parsers or
    head importance), its input (a file on the server: texts or a CoNLL-U treebank; for importance, texts), its
    options from :class:`analysis.heads.options.HeadsJobOptions` (bounded for the browser), where it runs; the
    sidebar's model (``spec``: name, revision, precision). Returns the job id when one was queued."""

    import streamlit as st

    from analysis.core.dataroots import TEXT_SUFFIXES, TREEBANK_SUFFIXES
    from analysis.heads.options import HeadsJobOptions
    from analysis.tasks.heads import KIND
    from ui.inputs import server_file
    from ui.options import option_input

    action = st.radio("Job", list(HEADS_FORM), horizontal=True, key=f"{key}_action", format_func=KIND.LABELS.get)
    suffixes = TREEBANK_SUFFIXES if action == "parse" else TEXT_SUFFIXES + (
        TREEBANK_SUFFIXES if action == "stats" else ())
    path = server_file(f"{key}_file_{action}", suffixes=suffixes)
    names = HEADS_FORM[action]
    values = {name: option_input(col, name, f"{key}_{action}", options_schema=HeadsJobOptions)
              for col, name in zip(st.columns(len(names)), names, strict=True)}
    c1, c2, c3, c4 = st.columns(4)
    placement = placement_inputs(c1, (c2, c3, c4), key)
    if action == "importance" and path:  # its cost, before it is queued (issue 53 item 12)
        st.caption(importance_cost(spec, path, values))
    st.caption(f"The job runs {KIND.LABELS[action]} of **{spec.name}** (the sidebar's model) over the whole file in a "
               "process of its own, and goes on when this page is closed. Its stage shows below and on the "
               "Fine-tuning jobs page (Cancel, log); a cancelled job goes on from where it stopped when the same "
               "options are submitted again. When it has finished, open it with **A finished job** below.")
    if st.button("Submit as a job", key=f"{key}_submit", disabled=not path):
        source = "treebank" if action == "parse" else "input"
        return queue({"kind": "heads", "action": action, **model_block(spec, HeadsJobOptions), source: path, **values,
                      **placement},
                     "its stage shows below; open it here when it has finished.")
    return None


def importance_cost(spec, path: str, values: dict) -> str:
    """What a head-importance job over the whole of ``path`` will cost, in passes over its texts (the
    engine's own count, :func:`analysis.heads.importance.pruning_passes`), from the model's config and the file's
    rows (read once per file and change)."""
    from analysis.heads.importance import pruning_passes
    from models.loading import config_and_family

    try:
        config = config_and_family(spec)[0]
        texts = _rows_in(str(path), Path(path).stat().st_mtime_ns, values.get("text_column") or "text")
    except Exception as exc:  # noqa: BLE001 - an estimate that cannot be made is said, never a traceback
        return f"Cost: not estimated ({type(exc).__name__}: {str(exc)[:120]})."
    low, high = pruning_passes(config.num_hidden_layers, config.num_attention_heads, values.get("steps", 10),
                               values.get("random_orders", 3))
    return (f"Cost: {low:,}–{high:,} passes of the model over all {texts:,} texts of the file "
            f"({low * texts:,}–{high * texts:,} text-passes; the page's own run shows the time a pass takes on "
            "this machine).")


def _rows_in(path: str, mtime: int, column: str) -> int:
    import streamlit as st

    @st.cache_data(max_entries=16, show_spinner=False)
    def count(path: str, mtime: int, column: str) -> int:
        from analysis.core.inputs import read_file

        return len(read_file(path, column))
    return count(path, mtime, column)


def heads_jobs(store=None) -> list:
    """Every ``heads`` job, newest first (a damaged jobs.db: one line on the page, which stops)."""
    return jobs_of("heads", store)


def heads_job_result(job):
    """A finished heads job's result read back from its files: an
    :class:`analysis.heads.run.HeadsResult` (stats, parse) or an
    :class:`analysis.heads.importance.ImportanceResult`; an :class:`analysis.core.inputs.InputError` when its
    files are gone."""
    import json

    from analysis.core.inputs import InputError
    from analysis.heads.importance import ImportanceResult
    from analysis.heads.run import HeadsResult

    folder = job.artifacts
    try:
        info = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        raise InputError(f"job #{job.id}'s files are gone from {folder} (deleted, or never written)") from None
    needed = {"layers", "heads", *(("base_accuracy", "targets") if isinstance(info, dict)
                                   and info.get("action") == "importance" else ())}
    if not isinstance(info, dict) or not needed <= set(info):
        raise InputError(f"job #{job.id}'s run.json in {folder} is not a finished heads run's (it lacks "
                         f"{', '.join(sorted(needed - set(info if isinstance(info, dict) else ())))}): its files are "
                         "incomplete; submit the job again")

    def table(name: str):
        return pd.read_csv(folder / name, keep_default_na=False, na_values=[""]) if (folder / name).is_file() \
            else None
    if info.get("action") == "importance":
        layers = (table("importance.csv").groupby("layer")["layer_prunable_share"].first().reset_index()
                  .rename(columns={"layer_prunable_share": "prunable_share"}))
        return ImportanceResult(table("importance.csv"), table("pruning.csv"), layers, info)
    return HeadsResult(heads=table("heads.csv"), clusters=table("clusters.csv"), relations=table("relations.csv"),
                       accuracies=table("head_accuracies.csv"), uuas=table("uuas.csv"), info=info)
