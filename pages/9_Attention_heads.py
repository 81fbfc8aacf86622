"""Attention heads (issue 36): what every head attends to over a corpus, the heads clustered by behaviour, heads as
parsers on a UD treebank, head importance with its pruning curve, and one sentence's attention (the head view),
for the sidebar's model and a second one."""

import dataclasses

import pandas as pd
import streamlit as st

from analysis.core.csvout import to_csv
from analysis.core.dataroots import TREEBANK_SUFFIXES, server_file_picker_label, server_files
from analysis.core.figures import plain
from analysis.core.inputs import InputError, TextInputs
from analysis.core.options import max_server_texts
from analysis.core.task import Tables
from analysis.core.treebank import read_conllu
from analysis.heads import plots
from analysis.heads.importance import ImportanceResult, mlm_importance, pruning_passes
from analysis.heads.model import load_eager
from analysis.heads.options import MIN_COUNT, READINGS, SYMMETRIES
from analysis.heads.run import analyse
from analysis.heads.stats import STATISTICS
from analysis.heads.view import compare_views, head_view
from jobs import kinds
from models.loading import ModelLoadError, ModelSpec
from models.spec import short_name
from ui.inputs import EXAMPLES, text_inputs
from ui.jobs import heads_job_form, heads_job_result, heads_jobs, jobs_running
from ui.navigation import compare_link
from ui.report import report_button, result_report_button
from ui.results import (
    COMPARE_HELP,
    chart,
    compared_model,
    for_each_model,
    md_plain,
    result_key,
    shared_result,
    stop_button,
)
from ui.sidebar import start_page

loaded = start_page("Attention heads", (
    "What every attention head does. **Over a corpus**: each head's attention entropy and its share of attention "
    "to [CLS], [SEP], punctuation, the token itself, the previous and the next token, and its mean attention "
    "distance, with 95% intervals over sentences (Clark et al. 2019 §3); the heads clustered by behaviour (§6); on "
    "a UD treebank, **heads as parsers** (§4.2: the word a head attends to most, per relation, against the best "
    "fixed offset); and **head importance** with its pruning curve (Michel et al. 2019). **One sentence**: every "
    "head's token-to-token attention (bertviz's head and model views), and two models side by side. Layers are "
    "attention layers (1 = the first block), heads count from 0. Attention is read on the eager attention path "
    "(a copy of the model loaded for this page)."))
SOURCES = ["Texts", "A treebank (CoNLL-U): heads as parsers too", "A finished job"]
DIRECTIONS = {"dependent_to_head": "dependent → its head", "head_to_dependent": "head → its dependent"}


@st.cache_resource(max_entries=2, show_spinner="Loading the model on the eager attention path…")
def eager(spec: ModelSpec):
    """``spec``'s own copy on the eager attention path (the shared cache keeps the default path)."""
    return load_eager(spec)


def fail(exc: Exception, what: str) -> None:
    st.error(str(exc) if isinstance(exc, (InputError, ModelLoadError)) else f"{what} failed: "
             f"{type(exc).__name__}: {exc}")


def show_importance(result, accuracy: str, headline: str, key: str) -> None:
    """An importance result: its layer x head map, the pruning curve (``accuracy``: what it measures), ``headline``
    then each layer's prunable share, and the two files."""
    c1, c2 = st.columns(2)
    with c1:
        chart(plots.importance_heatmap(result.importance), f"{key}_importance")
    with c2:
        chart(plots.pruning_curve(result.pruning, accuracy), f"{key}_pruning")
    drop = result.info.get("drop", 0.01)
    st.caption(f"{headline} Prunable share per layer (heads that can go, least important first, before accuracy "
               f"drops by {drop:.1%}): " + ", ".join(f"layer {int(r.layer)} {r.prunable_share:.0%}"
                                                     for r in result.layers.itertuples()))
    if note := result.info.get("prunable_note"):
        (st.caption if result.info.get("drop_resolved") else st.warning)(f"The prunable shares: {note}.")
    d1, d2 = st.columns(2)
    d1.download_button("importance.csv", to_csv(result.importance), "importance.csv", "text/csv",
                       key=f"dl_{key}_importance")
    d2.download_button("pruning.csv", to_csv(result.pruning), "pruning.csv", "text/csv", key=f"dl_{key}_pruning")


