"""The ``structure`` job kind (:mod:`jobs.kinds`): probe each layer for linguistic structure
(:func:`analysis.structure.run.run_structure`), writing the five files the CLI writes.

Checked at submit (:func:`validate`): the options (:class:`analysis.structure.options.StructureJobOptions`), the
two treebanks (read whole: a malformed line is refused now, naming it), the labelled set if any, the layers and
rank against the model's config. This module never imports ``jobs``: the browser's check, the model-config
reader, the log, the progress reporter and the stop request are passed in.
"""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError
from analysis.structure.options import StructureJobOptions

NAME = "structure"
OPTIONS = StructureJobOptions
STAGED = True  # one process; the artifacts appear whole when complete
OPENED_ON = ("pages/6_Linguistic_structure.py", "open it under 'Open a finished job'")


def label(config: dict) -> str:
    """What the store and the pages call the job's work."""
    return "linguistic structure"


def describe(config: dict) -> list[str]:
    """The job name's parts after its label and model: the tasks and the two treebanks (``pos, dep · a → b``)."""
    return [str(config.get("tasks", "")).replace(",", ", "),
            Path(str(config.get("train"))).name + " → " + Path(str(config.get("test"))).name]


def validate(config: dict, browser, model_config) -> tuple[dict, str]:
    """(the options to store, with ``kind``, the device the job will run on); a refusal is an :class:`InputError`,
    a ``ModelLoadError`` or a ``ValueError`` whose message says why. ``browser``: None, or the browser's check of
    the options (``browser(options)``: the treebanks and the labelled set files under the
    data roots, the model a hub id or a folder under the model roots), applied before anything is read;
    ``model_config(spec)``: the model's (config, family), or a ``ModelLoadError``."""
    from analysis.core.layers import parse_layers
    from analysis.core.treebank import read_conllu
    from analysis.structure.options import check_rank

    options = StructureJobOptions(**{k: v for k, v in config.items() if k != "kind"})
    if browser:
        options = browser(options)
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
    loaded_config, _ = model_config(spec)
    n_states = loaded_config.num_hidden_layers + 1
    parse_layers(options.layers, n_states)
    if options.tree_layers.strip().lower() != "none":
        parse_layers(options.tree_layers, n_states)
    if set(options.task_list) & {"distance", "depth"}:
        check_rank(options.rank, loaded_config.hidden_size)
    return {"kind": NAME, **options.to_dict()}, spec.device


def phases(options) -> list[str]:
    """The stages a structure run reports, in order (:func:`analysis.structure.run.run_structure`): the word
    vectors of each file, the labelled texts when given, then the probes."""
    return ["train word vectors", "test word vectors", *(["labelled texts"] if options.label_data else []), "probes"]


def run(config: dict, out: Path, control) -> dict:
    """A linguistic-structure job: :func:`analysis.structure.run.run_structure` on the job's options, its progress
    through ``control.reporter()`` (``stage``, ``step`` of ``total_steps`` within it, ``fraction`` of the whole:
    each stage an equal share) and ``control.log``; Cancel (``control.listen()``: its SIGTERM recorded) stops it
    at the next progress report (``control.check()`` raises). The five files go to ``out``
    (:func:`analysis.structure.output.write_outputs`, as the CLI writes them). Returns the job's metrics: where each
    task lives (``summary.csv``'s rows) and what was scored."""
    from analysis.core.inputs import read_file
    from analysis.core.treebank import read_conllu
    from analysis.structure.output import run_info, write_outputs
    from analysis.structure.run import run_structure
    from models.loading import load_model

    options = StructureJobOptions(**{k: v for k, v in config.items() if k != "kind"})
    control.listen()
    train = read_conllu(options.train, options.max_sentences)
    test = read_conllu(options.test, options.max_sentences)
    labelled = (read_file(Path(options.label_data), options.text_column, options.pair_column,
                          label_column=options.label_column) if options.label_data else None)
    loaded = load_model(options.spec())
    say = control.log
    say(f"model: {loaded.spec.name} ({loaded.num_layers} layers) on {loaded.spec.device}; train {train.path} "
        f"({len(train.sentences):,} sentences), test {test.path} ({len(test.sentences):,} sentences); tasks "
        f"{options.tasks}")
    report = control.reporter()
    stages = phases(options)

    def progress(stage: str, done: int, total: int) -> None:
        control.check()
        name = next((p for p in stages if stage.startswith(p)), stage)
        phase = stages.index(name) if name in stages else len(stages) - 1
        fraction = (phase + done / max(total, 1)) / len(stages)
        line = (f"probes: {done} of {total} steps (fits, MDL blocks, structural epochs)" if stage == "probes" else
                f"{stage}: {done} of {total} {'texts' if name == 'labelled texts' else 'sentences'}")
        report(line, {"stage": stage, "step": done, "total_steps": total, "fraction": fraction}, force=done == total)

    result = run_structure(loaded, train, test, options.analysis(), progress=progress, labelled=labelled,
                           label_pooling=options.label_pooling)
    write_outputs(result, out, run_info(result, loaded, label_data=options.label_data))
    for name in ("train", "test"):
        info = result.info[name]
        if info["dropped_too_long"] + info["dropped_no_subword"]:
            say(f"{name}: dropped {info['dropped_too_long']} sentence(s) longer than the model's "
                f"{result.info['max_tokens']} tokens (special tokens included) and {info['dropped_no_subword']} "
                f"with a word that has no subword, of {info['sentences']} (ids in run.json)")
    say(f"word vector: {result.info['word_vector_text']}")
    say(f"summary intervals: {result.info['summary_interval']}")
    for row in result.summary.to_dict("records"):
        say(f"{row['task']}: best layer {row['best_layer']} ({row['metric']} {row['best_score']:.4f}), center of "
            f"gravity {row['center_of_gravity']:.2f}")
    return {"kind": NAME, "summary": control.json_safe(result.summary.to_dict("records")),
            "test_sentences_scored": result.info["test_sentences_scored"],
            "word_vector": result.info["word_vector"]}


def stage(progress: dict) -> str:
    """``probes: 3 of 20 steps · 72% of the job``: where a running structure job is."""
    p = progress or {}
    if not p:
        return ""
    stage = p.get("stage", "")
    unit = "steps" if stage == "probes" else "texts" if stage.startswith("labelled") else "sentences"
    return f"{stage}: {p.get('step', 0)} of {p.get('total_steps', '?')} {unit} · {p.get('fraction', 0):.0%} of the job"
