"""``lens classifier``: every layer of a fine-tuned classifier read through its own head (:mod:`analysis.
classifier_lens`): layers.csv, examples.csv (tuned.csv with the tuned lens) and run.json.

The classifier is a finished fine-tuning job (``job:N``, resolved by the door to its ``checkpoint/encoder``, whose
``head.json`` and ``head.safetensors`` lie beside it) or a checkpoint saved as ``*ForSequenceClassification``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from analysis.core.csvout import to_csv
from analysis.core.inputs import InputError
from analysis.core.options import (
    MAX_SEED,
    ModelOptions,
    Options,
    batch_size_field,
    label_column,
    max_length_field,
    pair_column,
    path,
    text_column,
)
from analysis.core.task import Context, Result, RunRecord, Task


class ClassifierLensKnobs(Options):
    """The lens's own knobs (the page's form)."""

    max_length: int | None = max_length_field()
    batch_size: int = batch_size_field()
    tuned: bool = Field(False, title="tuned classifier lens", description="also train one affine translator per "
                        "layer (KL to the final distribution, 20% of the rows held out; at least 100 rows): "
                        "tuned.csv")
    tuned_epochs: int = Field(10, ge=1, le=1000, title="tuned lens epochs", description="passes over the training "
                              "rows")
    tuned_lr: float = Field(1e-3, gt=0, le=1, title="tuned lens learning rate", description="Adam's step size")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="the held-out split and the translators")


class ClassifierLensOptions(ClassifierLensKnobs, ModelOptions):
    """The classifier (the model block: a job's ``checkpoint/encoder`` or a sequence classifier), a labelled file
    and the lens's knobs."""

    data: Path | None = Field(None, json_schema_extra=path("data"),
                              title="labelled rows", description="labelled rows: .csv, .tsv or .jsonl (labels: the "
                              "classifier's class names or ids); default for a LayerLens run's classifier (job:N): "
                              "the rows it was scored on and never trained on")
    text_column: str = text_column()
    pair_column: str | None = pair_column()
    label_column: str = label_column()
    max_rows: int = Field(20_000, ge=1, json_schema_extra={"browser_max": 100_000},
                          title="row limit", description="refuse more rows than this")


class ClassifierLensRun(Result):
    def __init__(self, layers, examples, tuned, facts: dict):
        self.layers, self.examples, self.tuned, self.facts = layers, examples, tuned, facts

    def write(self, out: Path) -> list[str]:
        to_csv(self.layers, out / "layers.csv")
        to_csv(self.examples, out / "examples.csv")
        written = ["layers.csv", "examples.csv"]
        if self.tuned is not None:
            to_csv(self.tuned, out / "tuned.csv")
            written.append("tuned.csv")
        RunRecord("lens classifier", self.facts).write(out)
        return [*written, "run.json"]

    def shown(self):
        return self.layers


def load_classifier(options: ClassifierLensOptions):
    """``(readout, tokenizer, class names, length limit, truncation, facts)`` of the classifier the options name;
    a one-line error for a model without a classification head."""
    from analysis.classifier_lens.readout import HubReadout, PoolingReadout
    from analysis.core.activations import position_limit
    from analysis.training.runs import classifier_checkpoint
    from models.loading import DTYPES, ModelLoadError, config_and_family

    spec = options.spec().resolved()
    checkpoint = classifier_checkpoint(spec.source)
    if checkpoint is not None:
        from analysis.training.finetune import load_checkpoint

        model, tokenizer, meta = load_checkpoint(checkpoint, spec.device)
        names = sorted(meta["labels"], key=meta["labels"].get)
        limit = min(meta.get("max_length") or 10**9, position_limit(model.encoder.config))
        return (PoolingReadout(model), tokenizer, names, limit, meta.get("truncation") or "head",
                {"classifier": f"the job's LayerLens head '{meta['head']}'", "checkpoint": str(checkpoint)})
    config, _ = config_and_family(spec)
    architecture = (config.architectures or ["(none saved)"])[0]
    if not architecture.endswith("ForSequenceClassification"):
        raise InputError(f"'{spec.name}' has no sequence-classification head (saved as {architecture}): the "
                         "classifier lens reads a fine-tuned classifier: job:N, or a checkpoint saved as "
                         "*ForSequenceClassification")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            spec.source, revision=spec.revision, dtype=DTYPES[spec.dtype], use_safetensors=not spec.allow_pickle)
        tokenizer = AutoTokenizer.from_pretrained(spec.source, revision=spec.revision)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"'{spec.name}': {exc}") from exc
    model.to(spec.device).eval().requires_grad_(False)
    try:
        readout = HubReadout(model)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    names = [str(config.id2label[i]) for i in sorted(config.id2label)]
    return (readout, tokenizer, names, position_limit(config), "head",
            {"classifier": f"the checkpoint's own {architecture} head", "checkpoint": spec.source})


