"""Submitting a fine-tuning job: every option checked first, so a bad one is a message and nothing is queued.

The options are :class:`analysis.training.options.FinetuneOptions` (the keys of ``finetune --config`` files), resolved
as everywhere (schema, model default, preset, given) and stored whole, so a job keeps the values it was
submitted with. Checked at submit: every option's type and bounds (a negative learning rate, ``num_processes``
"abc" or 0, an unknown truncation, ...), that the model's config
loads and the head fits it (``gru-share-5`` on 12 layers, ``pooler`` on DistilBERT), that the data sources
read, that the text/pair/label columns exist and that the training labels have at least two classes.

A job from the browser (``browser=True``: the jobs page, the lens form) is checked as the browser's own input
before anything is read: its data sources are ``demo``, a hub dataset *name* or a file under the data roots
(:func:`analysis.core.dataroots.browser_source`), its model a hub id or a folder under the model roots
(:func:`analysis.core.dataroots.browser_model`), pickle loading is off, and a sweep varies only
:data:`analysis.training.options.SWEEPABLE`. The CLI trusts its user and reads what it is given.
"""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError
from analysis.tokens.options import TokensJobOptions
from analysis.training.finetune import fold_splits, split_off, split_reader
from analysis.training.heads import build_head
from analysis.training.options import resolve
from analysis.training.taskdata import label_ids
from jobs.backends import check_available, launch
from jobs.store import JobStore
from jobs.worker import ensure_worker
from models.loading import ModelLoadError, _config_and_family


class SubmitError(ValueError):
    """The job was not queued; the message says why."""


KINDS = ("finetune", "lens", "structure", "tokens")  # what a job does: fine-tune a head, train a tuned lens
# (analysis.probe.lens), probe each layer for linguistic structure (analysis.structure), or extract a corpus's token
# vectors and build their neighbour indexes (analysis.tokens)


def browser_checked(options, files: tuple[str, ...] | None = None):
    """``options`` as the browser may submit them, or an :class:`InputError`: the model a hub id or a folder under
    the model roots (:func:`analysis.core.dataroots.browser_model`), no pickle loading, and every data source (stored
    resolved): for fine-tuning and lens jobs ``demo``, a hub dataset name or a file under the data roots; the
    fields named in ``files`` (structure and tokens jobs) a file under the data roots."""
    from analysis.core.dataroots import browser_model, browser_source, within_roots

    browser_model(options.model)
    if options.allow_pickle:
        raise InputError("allow_pickle: pickle weights are never loaded for the browser (use the CLI)")
    if files is not None:
        return options.replace(**{k: str(within_roots(getattr(options, k))) for k in files if getattr(options, k)})
    data = {k: browser_source(str(getattr(options, k))) for k in ("train", "val", "test", "corpus")
            if getattr(options, k, None)}
    return options.replace(**data)


def validate_lens(config: dict, browser: bool = False) -> tuple[dict, str]:
    """A tuned-lens job: its options (:class:`analysis.probe.options.LensOptions`), the texts, the model's MLM
    head."""
    from analysis.probe.lens import read_corpus
    from analysis.probe.options import LensOptions
    from models.loading import has_own_mlm_head

    try:
        options = LensOptions(**{k: v for k, v in config.items() if k != "kind"})
        if browser:
            options = browser_checked(options)
        texts = read_corpus(options)
        if len(texts) <= options.eval_texts:
            raise InputError(f"{len(texts)} texts: a lens needs more than eval_texts={options.eval_texts}")
        spec = options.spec().resolved()
        _config_and_family(spec)
        if not has_own_mlm_head(spec):
            raise InputError(f"'{spec.name}' has no MLM head of its own: a tuned lens is read through one")
    except (InputError, ModelLoadError, ValueError) as exc:
        raise SubmitError(str(exc)) from None
    return {"kind": "lens", **options.to_dict()}, spec.device