compare = st.text_input("Compare with (optional)", key="heads_compare", placeholder="hub id, local directory, "
                        "job:N or random", help=f"A second model, read on the same corpus and sentence: "
                        f"{COMPARE_HELP}. The head view needs the same tokenizer.").strip()
compare_link(st, "heads", compare)
JOB_TAB = "A fine-tuned classifier (a job)"
tab_corpus, tab_view, tab_job = st.tabs(["Over a corpus", "One sentence (head view)", JOB_TAB],
                                        default=JOB_TAB if st.session_state.pop("heads_open_job", False) else None)

# --- one sentence: the head view (run first: the corpus tab may stop the page while it waits for a click) -------
with tab_view:
    sentence = st.text_input("Sentence", "the cat sat on the mat because it was tired .", key="heads_sentence",
                             help="never cut: a sentence over the model's limit is refused")
    try:
        view = head_view(eager(loaded.spec), sentence)
    except Exception as exc:  # one message, never a traceback
        fail(exc, "The head view")
        view = None
    if view is not None:
        c1, c2 = st.columns(2)
        layer = c1.select_slider("Layer", list(range(1, view.layers + 1)), value=1, key="heads_layer")
        head = c2.selectbox("Head", list(range(view.heads)), key="heads_head")
        chart(plots.head_heatmap(view, layer, head), "heads_head_view")
        st.caption("Row: the attending token; column: the token it attends to; each row sums to 1. Hover for the "
                   "pair and the weight.")
        chart(plots.layer_heads(view, layer), "heads_model_view")
        if compare:
            try:
                name, head_from, label = compared_model(compare, loaded.spec.name)
                other = eager(dataclasses.replace(loaded.spec, name=name, revision=None, head_from=None))
                both = compare_views(eager(loaded.spec), other, sentence)
            except Exception as exc:
                fail(exc, "The comparison")
            else:
                st.subheader(f"Beside {md_plain(label)}")
                chart(plots.compared_heads(both.a, dataclasses.replace(both.b, model=label), layer, head),
                      "heads_compared_view")
                change = pd.DataFrame([{"layer": lay + 1, "head": h,
                                        "mean_abs_difference": float(abs(both.difference[lay, h]).mean())}
                                       for lay in range(view.layers) for h in range(view.heads)])
                chart(plots.statistic_heatmap(change, "mean_abs_difference", "How much each head changed on this "
                                              "sentence: mean |second − first| over its token pairs"),
                      "heads_view_change")

# --- a fine-tuning job's classifier: its head importance on its held-out rows (before the corpus tab may stop) --
with tab_job:
    from analysis.tasks.recipes import job_classifier_importance
    from analysis.training.finetune import held_out_rows
    from analysis.training.options import resolve
    from ui.jobs import finished_classifier_jobs

    finished = finished_classifier_jobs()
    if not finished:
        st.info("No finished fine-tuning job with a saved classifier yet: run one on the Fine-tuning jobs page. Its "
                "head importance is then computed here on the rows it was evaluated on.")
    else:
        by_id = {j.id: j for j in finished}
        job_id = st.selectbox("Job", list(by_id), key="heads_job", format_func=lambda i: f"#{i} {by_id[i].name}",
                              help="A finished fine-tuning job: its own classifier (its pooling head on its "
                              "fine-tuned encoder), scored on its held-out rows.")
        job = by_id[job_id]
        try:
            rows, which = held_out_rows(resolve(job.config), job.artifacts)
        except Exception as exc:
            fail(exc, "Reading the job's held-out rows")
            rows = None
        if rows is not None:
            st.caption(f"The job's own fine-tuned model and classifier (not the sidebar's model), scored on {which}.")
            if st.button("Compute the classifier's head importance", key="heads_job_run"):
                st.session_state["heads_job_request"] = job_id
            if st.session_state.get("heads_job_request") == job_id:
                def compute(report):  # the one recipe, as `layerlens heads importance --model job:N --data` runs it
                    return job_classifier_importance(
                        job.artifacts / "checkpoint", rows, job.label,
                        progress=lambda stage, done, n: report(done / max(n, 1), f"{stage} {done}/{n}"))
                stop = stop_button("Head importance", "heads_job_request")
                try:
                    result = shared_result(result_key("heads_job_importance", job_id, str(job.artifacts)),
                                           f"Head importance of job #{job_id}", compute)
                except Exception as exc:
                    stop.empty()
                    fail(exc, "Head importance")
                else:
                    stop.empty()
                    show_importance(result, "classification accuracy", f"Classification accuracy "
                                    f"{result.info['base_accuracy']:.3f} with every head, on "
                                    f"{result.info['targets']:,} rows.", "heads_job")

