"""Load a BERT-family masked LM, its tokenizer and its anatomy from the hub, a local directory or the demo.

Safe by default: remote code is never run, and only safetensors weights are read unless the caller opts in to
pickle (``allow_pickle=True``), which can execute code hidden in the file.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import logging
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer

from models.anatomy import FAMILIES, HEAD_PARTS, Anatomy, UnsupportedArchitectureError, anatomy_of, family_of
from models.hub import hub_offline
from models.spec import (  # noqa: F401  (re-exported: the names every caller imports from here)
    DEMO_DIR,
    DEMO_NAME,
    DEVICES,
    DTYPE_NAMES,
    RANDOM_PREFIX,
    RANDOM_SEED,
    SUGGESTED_MODELS,
    ModelLoadError,
    ModelSpec,
    resolve_device,
    resolve_dtype,
)

log = logging.getLogger(__name__)

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
assert tuple(DTYPES) == DTYPE_NAMES


@dataclasses.dataclass(frozen=True)
class Saved:
    """What a checkpoint is as saved: its class (``config.architectures``), its parameters (shared ones once)
    and those of its pooler (0: none)."""

    architecture: str
    parameters: int
    pooler: int


def saved_class(architecture: str | None, config):
    """The transformers class named ``architecture`` when it is one for ``config``'s model type, else None
    (a name is looked up in transformers, never imported from the checkpoint)."""
    import transformers

    cls = getattr(transformers, architecture, None) if architecture else None
    if (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
            and cls.config_class is not None and isinstance(config, cls.config_class)):
        return cls
    return None


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A loaded model in eval mode with gradients off. Shared between sessions: never mutate it."""

    spec: ModelSpec  # resolved: concrete device and dtype
    model: torch.nn.Module
    tokenizer: object
    anatomy: Anatomy
    nbytes: int
    load_seconds: float
    mlm_head: str | None = "own"  # "own", "from <model>" (borrowed, --head-from) or None: no MLM head
    task: str | None = None  # the checkpoint's own task head: "SequenceClassification", "PreTraining", ...
    labels: list[str] | None = None  # its classes (config.id2label) for a classification head
    pooling: str | None = None  # a sentence encoder's own pooling (sentence-transformers' 1_Pooling): cls/mean/max,
    # "+normalize" when its modules.json ends in a Normalize module (2_Normalize)
    architecture: str | None = None  # the class the checkpoint was saved as (config.architectures): BertModel, ...

    @property
    def num_layers(self) -> int:
        return self.anatomy.num_layers

    @functools.cached_property
    def weights_id(self) -> str:
        """What identifies these weights whatever the dtype they run in: for a local directory (and the demo) a
        SHA-256 of its weight, config and tokenizer files; for a hub model its id and the commit it resolved to
        (else the revision asked for); and a borrowed MLM head. A tuned lens belongs to this."""
        path = Path(self.spec.source).expanduser()
        if path.is_dir():
            where = "sha256:" + directory_digest(path)
        else:
            commit = getattr(self.model.config, "_commit_hash", None)
            where = f"{self.spec.source}@{commit or self.spec.revision or 'main'}"
        if self.spec.random_init:  # the config's model, initialised by this torch and transformers
            import transformers

            where = f"random(seed {RANDOM_SEED}, torch {torch.__version__}, transformers {transformers.__version__})" \
                    f":{where}"
        return where + (f"/head:{self.spec.head_from}" if self.spec.head_from else "")

    @functools.cached_property
    def saved(self) -> Saved:
        """The checkpoint as saved, not the ``*ForMaskedLM`` object it is read through: its class and the
        parameters an object of that class has (a bare encoder's pooler counted, no placeholder MLM head), at
        this model's depth (a duplication preview: the deeper model's)."""
        architecture = self.architecture or type(self.model).__name__
        cls = saved_class(architecture, self.model.config)
        if cls is None:  # not a transformers class we know: what is loaded, less a head the checkpoint lacks
            placeholder = 0 if self.mlm_head == "own" else self.anatomy.head_parameters()
            return Saved(architecture, sum(p.numel() for p in self.model.parameters()) - placeholder, 0)
        with torch.device("meta"):  # shapes only: no memory, no initialisation
            shaped = cls(copy.deepcopy(self.model.config))
        pooler = getattr(shaped.base_model, "pooler", None)
        return Saved(architecture, sum(p.numel() for p in shaped.parameters()),
                     sum(p.numel() for p in pooler.parameters()) if isinstance(pooler, torch.nn.Module) else 0)

    @property
    def fingerprint(self) -> str:
        """:attr:`weights_id` and the dtype (bf16 states differ from fp32), for caching results on disk."""
        where, _, head = self.weights_id.partition("/head:")
        return f"{where}/{self.spec.dtype}" + (f"/head:{head}" if head else "")

    def summary(self) -> dict:
        """Plain facts about the model, for the sidebar, the CLI and ``info.json``."""
        return {
            "name": self.spec.name, "family": self.anatomy.family, "class": self.saved.architecture,
            "layers": self.num_layers, "hidden_size": self.anatomy.hidden_size,
            "vocab_size": self.anatomy.vocab_size,
            "parameters": self.saved.parameters, "pooler": self.saved.pooler,
            "device": self.spec.device, "dtype": self.spec.dtype, "bytes": self.nbytes,
            "load_seconds": round(self.load_seconds, 3), "mlm_head": self.mlm_head or "none",
            "task_head": self.task or "none", "labels": ", ".join(self.labels or []) or "none",
            "pooling": self.pooling or "none",
        }


