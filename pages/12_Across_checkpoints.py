"""Across checkpoints: one per-layer analysis over a series of checkpoints, as layer x checkpoint heat maps."""

from pathlib import Path

import streamlit as st

from analysis.core.dataroots import browser_model
from analysis.core.inputs import InputError
from analysis.core.task import RunRecord
from analysis.series.checkpoints import parse
from analysis.series.plots import heatmap
from analysis.tasks.report import figures_for
from analysis.tasks.series import Series, SeriesOptions, seriesable
from analysis.training.runs import recorded_head
from ui.inputs import server_file
from ui.jobs import finished_jobs
from ui.report import result_report_button
from ui.results import chart, result_key, result_store, table
from ui.sidebar import start_page
from ui.tasks import run_on_page

TREEBANKS = (".conllu", ".conllu.gz")
SERIES = seriesable()  # the tasks that run across checkpoints, each saying what its series shows

loaded = start_page("Across checkpoints", (
    "**What each layer learns, and when.** One per-layer analysis run at every checkpoint of a series (a fine-tuning "
    "job's saved epochs, the steps of a further pre-training, a folder of checkpoints, or hub revisions such as "
    "MultiBERTs' `step_20k`), shown as **layer x checkpoint heat maps** (Liu et al. 2021, *Probing Across Time*). "
    "Each checkpoint's result is cached: a series resumes where it stopped and grows when a checkpoint is added."))

series_sources: dict[str, str] = {}
for job in finished_jobs("finetune"):
    if any((job.artifacts / "epochs").glob("*/encoder/config.json")):
        series_sources[f"job #{job.id} {job.name}: its epochs"] = str(job.artifacts)
    steps = job.artifacts / "further_pretrained" / "steps"
    if steps.is_dir():
        series_sources[f"job #{job.id} {job.name}: its further pre-training steps"] = str(steps)
TYPED = "A folder of checkpoints, MODEL@rev1,rev2 or A,B,C"
if not series_sources:
    st.caption("No finished fine-tuning job kept a series yet: on the Fine-tuning jobs page, under More options, "
               "turn on 'save each epoch's encoder' or 'save further pre-training every' (with further pre-training "
               "steps).")
source = st.selectbox("Checkpoints", [*series_sources, TYPED], key="series_source",
                      help="Jobs keep a series when fine-tuned with 'save each epoch's encoder' or 'save further "
                           "pre-training every' on the Fine-tuning jobs page")
if source == TYPED:
    spec = st.text_input("Series", key="series_typed", placeholder="e.g. /models/run/checkpoints or "
                         "google/multiberts-seed_0@step_20k,step_200k,step_2000k")
else:
    spec = series_sources[source]
points = []
if spec:  # the browser reaches only the model folders, whichever widget names them: checked before anything is read
    try:
        points = parse(spec, recorded_head, browser_model)
    except InputError as exc:
        st.error(str(exc))  # under the field that named it
        st.stop()
    except (OSError, ValueError) as exc:  # a damaged job folder under the roots (its metrics.json): one line
        st.error(f"{spec}: cannot be read as a series ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        st.stop()
analysis = st.radio("Analysis", list(SERIES), horizontal=True, key="series_analysis",
                    format_func=lambda a: f"{a}: {SERIES[a].series_what}")
files = {}
if "train" in SERIES[analysis].series_inputs:  # treebanks
    left, right = st.columns(2)
    files["train"] = server_file("series_train", left, TREEBANKS)
    files["test"] = server_file("series_test", right, TREEBANKS)
else:
    st.caption("Texts (probe, heads) or labelled rows (atlas), the same at every checkpoint:")
    files["input"] = server_file("series_input")
if not spec or None in files.values():
    st.stop()
try:
    options = SeriesOptions(analysis=analysis, checkpoints=spec, device=loaded.spec.device,
                            max_epochs=5 if analysis == "structure" else None, **files)
except InputError as exc:
    st.error(str(exc))
    st.stop()
st.caption(f"{len(points)} checkpoints, in this order: " + ", ".join(p.label for p in points))
key = result_key("series", options.model_dump(mode="json"))
if st.button("Run the analysis at every checkpoint", type="primary", key="series_run"):
    run_on_page({key: ("series", lambda ctx: Series().run(options, ctx))}, "The series")

if (run := result_store().get(key)) is None:
    st.stop()
if run.facts["reused"]:
    st.caption(f"{len(run.facts['reused'])} of {len(points)} checkpoints came from the cache.")
metrics = list(dict.fromkeys(run.series["metric"]))
metric = st.selectbox("Metric", metrics, key="series_metric")
chart(heatmap(run.series, metric, f"{analysis} ({SERIES[analysis].series_what})"), "series_heatmap")
st.caption("The colours span the values' own range (the title says it): small differences can look large. "
           "Hover for the values; series.csv below has them with their intervals.")
labels = dict(zip(run.folders, (c["label"] for c in run.facts["checkpoints"]), strict=True))
chosen = st.select_slider("Checkpoint", list(run.folders), key="series_checkpoint", format_func=labels.get)
folder = Path(run.folders[chosen])
st.subheader(f"At {labels[chosen]}: its own figures")
record = RunRecord.read(folder).to_dict()
record["model_spec"] = {**(record.get("model_spec") or {}), "name": labels[chosen]}  # named as in the series
for title, figure in figures_for(folder, record):
    if isinstance(figure, str):
        st.caption(f"{title}: {figure}")
    else:
        chart(figure, f"series_{title[:20]}")
with st.expander("series.csv"):
    table(run.series, {"interval": ("95% interval", "the analysis's own interval; blank where it gives none")})
result_report_button(run, "series")