def trained_rows(options: ClassifierLensOptions):
    """For a LayerLens run's classifier (``options.model`` its checkpoint, as ``job:N`` resolves): ``(the (text,
    pair) rows it trained on, the rows it was scored on and never trained on, those rows in words)``
    (:func:`analysis.training.finetune.held_out_rows`, from the options its run.json records); None for another
    classifier or a run whose folder does not say."""
    from analysis.core.task import read_run
    from analysis.training.finetune import held_out_rows, split_reader
    from analysis.training.options import resolve
    from analysis.training.runs import classifier_checkpoint

    checkpoint = classifier_checkpoint(options.spec().source)
    if checkpoint is None:
        return None
    artifacts = checkpoint.parent
    try:
        recorded = read_run(artifacts).get("options")
        run_options = resolve(recorded) if isinstance(recorded, dict) else None
    except InputError:
        return None
    if run_options is None or run_options.folds > 1:
        return None
    held, said = held_out_rows(run_options, artifacts)
    train = split_reader(run_options)(run_options.train)
    held_ids = set(held.ids) if not (run_options.test or run_options.val) else set()
    rows = {(t, p) for i, t, p in zip(train.ids, train.texts, train.pairs or [None] * len(train), strict=True)
            if i not in held_ids}
    return rows, held, f"the classifier's held-out rows: {said}"


class ClassifierLens(Task):
    name = "lens classifier"
    help = ("classifier lens: read every layer through a fine-tuned classifier's own head (job:N or a sequence "
            "classifier): accuracy, agreement and KL to the final prediction per layer, each example's decision layer")
    writes = "the classifier lens writes layers.csv, examples.csv (tuned.csv with --tuned), run.json"
    Options = ClassifierLensOptions
    example = {"data": "analysis/data/demo_sentiment.csv"}
    page = "pages/11_Classifier_lens.py"
    unit = "text"

    def run(self, options: ClassifierLensOptions, ctx: Context) -> ClassifierLensRun:
        from analysis.core.inputs import check_row_limit, read_file

        found = trained_rows(options)  # read once: the default rows and the count of rows it trained on
        if options.data is None:
            if found is None:
                raise InputError("--data is required: the labelled rows to read (only a LayerLens run's classifier, "
                                 "job:N, has held-out rows to default to)")
            data = check_row_limit(found[1], options.max_rows, "the classifier lens'")
        else:
            data = check_row_limit(read_file(options.data, options.text_column, options.pair_column,
                                             label_column=options.label_column), options.max_rows,
                                   "the classifier lens'")
        for note in data.notes():
            ctx.log(f"note: {note}")
        return self.read(options, data, ctx, found)

    def read(self, options: ClassifierLensOptions, data, ctx: Context, found=...) -> ClassifierLensRun:
        """The run on labelled rows already read (``TextInputs``): the page's door, which has its rows in memory.
        ``found``: :func:`trained_rows` of ``options`` where the caller read it already (``...``: read here)."""
        from analysis.classifier_lens import lens, tuned
        from analysis.core.activations import encode

        if options.tuned:
            tuned.split(len(data), options.seed)  # too few rows is said before the model loads
        found = trained_rows(options) if found is ... else found
        trained_on = 0 if found is None else sum(row in found[0] for row in zip(data.texts, data.pairs or
                                                                                   [None] * len(data), strict=True))
        if trained_on:
            ctx.log(f"warning: {trained_on:,} of the {len(data):,} rows are rows the classifier was trained on: its "
                    "accuracy on them is inflated (leave out --data, or choose its held-out rows, to read it on rows "
                    "it never saw)")
        readout, tokenizer, names, limit, truncation, facts = load_classifier(options)
        labels = lens.label_ids(data.labels, names)
        limit = min(limit, options.max_length or limit)
        encoded = encode(tokenizer, data, limit, truncation)
        if encoded.truncated:
            ctx.log(f"note: {encoded.truncated:,} texts were cut to {limit} tokens ({truncation} kept)")
        device = str(readout.encoder.device)
        ctx.output()
        probs = lens.layer_probabilities(readout, encoded, tokenizer.pad_token_id, device, options.batch_size,
                                         ctx.progress)
        layers = lens.layer_table(probs, labels, names)
        examples = lens.example_table(probs, data.ids, data.texts, labels, names)
        tuned_frame = None
        if options.tuned:
            train_rows, held = tuned.split(len(data), options.seed)
            translators = tuned.train(readout, encoded, train_rows, tokenizer.pad_token_id, device,
                                      options.tuned_epochs, options.tuned_lr, options.batch_size, options.seed,
                                      ctx.progress, ctx.should_stop)
            moved = tuned.tuned_probabilities(readout, translators, encoded, held, tokenizer.pad_token_id, device,
                                              options.batch_size)
            tuned_frame = tuned.tuned_table(probs[held], moved, labels[held])
        facts = {**facts, "model": options.model, "model_spec": options.spec().resolved().to_dict(),
                 "data": str(options.data) if options.data is not None else found[2],
                 "rows_trained_on": None if found is None else trained_on, "text_column": options.text_column,
                 "pair_column": options.pair_column,
                 "label_column": options.label_column, "classes": names, "rows": len(data),
                 "layers": readout.num_layers, "max_length": limit, "truncation": truncation,
                 "options": options.model_dump(mode="json"),
                 "baseline": "majority_baseline: always the most frequent label of these rows",
                 "reading": "hub heads read h_l in place of h_L; a job's pooling head reads an early exit "
                            "(h_0..h_l, then h_l for every later layer)"}
        return ClassifierLensRun(layers, examples, tuned_frame, facts)