def validate_structure(config: dict, browser: bool = False) -> tuple[dict, str]:
    """A linguistic-structure job: its options (:class:`analysis.structure.options.StructureJobOptions`), the two
    treebanks (read whole: a malformed line is refused now, naming it), the labelled set if any, the layers and
    rank against the model's config, the backend. From the ``browser`` the treebanks and the labelled set are
    files under the data roots and the model a hub id or a folder under the model roots, before anything is
    read."""
    from analysis.core.layers import parse_layers
    from analysis.core.treebank import read_conllu
    from analysis.structure.options import StructureJobOptions, check_rank

    try:
        options = StructureJobOptions(**{k: v for k, v in config.items() if k != "kind"})
        if browser:
            options = browser_checked(options, files=("train", "test", "label_data"))
        for name in ("train", "test"):
            path = Path(getattr(options, name)).expanduser()
            if not path.is_file():
                raise InputError(f"{name} {path}: no such file (give a CoNLL-U treebank, .conllu or .conllu.gz)")
            read_conllu(path, options.max_sentences)
        if options.label_data:
            from analysis.core.inputs import read_file
            from analysis.core.separability import check_labels

            labelled = read_file(Path(options.label_data), options.text_column, options.pair_column,
                                 label_column=options.label_column)
            check_labels(labelled.labels, 5)
        spec = options.spec().resolved()
        model_config, _ = _config_and_family(spec)
        n_states = model_config.num_hidden_layers + 1
        parse_layers(options.layers, n_states)
        if options.tree_layers.strip().lower() != "none":
            parse_layers(options.tree_layers, n_states)
        if set(options.task_list) & {"distance", "depth"}:
            check_rank(options.rank, model_config.hidden_size)
        if options.backend == "slurm":
            check_available()
    except (InputError, ModelLoadError, ValueError) as exc:
        raise SubmitError(str(exc)) from None
    return {"kind": "structure", **options.to_dict()}, spec.device


def validate_tokens(config: dict, browser: bool = False) -> tuple[dict, str]:
    """A token-vector job: its options (:class:`TokensJobOptions`), the corpus read as the job will read it (a
    CoNLL-U treebank whole, so a malformed line is refused now, naming it; texts with their columns), the layers
    against the model's config, the backend. From the ``browser`` the corpus is a file under the data roots and
    the model a hub id or a folder under the model roots, before anything is read."""
    from analysis.core.layers import parse_layers
    from analysis.tokens.corpus import read_source

    try:
        options = TokensJobOptions(**{k: v for k, v in config.items() if k != "kind"})
        if browser:
            options = browser_checked(options, files=("corpus",))
        path = Path(options.corpus).expanduser()
        if not path.is_file():
            raise InputError(f"corpus {path}: no such file (texts: .txt, .txt.gz, .csv, .tsv, .jsonl; or a CoNLL-U "
                             "treebank: .conllu, .conllu.gz)")
        read_source(path, options.text_column, options.label_column, options.limit)  # as the job reads it
        spec = options.spec().resolved()
        model_config, _ = _config_and_family(spec)
        parse_layers(options.layers, model_config.num_hidden_layers + 1)
        if options.backend == "slurm":
            check_available()
    except (InputError, ModelLoadError, ValueError, OSError) as exc:
        raise SubmitError(str(exc)) from None
    return {"kind": "tokens", **options.to_dict()}, spec.device


def check_held_out(options, train) -> None:
    """The validation rows the run will hold out of ``train`` (with ``val_fraction``), held out now with the
    run's own function (:func:`analysis.training.finetune.split_off`), so a fraction that leaves a class without a row
    in the held-out or the training part is refused at submit, not after the model has loaded. k-fold: every class
    needs a row per fold, and with early stopping each fold's training rows are split as the run splits them."""
    def hold_out(rows, seed: int) -> None:
        try:
            split_off(rows, options.val_fraction, seed)
        except InputError as exc:
            raise InputError(f"val_fraction (validation fraction) {options.val_fraction:g}: {exc}") from None

    if options.folds == 1:
        if not options.val:
            hold_out(train, options.seed)
        return
    folds = fold_splits(train.labels, options.folds, options.seed)
    if options.early_stopping:
        for k, (rows, _) in enumerate(folds):
            hold_out(train.subset(sorted(rows)), options.seed + k)


def validate(config: dict, browser: bool = False) -> tuple[dict, str]:
    """(the job's resolved options, every field, the device the job will run on) or :class:`SubmitError`.
    ``browser``: also :func:`browser_checked`, before anything is read."""
    kind = config.get("kind", "finetune")
    if kind not in KINDS:
        raise SubmitError(f"unknown job kind '{kind}' (choose from {', '.join(KINDS)})")
    if kind == "lens":
        return validate_lens(config, browser)
    if kind == "structure":
        return validate_structure(config, browser)
    if kind == "tokens":
        return validate_tokens(config, browser)
    config = {k: v for k, v in config.items() if k != "kind"}
    try:
        options = resolve(config)
        if browser:
            options = browser_checked(options)
        if not options.train:
            raise InputError("no training data: set train (a file, 'demo' or hf:NAME[/CONFIG]:SPLIT)")
        spec = options.spec().resolved()
        model_config, _ = _config_and_family(spec)
        read = split_reader(options)
        train = read(options.train)
        others = [read(s) for s in (options.val, options.test) if s]
        label_ids(train.labels, *(o.labels for o in others))
        check_held_out(options, train)
        build_head(options.head, model_config.num_hidden_layers, model_config.hidden_size, 2,
                   pooler=object() if getattr(model_config, "model_type", "") not in ("distilbert", "electra")
                   else None)
        if options.backend == "slurm":
            check_available()
    except (InputError, ModelLoadError, ValueError) as exc:
        raise SubmitError(str(exc)) from None
    return options.to_dict(), spec.device


