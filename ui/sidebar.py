"""The sidebar every page shares: model picker, device and dtype, and the shared model cache panel."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import streamlit as st
import torch

from analysis.core.dataroots import browser_model
from analysis.core.inputs import InputError
from analysis.core.precision import mode
from analysis.probe.lens import label as lens_label
from models.cache import ModelCache, shared_cache
from models.loading import DEMO_NAME, RANDOM_SEED, SUGGESTED_MODELS, LoadedModel, ModelLoadError, ModelSpec
from ui.results import CHART_FORMAT, SIDEBAR_SPEC, stopped_note

KEY_MODEL, KEY_OTHER = "ll_model", "ll_model_other"
KEY_REVISION, KEY_DEVICE, KEY_DTYPE = "ll_revision", "ll_device", "ll_dtype"
KEY_HEAD_FROM = "ll_head_from"
KEY_HEAD_REFUSED = "ll_head_refused"  # (spec, reason) of a borrowed MLM head that could not be lent
OTHER = "other: hub id or local path…"  # a local folder under the model roots (analysis.core.dataroots.model_roots)


@st.cache_resource
def model_cache() -> ModelCache:
    """The one process-wide cache, shared by every browser session."""
    return shared_cache()


def available_devices() -> list[str]:
    devices = ["auto", "cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Page:
    file: str
    title: str
    icon: str
    line: str = ""  # one line for the home page
    source: str = ""  # where the technique comes from

    @property
    def exists(self) -> bool:
        return (ROOT / self.file).is_file()


HOME = Page("app.py", "Home", ":material/home:")
# Every analysis, in the order a researcher meets them; pages that do not exist yet are listed as coming.
ANALYSES = [
    Page("pages/0_Model_anatomy.py", "Model anatomy", ":material/account_tree:",
         "Embeddings, encoder layers and MLM head of the selected model, with their sizes.", "Hugging Face layout"),
    Page("pages/1_Reconstruction.py", "Reconstruction probing", ":material/replay:",
         "Feed every layer's hidden states through the model's own MLM head: how well does each layer "
         "reconstruct the input?", "Kao et al. 2020, §2"),
    Page("pages/2_Layer_Atlas.py", "Layer atlas", ":material/scatter_plot:",
         "Per-layer [CLS] projections (PCA, UMAP, t-SNE) coloured by class, and how separable each layer is.",
         "Song et al. 2020, Fig. 2; Sun et al. 2019"),
    Page("pages/3_Layer_Weights.py", "Layer weights", ":material/tune:",
         "What a fine-tuned attention-pooling or scalar-mix head learned: each layer's weight per example, "
         "class and epoch; the validation [CLS] atlas after the first and last epoch.",
         "Song et al. 2020; GRUBERT; Sun et al. 2019"),
    Page("pages/4_Layer_Duplication.py", "Layer duplication", ":material/layers:",
         "Make a model deeper by duplicating layers without training; preview, export, fine-tune.",
         "Kao et al. 2020, §3"),
    Page("pages/5_Fine_Tune_Jobs.py", "Fine-tuning jobs", ":material/work_history:",
         "Fine-tune with layer-pooling heads (LSTM/attention pooling, GRUBERT, layer selection, layer-wise "
         "learning-rate decay) as background jobs: live progress, cancel, comparison, ensembles.",
         "Sun et al. 2019; Song et al. 2020"),
    Page("pages/6_Linguistic_structure.py", "Linguistic structure", ":material/spellcheck:",
         "What each layer knows about syntax on UD treebanks: UPOS and relation probes with control tasks, MDL, "
         "structural probes (distance, depth), and where each task peaks.",
         "Tenney et al. 2019; Hewitt & Manning 2019; Hewitt & Liang 2019; Voita & Titov 2020"),
    Page("pages/7_Compare_checkpoints.py", "Compare checkpoints", ":material/compare_arrows:",
         "Two checkpoints layer by layer on the same rows: CKA, probe accuracy, the examples that moved most, "
         "one map per layer shared by both.", "Merchant et al. 2020; Kao et al. 2020, Fig. 2"),
    Page("pages/8_Token_atlas.py", "Token atlas", ":material/grain:",
         "Every token of a corpus per layer: a density map of a million tokens, nearest tokens across layers, "
         "anisotropy, self-similarity and rogue dimensions.", "exBERT; Ethayarajh 2019; Timkey & van Schijndel 2021"),
    Page("pages/9_Attention_heads.py", "Attention heads", ":material/center_focus_strong:",
         "What every attention head does over a corpus (entropy, [CLS]/[SEP], previous/next token, distance), heads "
         "clustered by behaviour, heads as parsers on UD, head importance and pruning, one sentence's head view.",
         "Clark et al. 2019; Michel et al. 2019; bertviz"),
    Page("pages/10_Neurons.py", "Neurons", ":material/hub:",
         "Each layer's units ranked by a linear probe's weights; the top k zeroed inside the model against the "
         "bottom k and k random units.", "Dalvi et al. 2019"),
    Page("pages/11_Classifier_lens.py", "Classifier lens", ":material/alt_route:",
         "Every layer of a fine-tuned classifier read through its own head: accuracy and agreement with the final "
         "prediction by layer, and the layer at which each example is decided.",
         "nostalgebraist 2020; Belrose et al. 2023"),
    Page("pages/12_Across_checkpoints.py", "Across checkpoints", ":material/timeline:",
         "One per-layer analysis over a series of checkpoints (a job's epochs, further pre-training steps, hub "
         "revisions): layer x checkpoint heat maps, and any checkpoint's own view.",
         "Liu et al. 2021; Sellam et al. 2022"),
]


def navigation() -> None:
    """Our own page list (Streamlit's would call the home page "app" and cannot list pages to come)."""
    for page in [HOME, *ANALYSES]:
        if page.exists:
            st.sidebar.page_link(page.file, label=page.title, icon=page.icon)
    st.sidebar.divider()


# The model's settings in the page's URL, so a reload or a shared link keeps them: query parameter -> widget key
# (the model's name: the select box's for a suggested model, else the typed field's).
URL_KEYS = {"model": KEY_MODEL, "revision": KEY_REVISION, "device": KEY_DEVICE, "precision": KEY_DTYPE,
            "head_from": KEY_HEAD_FROM}
DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16"]


def from_url() -> None:
    """At a session's first run (a reload, a shared link), the model's widgets as the URL's query parameters say.
    They are user input: a name that is not a suggested model fills the typed field, so it goes through the same
    checks as a typed name (:func:`model_picker`: a hub id or a folder under the model roots); a device or a
    precision that is not offered is ignored."""
    if KEY_MODEL in st.session_state:  # not the first run: the widgets hold the session's choice
        return
    query = st.query_params
    if name := query.get("model", "").strip():
        st.session_state[KEY_MODEL] = name if name in SUGGESTED_MODELS else OTHER
        if name not in SUGGESTED_MODELS:
            st.session_state[KEY_OTHER] = name
    offered = {"device": available_devices(), "precision": DTYPE_CHOICES}
    for param in ("revision", "device", "precision", "head_from"):
        value = query.get(param, "").strip()
        if value and value in offered.get(param, [value]):
            st.session_state[URL_KEYS[param]] = value


def to_url(spec: ModelSpec) -> None:
    """The chosen model's settings into the URL's query parameters (defaults left out: the demo model's URL is
    clean)."""
    values = {"model": spec.name, "revision": spec.revision, "device": spec.device, "precision": spec.dtype,
              "head_from": spec.head_from}
    for param, value in values.items():
        if value in (None, "", "auto", DEMO_NAME):
            if param in st.query_params:
                del st.query_params[param]
        elif st.query_params.get(param) != value:
            st.query_params[param] = value


def model_picker() -> ModelSpec | None:
    """Widgets for the model spec; their values persist across pages and are kept in the URL (:func:`to_url`)."""
    st.sidebar.header("Model")
    from_url()
    choice = st.sidebar.selectbox(
        "Model", [*SUGGESTED_MODELS, OTHER], key=KEY_MODEL, persist_state="session",
        format_func=lambda n: "demo (bundled, offline)" if n == DEMO_NAME else n,
        help="Any BERT, ALBERT, RoBERTa, DistilBERT or ELECTRA checkpoint: a masked LM, a bare encoder, a "
             "fine-tuned classifier or a sentence-transformers model. The demo model works offline; hub models need "
             "a network connection the first time.",
    )
    name = choice
    if choice == OTHER:
        name = st.sidebar.text_input("Hub id or local directory", key=KEY_OTHER, persist_state="session",
                                     placeholder="e.g. textattack/bert-base-uncased-SST-2 or /models/my-bert")
        if not name.strip():
            st.sidebar.info("Type a Hugging Face hub id or the path of a save_pretrained directory under the "
                            "dashboard's model folders (LAYERLENS_MODEL_DIRS).")
            return None
    with st.sidebar.expander("Revision, device, precision, MLM head"):
        revision = st.text_input("Revision", key=KEY_REVISION, persist_state="session",
                                 placeholder="main", help="Hub branch, tag or commit; empty for the default.")
        device = st.selectbox("Device", available_devices(), key=KEY_DEVICE, persist_state="session",
                              help="auto: CUDA GPU, then Apple MPS, then CPU")
        dtype = st.selectbox("Precision", DTYPE_CHOICES, key=KEY_DTYPE,
                             persist_state="session", help="auto and float32: the exact mode (float32 weights and "
                             "activations, on every device). bfloat16 and float16: the approximate mode, faster "
                             "on bf16/fp16 hardware; each probe and atlas states its agreement with float32, "
                             "measured on a sample.")
        head_from = st.text_input("Read layers with the MLM head of", key=KEY_HEAD_FROM, persist_state="session",
                                  placeholder="(the model's own)", help="A masked LM of the same family, hidden "
                                  "size and vocabulary, e.g. the model a classifier was fine-tuned from: its "
                                  "pre-trained head reads this model's layers (Kao et al. Fig. 2).")
    try:
        if choice == OTHER:  # typed in the browser: a hub id or a folder under the model roots
            browser_model(name)
        if head_from.strip():
            browser_model(head_from.strip())
        spec = ModelSpec(name, revision=revision.strip() or None, device=device, dtype=dtype,
                         head_from=head_from.strip() or None)
    except (ModelLoadError, InputError) as exc:
        st.sidebar.error(str(exc))
        return None
    to_url(spec)
    precision_note(spec)
    return spec


def precision_note(spec: ModelSpec) -> None:
    """Under the sidebar: bfloat16 or float16 chosen for a CPU where it cannot pay, said with this CPU's own measured
    speed of a bfloat16 product against float32 (issue 43, item 15; on an AMD host without bf16 units the
    approximate probe took 229 s where float32 took 26 s)."""
    from analysis.core.precision import bf16_units, cpu_bf16_speedup

    try:
        device = spec.resolved().device
    except ModelLoadError:
        return
    if device != "cpu" or spec.dtype not in ("bfloat16", "float16") or bf16_units("cpu"):
        return
    speed = cpu_bf16_speedup()
    st.sidebar.warning(f"This CPU has no bfloat16 units (AMX or AVX512-BF16): {spec.dtype} runs slower here, not "
                       f"faster. A bfloat16 product measured just now ran at {speed:.2f}x the speed of float32 "
                       "(an approximate probe took 229 s where float32 took 26 s on such a host). Choose float32 "
                       "(or auto) for this device.")


def cache_panel(cache: ModelCache) -> None:
    entries = cache.entries()
    with st.sidebar.expander(f"Model cache ({len(entries)} loaded)", expanded=False):
        if not entries:
            st.caption("No model loaded yet.")
        for e in reversed(entries):  # most recently used first
            st.markdown(f"**{e.name}** · {e.family}, {e.layers} layers  \n"
                        f"{e.device}, {e.dtype}, {human_bytes(e.nbytes)}")
        for device, budget in cache.budgets().items():
            st.caption(f"{device}: {human_bytes(cache.used(device))} of a {human_bytes(budget)} budget in use")
        if entries and st.button("Empty the cache", help="Frees the memory; every session reloads on next use."):
            cache.clear()
            st.rerun()


def has_line(loaded: LoadedModel) -> str:
    """What the model has: ``encoder · MLM head: own · task head: SequenceClassification (neg, pos)``."""
    head = {"own": "own"}.get(loaded.mlm_head, loaded.mlm_head) if loaded.mlm_head else \
        "none (lend one under 'Revision, device, precision, MLM head' above)"
    task = f" · task head: {loaded.task}" + (f" ({', '.join(loaded.labels)})" if loaded.labels else "") \
        if loaded.task else ""
    pooling = f" · pooling: {loaded.pooling}" if loaded.pooling else ""
    lenses = available_lenses(loaded)
    tuned = f" · tuned lenses: {', '.join(map(lens_label, lenses))}" if lenses else ""
    weights = f" · random weights (seed {RANDOM_SEED})" if loaded.spec.random_init else ""
    return f"encoder · MLM head: {head}{task}{pooling}{tuned}{weights}"


def available_lenses(loaded: LoadedModel) -> list:
    """The tuned lenses trained for this model's weights (bundled, under LAYERLENS_HOME/lenses, lens jobs)."""
    from analysis.probe.lens import find

    return find(loaded) if loaded.mlm_head else []


def sidebar() -> LoadedModel | None:
    """Render the shared sidebar and return the selected model, loaded through the shared cache (or None)."""
    navigation()
    spec = model_picker()
    cache = model_cache()
    loaded = None
    if spec is not None:
        try:
            with st.spinner(f"Loading {spec.name}…", show_time=True):
                loaded = load_with_head(cache, spec)  # a cache hit returns at once, before the spinner shows
        except ModelLoadError as exc:
            st.sidebar.error(str(exc))
        except Exception as exc:  # never a traceback in the UI
            st.sidebar.error(f"could not load '{spec.name}': {type(exc).__name__}: {exc}")
    st.session_state[SIDEBAR_SPEC] = None if loaded is None else loaded.spec  # part of every remembered request
    refused = head_refused()
    if loaded is not None and refused:
        st.sidebar.warning(f"MLM head not lent: {refused}. The pages that read layers through an MLM head "
                           "refuse until the head is fixed; the others use the encoder alone.")
    if loaded is not None:
        s = loaded.summary()
        st.sidebar.success(f"Loaded: {s['family']} · {s['layers']} layers · hidden {s['hidden_size']} · "
                           f"{s['device']} · {s['dtype']}  \n{has_line(loaded)}  \n"
                           f"Precision: {mode(s['dtype'])}")
    cache_panel(cache)
    st.sidebar.radio("Chart downloads", ["png", "svg"], horizontal=True, key=CHART_FORMAT, persist_state="session",
                     help="The camera icon on every chart saves it in this format; every table downloads as CSV "
                          "from the icons above it.")
    return loaded


def load_with_head(cache: ModelCache, spec: ModelSpec) -> LoadedModel:
    """The model of ``spec``. When only its borrowed MLM head (``head_from``) cannot be lent, the model itself
    (without that head) and the reason, kept in the session (:func:`head_refused`) for the pages that need a
    head; the encoder-only pages go on. A refusal is remembered per spec, so a rerun does not load the donor
    again."""
    remembered = st.session_state.get(KEY_HEAD_REFUSED)
    if spec.head_from and remembered and remembered[0] == spec:
        return cache.get(dataclasses.replace(spec, head_from=None))
    st.session_state[KEY_HEAD_REFUSED] = None
    try:
        return cache.get(spec)
    except ModelLoadError as exc:
        if not spec.head_from:
            raise
        loaded = cache.get(dataclasses.replace(spec, head_from=None))  # the model's own error, if it has one
        st.session_state[KEY_HEAD_REFUSED] = (spec, str(exc))
        return loaded


def head_refused() -> str | None:
    """Why the MLM head asked for in the sidebar could not be lent to the selected model (None: no refusal)."""
    remembered = st.session_state.get(KEY_HEAD_REFUSED)
    return remembered[1] if remembered else None


def start_page(title: str, intro: str, needs_head: bool = False) -> LoadedModel:
    """What every analysis page begins with: page config, the shared sidebar, title and a short explanation.

    Stops the page (with a hint) when no model could be loaded, so the caller always gets a model; with
    ``needs_head``, also when the MLM head asked for in the sidebar could not be lent (with the reason).
    """
    st.set_page_config(page_title=f"{title} · LayerLens", page_icon="🔬", layout="wide")
    loaded = sidebar()
    st.title(title)
    st.markdown(intro)
    stopped_note()
    if loaded is None:
        st.info("Choose a model in the sidebar.")
        st.stop()
    if needs_head and head_refused():
        st.error(f"This page needs an MLM head, and the one asked for under 'Revision, device, precision, MLM "
                 f"head' cannot be lent: {head_refused()}. Clear that field or name a compatible masked LM.")
        st.stop()
    return loaded