@functools.lru_cache(maxsize=64)
def file_sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    """SHA-256 of the file at ``path``, remembered by (path, size, mtime): a model folder's files, an input file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_digest(path: Path) -> str:
    """SHA-256 over the model files of a ``save_pretrained`` directory (weights, configs, vocabularies); a
    file's digest is remembered by (path, size, mtime) so a hundred page runs hash it once."""
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if file.is_file() and file.suffix in {".safetensors", ".bin", ".json", ".txt", ".model"}:
            stat = file.stat()
            digest.update(f"{file.name}:{file_sha256_cached(str(file), stat.st_size, stat.st_mtime_ns)}".encode())
    return digest.hexdigest()


def module_nbytes(module: torch.nn.Module) -> int:
    """Bytes held by a module's parameters and buffers (shared tensors counted once)."""
    seen, total = set(), 0
    for t in [*module.parameters(), *module.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def _explain(spec: ModelSpec, exc: BaseException) -> str:
    """One readable sentence for a failed ``from_pretrained``."""
    chain, e = [], exc
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    names = {type(e).__name__ for e in chain}
    text = " ".join(str(e) for e in chain)
    name = spec.name
    looks_local = name.startswith((".", "/", "~")) or Path(name).exists()
    if looks_local and not Path(name).expanduser().is_dir():
        return f"'{name}' is not a directory; give a save_pretrained directory or a hub id such as bert-base-uncased"
    if looks_local:
        return f"'{name}' is not a loadable model directory (no config.json with a model_type?): {str(exc)[:200]}"
    if "RevisionNotFoundError" in names or "is not a valid git identifier" in text:
        return f"revision '{spec.revision}' does not exist for '{name}'"
    if "GatedRepoError" in names:
        return f"'{name}' is gated on the Hugging Face hub; accept its terms and log in (`hf auth login`) first"
    if "RepositoryNotFoundError" in names or "not a valid model identifier" in text:
        return (f"'{name}' is neither a local directory nor a model on the Hugging Face hub "
                "(check the spelling; private models need `hf auth login`)")
    if "couldn't connect" in text or "LocalEntryNotFoundError" in names or "offline" in text.lower():
        return (f"'{name}' is not in the local Hugging Face cache and the hub cannot be reached (no network, or "
                "HF_HUB_OFFLINE is set); download it once with a network connection, or use a local directory")
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"could not load '{name}': {first_line[:300]}"


def _head_prefixes(family: str) -> tuple[str, ...]:
    return tuple(p + "." for p in HEAD_PARTS[family])


def _from_hub(source: str) -> bool:
    """Whether ``source`` names a hub model (read from the hub or its cache), not a local path."""
    return not (source.startswith((".", "/", "~")) or Path(source).expanduser().exists())


def _hub_kwargs(spec: ModelSpec) -> dict:
    """What every from_pretrained call gets: the revision, never the checkpoint's own code, and the local cache
    only when the hub is out of reach (:func:`hub_offline`): a name that is not there is refused at once."""
    offline = _from_hub(spec.source) and hub_offline()
    return {"revision": spec.revision, "trust_remote_code": False, **({"local_files_only": True} if offline else {})}


def config_and_family(spec: ModelSpec):
    """``(config, family)`` of the checkpoint ``spec`` names, read without loading its weights (a
    :class:`ModelLoadError` naming what is wrong: no such model, not one of the families, the demo missing)."""
    if spec.source == str(DEMO_DIR) and not (DEMO_DIR / "config.json").is_file():
        raise ModelLoadError(f"the demo model is missing from {DEMO_DIR}; run `python -m models.pretrain` first")
    try:
        config = AutoConfig.from_pretrained(spec.source, **_hub_kwargs(spec))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(_explain(spec, exc)) from exc
    try:
        family = family_of(config.model_type)
    except UnsupportedArchitectureError as exc:
        raise ModelLoadError(str(exc)) from exc
    return config, family


def _load_error(spec: ModelSpec, exc: BaseException) -> ModelLoadError:
    if not spec.allow_pickle and "safetensors" in str(exc).lower():
        return ModelLoadError(
            f"'{spec.name}' has no safetensors weights; pickle weights can run arbitrary code, so they are "
            "only loaded when you allow pickle (--allow-pickle) for a source you trust")
    return ModelLoadError(_explain(spec, exc))


def checkpoint_dtype(spec: ModelSpec) -> str:
    """The dtype ``spec``'s weights are stored in (``float32``, ``bfloat16`` or ``float16``), whatever dtype it
    is shown in: the ``dtype`` ``save_pretrained`` records in ``config.json``; float32 when none is recorded (as
    in the original hub checkpoints, which are float32)."""
    config, _ = config_and_family(spec)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    return name if name in DTYPES and name != "auto" else "float32"


def load_encoder(spec: ModelSpec):
    """A fresh, trainable copy of ``spec``'s encoder (``AutoModel``, with its pooler where the family has one)
    and its tokenizer, for fine-tuning. Any checkpoint of a supported family will do (an ELECTRA
    discriminator too); the MLM head is not needed. Never the shared cached model. Always float32, whatever
    dtype the checkpoint was saved in: these are the master weights (bfloat16 is only autocast compute), since
    bfloat16 parameters lose most small updates to rounding."""
    spec = spec.resolved()
    kwargs = _hub_kwargs(spec)
    config, _ = config_and_family(spec)
    try:
        encoder = random_model(AutoModel, config, torch.float32) if spec.random_init else AutoModel.from_pretrained(
            spec.source, config=config, dtype=torch.float32, use_safetensors=not spec.allow_pickle, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(spec.source, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error(spec, exc) from exc
    return encoder.to(spec.device).train(), tokenizer


TASK_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                 "ForMultipleChoice", "ForPreTraining")


@contextlib.contextmanager
def quiet_load_report():
    """transformers' per-key load report and 'checkpoint seem corrupted' notice, silenced: loading a classifier
    or a bare encoder as a masked LM leaves its head missing by design (the analyses say what that means)."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def random_model(auto_class, config, dtype: torch.dtype, **kwargs):
    """``auto_class.from_config(config, **kwargs)``: transformers' own initialisation of a new model (its
    ``initializer_range``), seeded with :data:`RANDOM_SEED` without touching the caller's random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_SEED)
        return auto_class.from_config(config, **kwargs).to(dtype)


def load_model(spec: ModelSpec, attn_implementation: str | None = None) -> LoadedModel:
    """Load any checkpoint of a supported family in eval mode with gradients off. Raises :class:`ModelLoadError`.

    The model object is always the family's ``*ForMaskedLM`` (so every analysis finds the encoder and a head
    where it expects them); a checkpoint saved without an MLM head (a bare encoder, a task model, an ELECTRA
    discriminator, a sentence encoder) gets ``mlm_head=None`` and its random head is never used, unless
    ``spec.head_from`` lends one. Encoder weights must all be present.

    ``attn_implementation`` (None: transformers' default, SDPA) is passed to transformers: ``"eager"`` is the
    path that returns attention weights, asked for only by the attention-heads analysis (``analysis.heads``),
    which loads its own copy; the shared cache never passes it."""
    start = time.perf_counter()
    spec = spec.resolved()
    kwargs = _hub_kwargs(spec)
    attention = {"attn_implementation": attn_implementation} if attn_implementation else {}
    config, family = config_and_family(spec)
    try:
        if spec.random_init:
            model, info = random_model(AutoModelForMaskedLM, config, DTYPES[spec.dtype], **attention), {}
        else:
            with quiet_load_report():  # a head the checkpoint lacks is expected here, and said in LoadedModel
                model, info = AutoModelForMaskedLM.from_pretrained(
                    spec.source, config=config, dtype=DTYPES[spec.dtype], use_safetensors=not spec.allow_pickle,
                    output_loading_info=True, **attention, **kwargs,
                )
        tokenizer = AutoTokenizer.from_pretrained(spec.source, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error(spec, exc) from exc
    missing = sorted(info.get("missing_keys", ()))
    missing_encoder = [k for k in missing if not k.startswith(_head_prefixes(family))]
    if missing_encoder:
        raise ModelLoadError(f"'{spec.name}' is incomplete: these encoder weights are missing: "
                             f"{', '.join(missing_encoder[:4])}{' ...' if len(missing_encoder) > 4 else ''}")
    architecture = (config.architectures or [""])[0]
    task = next((suffix[3:] for suffix in TASK_SUFFIXES if architecture.endswith(suffix)), None)
    labels = ([str(config.id2label[i]) for i in sorted(config.id2label)] if task in
              ("SequenceClassification", "TokenClassification") else None)
    mlm_head = None if any(k.startswith(_head_prefixes(family)) for k in missing) else "own"
    saved_as = architecture if saved_class(architecture, config) else (
        type(model).__name__ if mlm_head else type(model.base_model).__name__)
    if spec.head_from:
        borrow_head(model, tokenizer, family, spec)
        mlm_head = f"from {spec.head_from}"
    model.to(spec.device).eval().requires_grad_(False)
    return LoadedModel(spec=spec, model=model, tokenizer=tokenizer, anatomy=anatomy_of(model),
                       nbytes=module_nbytes(model), load_seconds=time.perf_counter() - start, mlm_head=mlm_head,
                       task=task, labels=labels, pooling=sentence_pooling(spec), architecture=saved_as)


def load_as_saved(spec: ModelSpec, dtype: str) -> tuple[torch.nn.Module, list[str]]:
    """``spec``'s checkpoint as the class it was saved as (``config.architectures``: a ``BertModel`` keeps its
    pooler; ``AutoModel`` when the name is not a transformers class for it), on the CPU in ``dtype``, in eval
    mode; and the weights that class has but the checkpoint lacks (initialised at random, never to be saved)."""
    config, _ = config_and_family(spec)
    cls = saved_class((config.architectures or [None])[0], config) or AutoModel
    try:
        with quiet_load_report():
            model, info = cls.from_pretrained(spec.source, config=config, dtype=DTYPES[dtype],
                                              use_safetensors=not spec.allow_pickle, output_loading_info=True,
                                              **_hub_kwargs(spec))
    except (OSError, ValueError) as exc:
        raise _load_error(spec, exc) from exc
    return model.eval(), sorted(info.get("missing_keys", ()))


SENTENCE_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def sentence_transformers_files(spec: ModelSpec) -> tuple[Path, list[str]] | None:
    """Where ``spec``'s sentence-transformers files are (its directory, or a hub snapshot of those files only)
    and their paths relative to it: ``modules.json``, ``sentence_bert_config.json``,
    ``config_sentence_transformers.json`` and every module folder ``modules.json`` names (``1_Pooling``,
    ``2_Normalize``, ...). None for a model that is not a sentence-transformers one (or offline)."""
    import json

    root = Path(spec.source).expanduser()
    if not root.is_dir():
        try:
            from huggingface_hub import hf_hub_download, snapshot_download

            local = hub_offline()
            modules = json.loads(Path(hf_hub_download(spec.source, "modules.json", revision=spec.revision,
                                                      local_files_only=local)).read_text())
            folders = [m["path"] for m in modules if m.get("path")]
            root = Path(snapshot_download(spec.source, revision=spec.revision, local_files_only=local,
                                          allow_patterns=[*SENTENCE_FILES, *(f"{f}/*" for f in folders)]))
        except Exception:  # not a sentence-transformers repository, or offline
            return None
    if not (root / "modules.json").is_file():
        return None
    folders = [m["path"] for m in json.loads((root / "modules.json").read_text()) if m.get("path")]
    return root, [name for name in SENTENCE_FILES if (root / name).is_file()] + folders


def has_own_mlm_head(spec: ModelSpec) -> bool:
    """Whether ``spec`` was saved as a masked LM (its config's architecture), without loading its weights."""
    try:
        config, _ = config_and_family(spec)
    except ModelLoadError:
        return False
    return any(a.endswith("ForMaskedLM") for a in config.architectures or [])


def task_architecture(spec: ModelSpec) -> str | None:
    """The checkpoint's architecture when it carries a task head (``BertForSequenceClassification``, ...)."""
    try:
        config, _ = config_and_family(spec)
    except ModelLoadError:
        return None
    return next((a for a in config.architectures or [] if a.endswith(TASK_SUFFIXES)), None)


def borrow_head(model, tokenizer, family: str, spec: ModelSpec) -> None:
    """Replace ``model``'s MLM head by the pre-trained head of ``spec.head_from`` (same family, hidden size and
    vocabulary, checked first: an error says what differs). The decoder is untied from ``model``'s own word
    embeddings first, so the head keeps the donor's matrix while the encoder keeps its own embeddings."""
    donor = load_model(ModelSpec(spec.head_from, device="cpu", dtype=spec.dtype, allow_pickle=spec.allow_pickle))
    if donor.mlm_head != "own":
        raise ModelLoadError(f"--head-from '{spec.head_from}' has no MLM head of its own to lend")
    ours, theirs = model.config, donor.model.config
    differences = [f"{what} {a} vs {b}" for what, a, b in (
        ("family", family, donor.anatomy.family), ("hidden size", ours.hidden_size, theirs.hidden_size),
        ("vocabulary", ours.vocab_size, theirs.vocab_size)) if a != b]
    if not differences and tokenizer.get_vocab() != donor.tokenizer.get_vocab():
        differences.append("tokenizer vocabularies (same size, different tokens)")
    if differences:
        raise ModelLoadError(f"cannot read '{spec.name}' with the MLM head of '{spec.head_from}': "
                             + "; ".join(differences))
    output = model.get_output_embeddings()
    if output is not None and output.weight is model.get_input_embeddings().weight:
        output.weight = torch.nn.Parameter(output.weight.detach().clone())
        model.config.tie_word_embeddings = False
    for part in HEAD_PARTS[family]:
        getattr(model, part).load_state_dict(getattr(donor.model, part).state_dict())


def sentence_pooling(spec: ModelSpec) -> str | None:
    """A sentence-transformers checkpoint's pooling (``cls``, ``mean`` or ``max``) from its ``modules.json`` and
    ``1_Pooling/config.json``, read as JSON (the package's code is never imported), with ``+normalize`` when
    ``modules.json`` lists a ``Normalize`` module (``2_Normalize``: the pooled vector L2-normalised); None for
    other models."""
    import json

    def read(filename: str):
        path = Path(spec.source).expanduser() / filename
        if path.is_file():
            return json.loads(path.read_text())
        if Path(spec.source).expanduser().is_dir():
            return None
        try:
            from huggingface_hub import hf_hub_download

            return json.loads(Path(hf_hub_download(spec.source, filename, revision=spec.revision,
                                                   local_files_only=hub_offline())).read_text())
        except Exception:  # not a sentence-transformers repository, or offline
            return None

    modules = read("modules.json")
    pooling = next((m.get("path") for m in modules or [] if str(m.get("type", "")).endswith(".Pooling")), None)
    settings = read(f"{pooling}/config.json") if pooling else None
    if not settings:
        return None
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    for mode in ("cls", "mean", "max"):
        if settings.get(f"pooling_mode_{mode}_token" if mode == "cls" else f"pooling_mode_{mode}_tokens"):
            return mode + ("+normalize" if normalize else "")
    return None


def split_pooling(pooling: str) -> tuple[str, bool]:
    """``(mode, normalize)`` of a :func:`sentence_pooling` value: ``"mean+normalize"`` -> ``("mean", True)``."""
    mode, _, then = pooling.partition("+")
    return mode, then == "normalize"


__all__ = ["FAMILIES", "DEMO_NAME", "SUGGESTED_MODELS", "ModelSpec", "LoadedModel", "ModelLoadError",
           "load_model", "load_encoder", "resolve_device", "resolve_dtype", "module_nbytes"]