GENERIC_FOLDERS = {"model", "models", "checkpoint", "checkpoints", "encoder", "final", "best", "output", "outputs",
                   "out", "export", "exports", "artifacts", "hf", "weights"}


def model_label(model: str) -> str:
    """How a job's name shows its model: a hub id whole (``org/name``); a local folder by its name, with its
    parent when the name alone says nothing (``sst2-seed3/model``, ``job7/encoder``)."""
    path = Path(str(model)).expanduser()
    if not path.exists():
        return str(model)
    name = path.resolve().name
    if name.lower() in GENERIC_FOLDERS or len(name) < 3:
        parent = path.resolve().parent.name
        if parent.lower() in GENERIC_FOLDERS:  # jobs/<id>/artifacts/checkpoint/encoder
            parent = f"{path.resolve().parent.parent.name}/{parent}"
        return f"{parent}/{name}"
    return name


def job_name(options: dict) -> str:
    """``attention · demo · demo set · epochs 1, lr 0.003``: head, model, data, the preset and the training
    options that differ from what the model and the preset give by default."""
    from analysis.training.options import FinetuneConfig, defaults_for

    if options.get("kind") == "structure":
        return " · ".join(["linguistic structure", model_label(options.get("model", "demo")),
                           str(options.get("tasks", "")).replace(",", ", "), Path(str(options.get("train"))).name
                           + " → " + Path(str(options.get("test"))).name])
    if options.get("kind") == "tokens":
        index = options.get("index", "auto")
        return " · ".join(["token vectors", model_label(options.get("model", "demo")),
                           Path(str(options.get("corpus"))).name, f"layers {options.get('layers', 'all')}",
                           "no index" if index == "none" else f"index {index}"])
    if options.get("kind") == "lens":
        corpus = str(options.get("corpus") or "")
        return " · ".join(["tuned lens", model_label(options.get("model", "demo")),
                           "demo set" if corpus == "demo" else corpus[3:] if corpus.startswith("hf:") else
                           Path(corpus).name, f"{options.get('steps')} steps"])
    defaults = defaults_for(options.get("model", "demo"), options.get("preset"))
    data = options.get("train") or ""
    data = "demo set" if data == "demo" else Path(data).name if not data.startswith("hf:") else data[3:]
    changed = [f"{k.replace('_', ' ')} {options[k]:g}" if isinstance(options[k], float) else
               f"{k.replace('_', ' ')} {options[k]}" for k in FinetuneConfig.model_fields
               if k not in ("head", "save_vectors") and k in options and options[k] != defaults[k]]
    preset = [f"preset {options['preset']}"] if options.get("preset") else []
    return " · ".join([options.get("head", "cls"), model_label(options.get("model", "demo")), data,
                       ", ".join(preset + changed) or "defaults"])


def submit(config: dict, store: JobStore | None = None, name: str = "", start_worker: bool = True,
           group: str | None = None, browser: bool = False) -> int:
    """Validate and queue ``config`` (in sweep ``group``); start a local worker if none runs, or send it to
    Slurm (backend ``slurm``). ``browser``: submitted from the dashboard (:func:`browser_checked`). Returns the
    job id."""
    store = store or JobStore()
    config, device = validate(config, browser)
    job_id = store.submit(config, device, name or job_name(config), group)
    if config.get("backend") == "slurm":
        try:
            launch(store, job_id)
        except ValueError as exc:
            raise SubmitError(str(exc)) from None
    elif start_worker:
        ensure_worker(store)
    return job_id


def submit_sweep(config: dict, points: list[dict], store: JobStore | None = None, group: str | None = None,
                 start_worker: bool = True, browser: bool = False) -> tuple[str, list[int]]:
    """Queue one job per grid point (:func:`analysis.training.options.grid`) on top of ``config``, all in one ``group``
    (default: ``sweep <time>: <keys>``). Every point is checked before any is queued; from the ``browser`` a
    point varies only :data:`analysis.training.options.SWEEPABLE` and each merged point is :func:`browser_checked`.
    Returns the group name and the job ids."""
    import time

    from analysis.training import options as schema

    checked = []
    for point in points:
        refused = [k for k in point if browser and k not in schema.SWEEPABLE]
        try:
            if refused:
                raise SubmitError(f"{', '.join(refused)} cannot be swept from the browser: a sweep varies the "
                                  "training options only")
            checked.append(validate({**config, **point}, browser))
        except SubmitError as exc:
            raise SubmitError(f"{', '.join(f'{k}={v}' for k, v in point.items())}: {exc}") from None
    store = store or JobStore()
    group = group or f"sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: {' x '.join(points[0]) if points else ''}"
    ids = [submit(options, store, start_worker=start_worker, group=group, browser=browser)
           for options, _ in checked]
    return group, ids
