"""Token atlas (issue 29): every token of a corpus per layer: the map, nearest tokens across layers, and the geometry
of each layer (anisotropy, self-similarity, intra-sentence similarity, effective rank, rogue dimensions)."""

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from analysis.core.csvout import to_csv
from analysis.core.dataroots import data_roots, save_upload, server_file_picker_label, server_files
from analysis.core.entry import file_digest
from analysis.core.figures import plain
from analysis.core.inputs import LABEL_HINTS, InputError, columns_of, guess_text_column
from analysis.core.layers import parse_layers
from analysis.core.options import max_server_texts
from analysis.core.store import ArrayStore
from analysis.tasks import TASKS
from analysis.tokens.density import HOWS, map_figure, rasterise, sample_rows, warm_up
from analysis.tokens.plots import GEOMETRY_LINES, bands_caption, geometry_figure, neighbour_labels
from analysis.tokens.search import find_rows, marked, neighbours, summary
from analysis.tokens.vectors import KIND, TokenVectors
from ui.inputs import uploads_panel
from ui.report import result_report_button
from ui.results import chart, md_plain, result_key, shared_result, stop_button, wait_for_run
from ui.sidebar import start_page
from ui.tasks import page_options, task_result

loaded = start_page("Token atlas", (
    "Every token of a corpus, layer by layer: a **map** of one layer's tokens (exact PCA over all of them), the "
    "**nearest tokens** of one occurrence at each layer side by side (cosine, as exBERT shows them for BERT), and the "
    "**geometry** of each layer: anisotropy, self-similarity and intra-sentence similarity (Ethayarajh 2019), "
    "effective rank and the rogue dimensions that dominate the cosine (Timkey & van Schijndel 2021). The vectors are "
    "extracted once per model and corpus and cached on disk (float16, memory-mapped). Layer 0 is the embedding "
    "output."))

@st.cache_resource(show_spinner=False)
def compile_density() -> threading.Thread:
    """datashader's counting compiled on a thread once per server, while the first corpus is chosen and extracted
    (seconds of numba compilation that the first map would otherwise wait for)."""
    thread = threading.Thread(target=warm_up, name="datashader-warm-up", daemon=True)
    thread.start()
    return thread


compile_density()
SUFFIXES = (".txt", ".csv", ".tsv", ".jsonl", ".txt.gz", ".conllu", ".conllu.gz")
SAMPLE = "en_ewt-ud-dev-first300.conllu.gz"  # bundled: UD English-EWT's first 300 dev sentences, with UPOS/DEPREL
MAX_SHOWN, MAX_OCCURRENCES = 500, 500
FMT = lambda n: f"{n:,}"  # noqa: E731


def corpus_files() -> list[Path]:
    """Texts and treebanks under the data roots (the bundled data first, resolved inside them)."""
    return server_files(SUFFIXES)


def cached_extractions() -> list[TokenVectors]:
    """Every whole extraction in this dashboard's cache, newest first."""
    out = []
    for manifest in (ArrayStore().root / KIND).glob("*/manifest.json"):
        try:
            out.append(TokenVectors.open(manifest.parent))
        except (InputError, OSError, ValueError, KeyError):
            continue  # incomplete or unreadable: not offered
    return sorted(out, key=lambda tv: -(tv.directory / "manifest.json").stat().st_mtime)


def describe(tv: TokenVectors) -> str:
    src = tv.manifest.get("source") or {}
    what = {"conllu": "CoNLL-U", "texts": "texts"}.get(src.get("kind"), src.get("kind", "?"))
    return (f"{tv.manifest.get('model')} · {what} · {tv.manifest.get('texts', '?')} texts · {FMT(tv.rows)} tokens · "
            f"hidden states {', '.join(map(str, tv.layers))}")