# --- over a corpus ------------------------------------------------------------------------------------------------
with tab_corpus:
    cap = max_server_texts()
    with st.expander(f"Run as a job: a whole file, in a process of its own (over {cap:,} sentences, or head "
                     "importance on many)", expanded=False):
        heads_job_form(loaded.spec)
    jobs_running("heads")
    source_kind = st.radio("Corpus", SOURCES, horizontal=True, key="heads_corpus", label_visibility="collapsed")
    treebank_path, limit, inputs, job = None, None, None, None
    parse_options = (None, "clark", "sum", MIN_COUNT)
    if source_kind == SOURCES[2]:
        finished = [j for j in heads_jobs() if j.status == "succeeded"]
        if not finished:
            st.info("No finished attention-heads job yet: submit one above (Run as a job).")
            st.stop()
        by_id = {j.id: j for j in finished}
        job = by_id[st.selectbox("Finished job", list(by_id), key="heads_open", format_func=lambda i: (
            f"#{i} {by_id[i].name}" + (f" · {note}" if (note := kinds.stage(by_id[i])) else "")))]
        try:
            opened = heads_job_result(job)
        except InputError as exc:
            st.error(str(exc))
            st.stop()
        report_button(job.artifacts, f"heads_job_{job.id}")  # the job's own files and run.json (issue 53 item 11)
        if isinstance(opened, ImportanceResult):
            what = "classification accuracy" if "classif" in opened.info.get("loss", "") else "MLM token accuracy"
            headline = (f"{what[0].upper()}{what[1:]} {opened.info['base_accuracy']:.3f} with every head, "
                        f"{opened.info['targets']:,} targets ({opened.info.get('loss', '')}).")
            show_importance(opened, what, headline, "heads_opened")
            st.stop()
        shown_name = short_name(job.config.get("model", "?"))
        results = {shown_name: opened}
    elif source_kind == SOURCES[1]:
        files = server_files(TREEBANK_SUFFIXES)
        if not files:
            st.info("No CoNLL-U treebank on the server: put .conllu(.gz) files under the data roots "
                    "(LAYERLENS_DATA_DIRS), or upload one on the Linguistic structure page.")
            st.stop()
        c1, c2 = st.columns([3, 1])
        treebank_path = c1.selectbox("Treebank", files, key="heads_treebank", format_func=server_file_picker_label)
        limit = int(c2.number_input("Max sentences", 1, cap, min(300, cap), key="heads_max", help=(
            f"the first N sentences; at most {cap:,} here (LAYERLENS_MAX_SERVER_TEXTS): a whole treebank runs as a "
            "job (above)")))
        with st.expander("Heads as parsers: readings", expanded=False):
            p1, p2, p3, p4 = st.columns([3, 2, 2, 1])
            wanted = p1.text_input("Relations", "", key="heads_relations_wanted", placeholder="every relation",
                                   help="comma-separated relations to score, e.g. nsubj,obj,amod")
            reading = p2.selectbox("Head → dependent", READINGS, key="heads_reading", help=(
                "clark: the word attending most to the dependent is its head (Clark et al.'s transposed map; each "
                "dependent counts once); row: the head word's own most-attended word is the dependent"))
            symmetry = p3.selectbox("Attention trees", SYMMETRIES, key="heads_symmetry", format_func={
                "sum": "W + Wᵀ (Clark)", "max": "max(W, Wᵀ)"}.get)
            min_count = int(p4.number_input("Min count", 1, 100_000, MIN_COUNT, key="heads_min_count", help=(
                "words a relation needs in each split (selection, held-out) to be reported")))
        parse_options = (tuple(r.strip() for r in wanted.split(",") if r.strip()) or None, reading, symmetry,
                         min_count)
    else:
        inputs = text_inputs("heads", EXAMPLES, pairs=False)
        if inputs is not None and len(inputs) > cap:
            st.warning(f"{len(inputs):,} texts: the page reads at most {cap:,} in the server "
                       "(LAYERLENS_MAX_SERVER_TEXTS); the first ones are read here, the whole file runs as a job "
                       "(above).")
            inputs = TextInputs(inputs.texts[:cap])
    if job is None:
        request = (str(treebank_path), limit, None if inputs is None else (inputs.texts, inputs.pairs), compare,
                   parse_options)
        if st.button("Read the heads", type="primary", key="heads_run",
                     disabled=treebank_path is None and inputs is None):
            st.session_state["heads_request"] = (loaded.spec.to_dict(), request)
        if st.session_state.get("heads_request") != (loaded.spec.to_dict(), request):
            st.caption("Choose texts or a treebank, then read the heads. Results are shared and cached per model and "
                       "corpus.")
            st.stop()

        def corpus():
            if treebank_path is not None:
                return read_conllu(treebank_path, limit or None)
            return inputs

        def run(spec: ModelSpec, label: str):
            key = result_key("heads", spec.resolved().to_dict(), request[:3], parse_options)
            relations, reading, symmetry, min_count = parse_options

            def compute(report):
                report(0.0, f"{label}: reading the corpus")
                return analyse(eager(spec), corpus(), relations=list(relations) if relations else None,
                               reading=reading, symmetry=symmetry, min_count=min_count,
                               progress=lambda stage, done, n: report(done / max(n, 1),
                                                                      f"{label}: {stage} {done}/{n} sentences"))
            return shared_result(key, f"Reading the heads of {label}", compute)

        results = for_each_model("Reading the heads", "heads_request", loaded, compare, run)
        shown_name = next(iter(results))  # the sidebar's model, by its short name
    main = results[shown_name]
    info = main.info
    st.caption(f"Model **{md_plain(shown_name)}** · {info['layers']} layers x {info['heads']} heads · "
               f"{info['sentences']:,} sentences, {info['tokens']:,} tokens · {info['seconds']:.1f} s"
               + (f" · {info['truncated']} text(s) cut to the model's limit" if info.get("truncated") else "")
               + (f" · {info['dropped_too_long']} sentence(s) over the model's limit left out"
                  if info.get("dropped_too_long") else ""))

    if main.heads is not None:  # a parse job's files have no statistics
        st.subheader("What each head attends to")
        c1, c2 = st.columns([2, 2])
        statistic = c1.selectbox("Statistic", list(STATISTICS), index=STATISTICS.index("previous"),
                                 key="heads_statistic", format_func=lambda s: f"{s}: {plots.TITLES[s]}")
        second = next((k for k in results if k != shown_name), None)
        paired = second is not None and (results[second].info["layers"], results[second].info["heads"]) == \
            (info["layers"], info["heads"])
        shown = c2.radio("Model", [*results, *(["difference"] if paired else [])], horizontal=True, key="heads_shown",
                         help="difference: the second model's statistic minus this one's, head by head") \
            if second is not None else shown_name
        if second is not None and not paired:
            st.caption(f"No difference map: **{md_plain(second)}** has {results[second].info['layers']} layers x "
                       f"{results[second].info['heads']} heads and **{md_plain(shown_name)}** {info['layers']} x "
                       f"{info['heads']}, so their heads cannot be paired one to one; each is shown on its own.")
        if shown == "difference":
            other = results[second].heads
            diff = main.heads[["layer", "head"]].assign(**{statistic: other[statistic] - main.heads[statistic]})
            chart(plots.statistic_heatmap(diff, statistic, f"{plots.TITLES[statistic]}: {plain(second)} − "
                                          f"{plain(shown_name)}", diverging=True), "heads_statistic_difference")
            if (diff[statistic].fillna(0) == 0).all():
                st.caption(f"**Identical on every head**: {statistic} is the same for both models on every head "
                           "(a model compared with itself, or weights the statistic cannot tell apart).")
        else:
            chart(plots.statistic_heatmap(results[shown].heads, statistic), f"heads_{statistic}")
        baseline = info.get("uniform_attention", {}).get(statistic)
        st.caption(f"Each sentence's mean over its tokens, then the mean over sentences; hover for the 95% interval "
                   f"({info['interval']})."
                   + (f" **Baseline**: every token attending uniformly to its sentence would give {statistic} = "
                      f"{baseline:.3f} on these sentences." if baseline is not None else "")
                   + " Uniform attention over n tokens has entropy log n: compare *entropy* with *uniform_entropy*.")
        with st.expander("heads.csv: every statistic of every head", expanded=False):
            st.dataframe(main.heads, hide_index=True, key="heads_table", placeholder="—")
            st.download_button("heads.csv", to_csv(main.heads), "heads.csv", "text/csv", key="dl_heads")
        result_report_button(Tables("heads stats", {"heads.csv": main.heads, **({"clusters.csv": main.clusters}
                                                                               if main.clusters is not None else {})},
                                    {**info, "model_spec": loaded.spec.resolved().to_dict()}), "heads_stats")

    if main.clusters is not None:
        st.subheader("Heads clustered by behaviour")
        chart(plots.head_map(main.clusters), "heads_map")
        st.caption(f"Heads close together attend alike: the Jensen-Shannon distance between two heads' attention "
                   f"of the same token, averaged over {info['cluster_tokens']:,} tokens, laid out in 2-D by MDS "
                   "(Clark et al. 2019 Fig. 6).")
        st.download_button("clusters.csv", to_csv(main.clusters), "clusters.csv", "text/csv", key="dl_clusters")

    if main.relations is not None:
        st.subheader("Heads as parsers")
        direction = st.radio("Direction", list(DIRECTIONS), horizontal=True, key="heads_direction",
                             format_func=DIRECTIONS.get)
        if main.relations.empty:  # every relation under the minimum count: say so, not an empty chart
            st.info(f"No relation has {info['min_count']} words in both splits (selection, held-out), so none is "
                    "scored: use a larger treebank, or lower **Minimum count**.")
        else:
            chart(plots.relations_figure(main.relations, direction), "heads_relations")
        best = info["best_tree"]
        tree = "a_ij + a_ji" if info["symmetry"] == "sum" else "max(a_ij, a_ji)"
        st.caption("The sentences alternate between a **selection** split, where each relation's best head and best "
                   "fixed offset are chosen, and a **held-out** split, where they are scored: blue, the chosen head's "
                   "held-out accuracy with its 95% Wilson interval (word-level attention, Clark §4.1); hollow, its "
                   "accuracy on the selection split, where it was chosen (optimistic); red, the chosen fixed offset "
                   "on the held-out words. Head → dependent reads "
                   + ("Clark's transposed map (the word attending most to the dependent is its head)"
                      if info["reading"] == "clark" else "the head word's own row (its most-attended word)")
                   + f". Best attention tree (maximum spanning tree of {tree}, chosen on the selection split): layer "
                   f"{best['layer']}, head {best['head']}, held-out UUAS {best['uuas']:.3f} (selection "
                   f"{best['selection_uuas']:.3f}; the structure page's structural probe reports UUAS on the same "
                   "scale).")
        if left := info.get("relations_under_min_count"):
            st.caption(f"Left out, fewer than {info['min_count']} words in a split (selection, held-out): "
                       + ", ".join(f"{md_plain(r)} ({a}, {b})" for r, (a, b) in list(left.items())[:30])
                       + (" ..." if len(left) > 30 else ""))
        st.dataframe(main.relations[main.relations.direction == direction], hide_index=True, key="heads_relations",
                     placeholder="—")
        st.download_button("relations.csv", to_csv(main.relations), "relations.csv", "text/csv", key="dl_relations")

    st.subheader("Which heads matter")
    if job is not None:
        st.caption(f"Head importance of a corpus runs as a job of its own (above: Run as a job, importance); this "
                   f"one was job #{job.id}'s {job.config.get('action')}.")
        st.stop()
    if loaded.mlm_head is None:
        st.info("Head importance here uses the MLM loss, and this model has no MLM head of its own: lend one in the "
                "sidebar (*Revision, device, precision, MLM head* → *Read layers with the MLM head of*, e.g. the "
                "masked LM it was distilled or fine-tuned from), or score a classifier on a labelled set with "
                "`layerlens heads importance --data`.")
        st.stop()
    texts = inputs if inputs is not None else TextInputs(tuple(" ".join(s.words) for s in corpus().sentences))
    i1, i2, i3 = st.columns(3)
    n_texts = int(i1.number_input("Texts", 1, len(texts), min(len(texts), 100), key="heads_imp_texts",
                                  help="the first N texts of the corpus above, each masked once (15% of its "
                                  "tokens)"))
    steps = int(i2.number_input("Pruning points", 1, 50, 10, key="heads_imp_steps",
                                help="points of the pruning curve after 0%: every 100/N% of the heads"))
    orders = int(i3.number_input("Random orders", 0, 10, 3, key="heads_imp_orders",
                                 help="seeded random orders of the heads, the baseline of the importance order"))
    low, high = pruning_passes(info["layers"], info["heads"], steps, orders)
    rate = info["seconds"] / max(info["sentences"], 1)  # the corpus pass above: seconds per sentence
    st.caption(f"Importance E_x|dL(x)/dξ| of each head's gate ξ (Michel et al. 2019, Eq. 2: the absolute gradient "
               f"per text, then the mean) and the pruning curve: {low}–{high} passes over {n_texts:,} texts, about "
               f"{low * n_texts * rate / 60:.1f}–{high * n_texts * rate / 60:.1f} min at the rate of the pass above "
               f"({rate * 1000:.0f} ms a sentence; the MLM passes are of the same size).")
    texts = TextInputs(texts.texts[:n_texts])
    wanted = (loaded.spec.to_dict(), request[:3], n_texts, steps, orders)
    if high * n_texts > cap * 10:
        st.info(f"{high} passes over {n_texts:,} texts is more than the server runs for a page "
                f"({cap * 10:,} text-passes: LAYERLENS_MAX_SERVER_TEXTS x 10). Choose fewer texts, points or orders, "
                "or run it as a job (above: Run as a job, head importance).")
        st.stop()
    if st.button("Compute head importance (MLM loss on these texts)", key="heads_importance_run"):
        st.session_state["heads_importance"] = wanted
    if st.session_state.get("heads_importance") != wanted:
        st.stop()
    stop = stop_button("Head importance", "heads_importance")
    try:
        importance = shared_result(result_key("heads_importance", loaded.spec.resolved().to_dict(), *wanted[1:]),
                                   "Head importance", lambda report: mlm_importance(
                                       load_eager(loaded.spec), texts,  # its own copy: gates hook the model
                                       steps=steps, seeds=tuple(range(orders)),
                                       progress=lambda stage, done, n: report(done / max(n, 1),
                                                                              f"{stage} {done}/{n}")))
    except Exception as exc:
        stop.empty()
        fail(exc, "Head importance")
        st.stop()
    stop.empty()
    show_importance(importance, "MLM token accuracy", f"MLM token accuracy at {importance.info['targets']:,} masked "
                    f"tokens: {importance.info['base_accuracy']:.3f} with every head.", "heads")