@st.cache_resource(max_entries=4, show_spinner="Reading the token table…")
def token_tables(directory: str, stamp: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``tokens.parquet`` and ``texts.parquet`` of an extraction, shared by every session (never mutate them)."""
    tv = TokenVectors.open(directory)
    return tv.tokens(), tv.texts()


def highlighted(text: str) -> str:
    """A ``[[token]]``-marked text as markdown, the token highlighted and everything else shown as typed."""
    before, _, rest = text.partition("[[")
    token, _, after = rest.partition("]]")
    return f"{md_plain(before)}:orange-background[**{md_plain(token)}**]{md_plain(after)}" if rest else md_plain(text)


def fail(exc: Exception, what: str) -> None:
    """One message, never a traceback."""
    st.error(str(exc) if isinstance(exc, InputError) else f"{what} failed: {type(exc).__name__}: {exc}")
    st.stop()


def grid(frame: pd.DataFrame, key: str, helps: dict | None = None) -> None:
    """A table as the engine returned it: whole numbers as such, other numbers to 4 decimals, text as text (cells
    that a spreadsheet would read as a formula neutralised, as every LayerLens table and download)."""
    from pandas.api.types import is_integer_dtype, is_numeric_dtype

    from analysis.core.csvout import safe

    helps = helps or {}
    config = {c: st.column_config.NumberColumn(c, help=helps.get(c), format="%d" if is_integer_dtype(frame[c])
                                               else "%.4f") if is_numeric_dtype(frame[c])
              else st.column_config.TextColumn(c, help=helps.get(c)) for c in frame.columns}
    st.dataframe(safe(frame), hide_index=True, width="stretch", column_config=config, key=key, placeholder="—")


# --- which vectors -------------------------------------------------------------------------------------------------
SOURCES = ["Extract from a corpus", "Open a cached extraction"]
if st.radio("Vectors", SOURCES, horizontal=True, key="tokens_source", label_visibility="collapsed") == SOURCES[1]:
    found = cached_extractions()
    if not found:
        st.info("No extraction in the cache yet: choose **Extract from a corpus** (or run `layerlens tokens "
                "extract`, which writes to the same cache).")
        st.stop()
    by_dir = {str(tv.directory): tv for tv in found}
    directory = st.selectbox("Extraction", list(by_dir), key="tokens_cached", format_func=lambda d: describe(by_dir[d]))
else:
    files = corpus_files()
    with st.expander("Upload a corpus"):
        upload = st.file_uploader("Texts (.txt one per line, .csv, .tsv, .jsonl) or a CoNLL-U treebank (.conllu)",
                                  type=["txt", "csv", "tsv", "jsonl", "conllu", "gz"], key="tokens_upload")
        if upload is not None:
            try:
                saved = save_upload(upload.getvalue(), upload.name)
                files = list(dict.fromkeys([saved, *files]))
                if st.session_state.get("tokens_uploaded") != saved:  # a new upload: chosen once, then free to change
                    st.session_state["tokens_uploaded"] = st.session_state["tokens_file"] = saved
            except InputError as exc:
                fail(exc, "The upload")
        uploads_panel("tokens")
    if not files:
        st.info("No corpus on the server: upload one, or put texts or .conllu files under "
                f"{', '.join(map(str, data_roots()))} (LAYERLENS_DATA_DIRS).")
        st.stop()
    if st.session_state.get("tokens_file") not in files:  # first visit: the bundled sample (a first look in seconds)
        st.session_state["tokens_file"] = next((f for f in files if f.name == SAMPLE), files[0])
    c1, c2, c3 = st.columns([3, 1, 1])
    path = c1.selectbox("Corpus", files, key="tokens_file", format_func=server_file_picker_label,
                        help="texts (one per line in .txt; a column of .csv/.tsv/.jsonl) or a CoNLL-U treebank, whose "
                        "tokens carry their word's UPOS and DEPREL")
    limit = c2.number_input("Max texts", 1, 1_000_000, 300, key="tokens_limit", help="the first N texts (sentences) "
                            "of the file: 300 sentences are about 7,000 tokens, seconds on the demo model; above "
                            "LAYERLENS_MAX_SERVER_TEXTS (default 2,000) only as a background job")
    layer_text = c3.text_input("Layers", "all", key="tokens_layers", help="hidden states to keep: all, a slice (-4:) "
                               "or a list 0,2,4")
    column, label_column = "text", None
    if path.name.lower().endswith((".csv", ".tsv", ".jsonl")):
        try:
            columns = columns_of(path, path.name)  # read from the file, a line at a time
            guess = guess_text_column(path, path.name)
        except InputError as exc:
            fail(exc, "Reading the file")
        d1, d2 = st.columns(2)
        column = d1.selectbox("Text column", columns, index=columns.index(guess) if guess in columns else 0,
                              key="tokens_column")
        labels = ["(none)", *[c for c in columns if c != column]]
        hint = next((i for i, c in enumerate(labels) if c.lower() in LABEL_HINTS), 0)
        label_column = d2.selectbox("Label column", labels, index=hint, key="tokens_label",
                                    help="kept with each token: the map can be coloured by it")
        label_column = None if label_column == "(none)" else label_column
    try:
        layers = sorted(parse_layers(layer_text, loaded.num_layers + 1))
    except InputError as exc:
        fail(exc, "Layers")
    with st.expander("Run it as a background job (a large corpus or bert-base: extraction and the neighbour "
                     "indexes in a process of their own; progress, Cancel and log on the Fine-tuning jobs page)"):
        from ui.jobs import tokens_job_form

        tokens_job_form(loaded.spec, path, column, label_column, int(limit), layer_text)
        st.caption("A finished job's vectors are in the same cache: open them under **Open a cached extraction**.")
    request = (str(path), int(limit), layers, column, label_column)
    if int(limit) > (cap := max_server_texts()):
        st.info(f"{int(limit):,} texts is more than the page extracts in the server ({cap:,}: "
                "LAYERLENS_MAX_SERVER_TEXTS): run it as a background job (above), or choose fewer texts.")
        st.stop()
    wait_for_run("tokens_request", st.button("Extract token vectors", type="primary", key="tokens_run"), request,
                 "Choose a corpus, then extract. The vectors are cached on disk per model and corpus: a second time "
                 "(or from another session) they open at once.")

    def extract_vectors(report) -> str:
        from analysis.core.activations import max_input_length
        from analysis.tokens.corpus import read_corpus
        from analysis.tokens.vectors import extract

        report(0.0, "Tokenising")
        corpus = read_corpus(loaded.tokenizer, path, max_input_length(loaded), column, label_column, int(limit))
        tv = extract(loaded, corpus, layers,
                     progress=lambda stage, done, n: report(done / max(n, 1), f"{stage} {FMT(done)}/{FMT(n)}"))
        return str(tv.directory)

    stop = stop_button("Token extraction", "tokens_request")
    try:  # keyed by the corpus's content, never its path (issue 53 item 1)
        directory = shared_result(result_key("tokens", loaded.spec.resolved().to_dict(), request, file_digest(path)),
                                  "Extracting token vectors", extract_vectors)
    except Exception as exc:  # noqa: BLE001 - one message, never a traceback
        stop.empty()
        fail(exc, "Extraction")
    stop.empty()

try:
    tv = TokenVectors.open(directory)
    tokens, texts = token_tables(directory, (Path(directory) / "manifest.json").stat().st_mtime)
except Exception as exc:  # noqa: BLE001
    fail(exc, "Opening the extraction")
src = tv.manifest.get("source") or {}
notes = []
if src.get("truncated"):
    notes.append(f"{FMT(src['truncated'])} text(s) cut at the model's {tv.manifest.get('max_length')} tokens")
if src.get("dropped_too_long") or src.get("dropped_no_subword"):
    notes.append(f"{src.get('dropped_too_long', 0)} sentence(s) over the model's limit and "
                 f"{src.get('dropped_no_subword', 0)} with a word without subwords left out")
st.caption(f"**{md_plain(describe(tv))}** · hidden {tv.hidden} · {tv.disk_bytes() / 2**20:,.1f} MiB float16 on disk"
           + "".join(f" · {n}" for n in notes) + ". Tokens: the non-special ones ([CLS], [SEP], padding left out).")
if tv.manifest.get("fingerprint") and tv.manifest.get("fingerprint") != loaded.fingerprint:
    st.caption(f"These vectors were made by **{md_plain(tv.manifest.get('model'))}**, not the sidebar's model.")

VIEWS = ["Map", "Neighbours", "Geometry"]
ATLAS, DENSITY = "Embedding Atlas (WebGPU)", "Density (datashader)"
view = st.radio("View", VIEWS, horizontal=True, key="tokens_view")
has = {c for c in ("label", "upos", "deprel") if c in tokens.columns}


# --- map -----------------------------------------------------------------------------------------------------------
def umap_of(layer: int):
    """The layer's UMAP map: at once from the cache; else after a click, under a progress bar of its own stages (the
    fit's epochs, then the other tokens' neighbours and layout) with a Stop."""
    from analysis.tokens.maps import UMAP_SAMPLE, cached_umap, layer_map, progress_text

    if cached_umap(tv, layer) is not None:
        return layer_map(tv, layer, "umap")
    wait_for_run("tokens_umap_request", st.button("Compute the UMAP map", key="tokens_umap_run"), (directory, layer),
                 f"UMAP of hidden state {layer} is not cached: fitted on {min(UMAP_SAMPLE, tv.rows):,} sampled tokens "
                 "(200 epochs), the others placed by the fitted model, about a minute per 100,000 tokens on two cores; "
                 "its stages show in a progress bar, with a Stop.")
    stop = stop_button("UMAP map", "tokens_umap_request")
    try:
        return shared_result(result_key("tokens-umap", directory, layer), "UMAP", lambda report: layer_map(
            tv, layer, "umap", progress=lambda s, d, n: report(min(d / max(n, 1), 1.0), progress_text(s, d, n))))
    except Exception as exc:  # noqa: BLE001
        fail(exc, "The UMAP map")
    finally:
        stop.empty()


def show_map() -> None:
    from analysis.tokens.maps import UMAP_SAMPLE, layer_map
    from ui.embedding_atlas import NOT_INSTALLED, installed, lacks_webgpu, webgpu_support

    gpu = webgpu_support("tokens_atlas")  # None until the browser has answered (its answer reruns the page)
    lacking = lacks_webgpu(gpu) if installed() else NOT_INSTALLED  # why the atlas cannot be drawn here
    if lacking:  # the radio shows what is shown: the density view
        st.session_state["tokens_renderer"] = DENSITY
    renderer = st.radio("Map renderer", [ATLAS, DENSITY], horizontal=True, key="tokens_renderer",
                        disabled=bool(lacking),
                        format_func=lambda r: r if not lacking or r != ATLAS else f"{r}: {lacking}"
                        if lacking == NOT_INSTALLED else f"{r}: not in this browser ({lacking})",
                        help="Embedding Atlas (Apple's WebGPU map, served from this machine, no request leaves it): "
                        "every token, zoom, search and SQL filters, where the browser has WebGPU (a GPU machine); "
                        "elsewhere the density view is shown instead. Density: rasterised on the server, works in "
                        "any browser, and its selection comes back to this page.")
    c0, c1, c2, c3, c4, c5 = st.columns([1.1, 1.2, 1.1, 1, 1.2, 1.5])
    method = c0.radio("Axes", ["pca", "umap"], horizontal=True, key="tokens_method", format_func=str.upper,
                      help=f"PCA: exact, over every token (seconds at a million). UMAP (cosine, 15 neighbours): "
                      f"fitted on a random sample of {UMAP_SAMPLE:,} tokens, every other token placed by the fitted "
                      "model; minutes at a million tokens, and the first UMAP after a server start compiles for "
                      "about a minute. Both are cached on disk per layer.")
    layer = c1.selectbox("Layer", tv.layers, index=len(tv.layers) - 1, key="tokens_map_layer",
                         format_func=lambda x: f"hidden state {x}")
    how = c2.radio("Shading", list(HOWS), horizontal=True, key="tokens_shading", help="; ".join(
        f"{k}: {v}" for k, v in HOWS.items()))
    size = int(c3.number_input("Hover sample", 100, 50_000, 5_000, step=1000, key="tokens_sample",
                               help="points drawn over the density with hover, colour and selection"))
    colours = ["token", "word", "position", *[c for c in ("label", "upos", "deprel") if c in has], "none"]
    colour = c4.selectbox("Colour the sample by", colours, key="tokens_colour")
    search = c5.text_input("Search by text", key="tokens_search", placeholder="a word or token, e.g. the",
                           help="rings the tokens of that word (case-folded; a token spelled so when no word is)")
    if method == "umap":
        coords, meta = umap_of(layer)
    try:
        if method == "pca":
            with st.spinner("PCA of every token (exact, once per layer)…", show_time=True):
                coords, meta = layer_map(tv, layer, method)
        density = shared_result(result_key("tokens-density", directory, layer, method, how, meta.get("rows")),
                                "Rasterising", lambda report: rasterise(coords, how=how))
    except Exception as exc:  # noqa: BLE001
        fail(exc, "The map")
    if lacking == NOT_INSTALLED:
        st.caption(f"{ATLAS} is {NOT_INSTALLED}; the density view below works without it.")
    elif renderer == ATLAS or lacking:  # without WebGPU its frame says why (and keeps the browser's answer)
        from analysis.tokens.atlas_table import atlas_table
        from ui.embedding_atlas import show_embedding_atlas

        try:  # the table (coordinates + token metadata) only for a browser that can draw it
            table = atlas_table(tv, layer, method) if gpu is not None and not lacking else ""
            shown = show_embedding_atlas(table, key="tokens_atlas")
        except Exception as exc:  # noqa: BLE001
            fail(exc, "Embedding Atlas")
        if shown.renderer == "embedding-atlas":
            st.caption(f"**Shown: {ATLAS}**, served from this machine: all {FMT(tv.rows)} tokens of hidden state "
                       f"{layer} on its {method.upper()} axes; colour, search and filters are the atlas's own. "
                       f"A selection there stays there: choose **{DENSITY}** to list selected tokens on this page.")
            return
        renderer = DENSITY  # no WebGPU (said in the frame above) or not known yet: the density view
    rows = sample_rows(tv.rows, size)

    def points(rows: np.ndarray) -> pd.DataFrame:
        frame = tokens.iloc[rows].reset_index(drop=True)
        xy = np.asarray(coords[rows], dtype=np.float64)
        hover = [f"<b>{plain(t)}</b> · word {plain(w)} · text {i} · position {p}"
                 + (f" · {plain(u)}" if "upos" in has else "")
                 + "<br>" + plain(m).replace("[[", "<b>").replace("]]", "</b>")
                 for t, w, i, p, u, m in zip(frame["token"], frame["word"], frame["text_id"], frame["position"],
                                             frame["upos"] if "upos" in has else frame["token"],
                                             marked(frame, texts, 90), strict=True)]
        return frame.assign(x=xy[:, 0], y=xy[:, 1], hover=hover)

    sample = points(rows)
    ring = None
    if search.strip():
        try:
            matches = find_rows(tokens, word=search.strip())
        except InputError as exc:  # names the word and the nearest spellings present
            st.error(md_plain(str(exc)))
            matches = np.array([], dtype=np.int64)
        if len(matches):
            ring = points(matches[:MAX_SHOWN])
            st.caption(f"Search: {FMT(len(matches))} token(s) of '{md_plain(search.strip())}', ringed in orange"
                       + (f" (the first {MAX_SHOWN} shown)" if len(matches) > MAX_SHOWN else "") + ".")
    if method == "pca":
        ratio = meta.get("explained_variance_ratio", [np.nan, np.nan])
        titles = {"x_title": f"PC 1 ({ratio[0]:.1%} of variance)", "y_title": f"PC 2 ({ratio[1]:.1%} of variance)"}
        axes = f"the layer's exact PCA over every token ({meta.get('method', 'pca')})"
    else:
        titles = {"x_title": "UMAP 1", "y_title": "UMAP 2"}
        axes = (f"UMAP (cosine, {meta.get('n_neighbors')} neighbours) fitted on {FMT(meta.get('sample', 0))} random "
                f"tokens (seed {meta.get('seed')}), the other {FMT(meta.get('transformed_rows', 0))} placed by the "
                "fitted model; distances between clusters mean little in UMAP")
    fig = map_figure(density, sample, None if colour == "none" else colour, ring,
                     title=f"Hidden state {layer}: {FMT(tv.rows)} tokens", **titles)
    fig.update_layout(dragmode="select")
    event = chart(fig, f"tokens_map_{layer}", key="tokens_map", select=("box", "lasso"))
    compiled = (f" (+ {density.compile_seconds:,.1f} s compiling datashader's counting, once per server)"
                if density.compile_seconds > 0.05 else "")
    sampled = (f"all {FMT(tv.rows)} tokens" if len(rows) == tv.rows else
               f"a random sample of {FMT(len(rows))} of the {FMT(tv.rows)} tokens (seed 0)")
    st.caption(f"**Shown: {renderer}.** Embedding Atlas needs WebGPU (a browser on a GPU machine); this map is "
               f"rasterised on the server by datashader: {FMT(density.points)} tokens counted into "
               f"{density.counts.shape[1]} x {density.counts.shape[0]} pixels in {density.seconds * 1000:,.0f} ms"
               f"{compiled}, each pixel shaded blue by its count ({HOWS[how]}); "
               f"empty pixels are white. The density is counts only: hover, colour and selection are on {sampled}. "
               f"Axes: {axes}.")
    picked = []
    for p in (event.selection.points if event and event.selection else []):
        value = p.get("customdata")
        picked.append(int(value[0] if isinstance(value, list) else value))
    if picked:
        chosen = tokens.iloc[list(dict.fromkeys(picked))[:MAX_SHOWN]].reset_index(drop=True)
        chosen = chosen.assign(sentence=marked(chosen, texts, 120))
        st.subheader(f"Selected: {FMT(len(set(picked)))} token(s)")
        cols = ["row", "token", "word", "text_id", "position", *sorted(has), "sentence"]
        grid(chosen[cols], "tokens_selected", {"sentence": "the token marked [[...]] in its sentence (120 characters "
                                                            "around it)"})
    else:
        st.caption("Drag a box or a lasso over the points to list their tokens and sentences here.")


# --- neighbours ----------------------------------------------------------------------------------------------------
def across(row: int, k: int, standardize: bool) -> pd.DataFrame:
    """:func:`analysis.tokens.search.across_layers` with a progress bar: the same tables, one layer at a time."""
    def compute(report):
        parts = []
        for done, layer in enumerate(tv.layers):
            report(done / len(tv.layers), f"Nearest tokens at hidden state {layer} ({done + 1}/{len(tv.layers)})")
            parts.append(neighbours(tv, row, layer, k, "auto", tokens, texts, standardize=standardize))
        return pd.concat(parts, ignore_index=True)

    return shared_result(result_key("tokens-neighbours", directory, row, k, standardize), "Searching", compute)


def show_neighbours() -> None:
    c1, c2, c3 = st.columns([2, 1, 1.4])
    by = c1.radio("Query token by", ["word", "text id and position"], horizontal=True, key="tokens_query_by")
    k = int(c2.number_input("k", 1, 100, 10, key="tokens_k", help="neighbours per layer"))
    standardize = c3.checkbox("Standardise (rogue dimensions removed)", key="tokens_standardize", help=(
        "Timkey & van Schijndel 2021: every dimension z-scored over the corpus before the cosine, so that the few "
        "rogue dimensions no longer decide who is near. Brute force over the shards (no index)."))
    try:
        if by == "word":
            d1, d2 = st.columns([1, 3])
            word = d1.text_input("Word", key="tokens_word", placeholder="e.g. bank")
            if not word.strip():
                st.caption("Type a word of the corpus: its occurrences are listed, and the nearest tokens of the "
                           "one you pick are shown at every layer.")
                return
            rows = find_rows(tokens, word=word.strip())
            window = marked(tokens.iloc[rows[:MAX_OCCURRENCES]], texts, 110)
            labels = dict(zip(rows[:MAX_OCCURRENCES].tolist(), window, strict=True))
            row = d2.selectbox(f"Occurrence ({FMT(len(rows))} found" + (f", first {MAX_OCCURRENCES} listed)"
                               if len(rows) > MAX_OCCURRENCES else ")"), list(labels), key="tokens_occurrence",
                               format_func=lambda r: f"text {tokens['text_id'].iat[r]}: {labels[r]}")
        else:
            d1, d2 = st.columns(2)
            text_id = int(d1.number_input("Text id", 0, None, 0, key="tokens_text_id"))
            position = int(d2.number_input("Position", 0, None, 1, key="tokens_position",
                                           help="the token's index in the model's input (0 is [CLS])"))
            row = int(find_rows(tokens, text_id=text_id, position=position)[0])
        found = across(int(row), k, standardize)
    except Exception as exc:  # noqa: BLE001
        fail(exc, "The neighbour search")
    query = tokens.iloc[int(row)]
    st.markdown(f"**Query**: row {row} · text {query['text_id']} · position {query['position']} · token "
                f"`{md_plain(query['token'])}`  \n{highlighted(marked(tokens.iloc[[int(row)]], texts)[0])}")
    how = ("cosine of standardised vectors (z-scored per dimension), brute force" if standardize else
           "cosine; exact (faiss flat scan) up to 1,000,000 tokens, IVF above")
    layer = st.select_slider("Layer", tv.layers, value=tv.layers[-1], key="tokens_nb_layer",
                             format_func=lambda x: f"hidden state {x}")
    one = found[found["layer"] == layer].reset_index(drop=True)
    st.subheader(f"The {len(one)} nearest tokens at hidden state {layer}")
    if len(one) < k:
        st.caption(f"{k} asked for: " + (f"the extraction holds only {FMT(tv.rows)} tokens." if tv.rows <= k else
                                          "the approximate index found no more in the cells it searched."))
    st.markdown("  \n".join(f"{r} · `{c:.3f}` · {highlighted(m)}" for r, c, m in
                            zip(one["rank"], one["cosine"], one["marked"], strict=True)))
    st.caption(f"By {how}; the query itself is left out. The neighbour token is highlighted in its sentence.")
    cols = ["rank", "cosine", "token", "word", "text_id", "position", *sorted(has - {"label"}), "marked"]
    with st.expander("As a table"):
        grid(one[cols], "tokens_nb_table")
    st.subheader("Across layers")
    side = found.assign(cell=[f"{t} ({c:.2f})" for t, c in zip(found["token"], found["cosine"], strict=True)])
    side = side.pivot(index="rank", columns="layer", values="cell")
    side.columns = [f"hidden state {x}" for x in side.columns]
    st.dataframe(side.reset_index(), hide_index=True, key="tokens_across", placeholder="—")
    st.caption("exBERT's view: the same occurrence's nearest tokens at every layer, best first (cosine in brackets).")
    table_ = summary(query, found)
    st.subheader("Summary")
    grid(table_, "tokens_summary", {"same_word": "share of the neighbours with the query's word type (case-folded)",
                                    "same_token": "share with the query's token",
                                    "same_text": "share from the query's own text",
                                    "mean_position": "the neighbours' mean position in their text",
                                    "words": "the neighbours' most common words (count)",
                                    "upos": "UPOS of the neighbours (count)", "deprel": "DEPREL (count)"})
    for col in ("upos", "deprel"):
        if col in found:
            counts = found.groupby(["layer", col]).size().rename("count").reset_index()
            chart(neighbour_labels(counts, col), f"tokens_neighbours_{col}")
    if standardize:
        raw = across(int(row), k, False)
        kept = [{"layer": x, "shared_with_raw": len(set(raw[raw["layer"] == x]["row"]) &
                                                   set(found[found["layer"] == x]["row"])) / max(k, 1)}
                for x in tv.layers]
        st.caption("How the neighbours change once the rogue dimensions are standardised away: the share of the k "
                   "neighbours also found by the raw cosine, per layer.")
        st.dataframe(pd.DataFrame(kept), hide_index=True, key="tokens_std_overlap", placeholder="—")
    st.download_button("neighbours.csv", to_csv(found), "neighbours.csv", "text/csv", key="tokens_dl_neighbours")


# --- geometry ------------------------------------------------------------------------------------------------------
def show_geometry() -> None:
    c1, c2, c3 = st.columns(3)
    boots = int(c1.number_input("Bootstrap replicates", 20, 2000, 200, key="tokens_boots",
                                help="for the anisotropy, rogue-dimension and similarity bands"))
    max_texts = int(c2.number_input("Texts sampled", 10, 100_000, 1000, key="tokens_geo_texts",
                                    help="for intra-sentence similarity"))
    min_count = int(c3.number_input("Min occurrences of a word type", 2, 1000, 5, key="tokens_min_count",
                                    help="for self-similarity (1,000 types sampled, 20 occurrences each at most)"))
    request = (directory, boots, max_texts, min_count)
    wait_for_run("tokens_geo_request", st.button("Compute the geometry", type="primary", key="tokens_geo_run"),
                 request, "Every layer in one streaming pass each: seconds for a small corpus, about two minutes "
                 "for a million tokens on two cores.")
    stop = stop_button("Geometry", "tokens_geo_request")
    try:  # the tokens geometry task on the opened extraction: its run is the CLI's (`--vectors DIR`)
        task = TASKS["tokens geometry"]
        run = task_result(task, loaded.spec, tv, page_options(task, loaded.spec, vectors=directory, boots=boots,
                                                              max_texts=max_texts, min_count=min_count),
                          "Geometry", result_key("tokens-geometry", *request))
        table_, rogue = run.tables["geometry.csv"], run.tables["rogue_dims.csv"]
    except Exception as exc:  # noqa: BLE001
        stop.empty()
        fail(exc, "Geometry")
    stop.empty()
    chart(geometry_figure(table_), "tokens_geometry")
    st.caption("  \n".join(GEOMETRY_LINES.values()) + "  \n" + bands_caption(table_))
    st.subheader("Per layer")
    grid(table_, "tokens_geometry_table")
    st.subheader("Rogue dimensions")
    grid(rogue, "tokens_rogue_table", {"contribution": "the dimension's part of the anisotropy",
                                       "share": "contribution / anisotropy"})
    d1, d2 = st.columns(2)
    d1.download_button("geometry.csv", to_csv(table_), "geometry.csv", "text/csv", key="tokens_dl_geometry")
    d2.download_button("rogue_dims.csv", to_csv(rogue), "rogue_dims.csv", "text/csv", key="tokens_dl_rogue")
    result_report_button(run, "tokens_geometry")


{"Map": show_map, "Neighbours": show_neighbours, "Geometry": show_geometry}[view]()
st.caption(f"Vectors cached in {md_plain(str(tv.directory))}: the CLI reads them too (layerlens tokens "
           "neighbours or geometry --vectors DIR).")
