"""The ``heads`` job kind (:mod:`jobs.kinds`): one corpus action of the attention-heads analysis (stats, parse or
importance, :mod:`analysis.heads.actions`) in the background, writing the files ``layerlens heads ACTION`` writes
and a ``run.json``.

Checked at submit (:func:`validate`): the options (:class:`analysis.heads.options.HeadsJobOptions`), the action's
one input (read whole as the job will read it: a malformed line is refused now) and the model's config. Cancel
stops it at the next batch or pruning step. A cancelled job keeps what it computed under
``LAYERLENS_HOME/cache/heads_progress``: a stats or parse job its sums (:func:`analysis.heads.run.analyse`), an
importance job its gate gradient and each scored set of masked heads (:class:`analysis.heads.importance.Scores`).
The same options submitted again go on from there and give the numbers an uninterrupted job gives. This module
never imports ``jobs``.
"""

from __future__ import annotations

from pathlib import Path

from analysis.core.home import cache_dir
from analysis.core.inputs import InputError
from analysis.core.task import RunRecord
from analysis.heads.options import HeadsJobOptions

NAME = "heads"
RESUME = "heads_progress"  # the folder under LAYERLENS_HOME/cache of a cancelled job's sums
OPTIONS = HeadsJobOptions
STAGED = True  # one process; the artifacts appear whole when complete
BROWSER_FILES = ("input", "treebank", "data")  # from the browser: files under the data roots
LABELS = {"stats": "head statistics", "parse": "heads as parsers", "importance": "head importance"}


def label(config: dict) -> str:
    """What the store and the pages call the job's work."""
    return LABELS.get(str(config.get("action")), "attention heads")


def describe(config: dict) -> list[str]:
    """The job name's parts after its label and model: the input file."""
    source = config.get("input") or config.get("treebank") or config.get("data")
    return [Path(str(source)).name] if source else []


def _options(config: dict) -> HeadsJobOptions:
    return HeadsJobOptions(**{k: v for k, v in config.items() if k != "kind"})


def _read(options: HeadsJobOptions):
    """The action's input as the job reads it."""
    from analysis.core.inputs import read_file
    from analysis.heads import actions

    name, path = options.source()
    if name == "treebank":
        return actions.read_treebank(path, options.limit, "treebank")
    if name == "data":
        if not Path(path).expanduser().is_file():
            raise InputError(f"labelled set {path}: no such file")
        return read_file(Path(path).expanduser(), options.text_column, options.pair_column, options.limit,
                         label_column=options.label_column)
    source = actions.read_corpus(path, options.text_column, options.limit, "input")
    if options.action == "importance" and not hasattr(source, "texts"):
        raise InputError(f"importance reads texts (the MLM loss) or a labelled set, not a treebank: {path}")
    return source


def validate(config: dict, browser, model_config) -> tuple[dict, str]:
    """(the options to store, with ``kind``, the device the job will run on); a refusal is an :class:`InputError`,
    a ``ModelLoadError`` or a ``ValueError`` whose message says why. ``browser``: None, or the browser's check of
    the options (the input a file under the data roots, the model a hub id or a folder under the model roots),
    applied before anything is read; ``model_config(spec)``: the model's (config, family)."""
    options = _options(config)
    if browser:
        options = browser(options, files=BROWSER_FILES)
    try:
        _read(options)
    except OSError as exc:
        raise InputError(str(exc)) from None
    spec = options.spec().resolved()
    model_config(spec)
    device = "cpu" if options.action == "importance" and options.data else spec.device
    return {"kind": NAME, **options.to_dict()}, device


def run(config: dict, out: Path, control) -> dict:
    """A heads job: the action on the job's options, its progress through ``control.reporter()`` (``stage``,
    ``step`` of ``total_steps`` within it) and ``control.log``; Cancel (``control.listen()``) stops it at the next
    progress report (``control.check()`` raises). The action's files and ``run.json`` go to ``out``. Returns
    the job's metrics: what ``run.json`` says beside the files."""
    from analysis import versions
    from analysis.heads import actions
    from analysis.heads.model import load_eager

    options = _options(config)
    control.listen()
    report = control.reporter()

    def progress(stage: str, done: int, total: int) -> None:
        control.check()
        report(f"{stage}: {done} of {total}", {"stage": stage, "step": done, "total_steps": total,
                                               "fraction": done / max(total, 1)}, force=done == total)

    name, path = options.source()
    control.log(f"heads {options.action} of {options.model} on {path}")
    if options.action == "importance":  # it reads its input itself (a labelled set's classifier on the CPU)
        output = actions.importance(
            options.spec(), texts=Path(path) if name == "input" else None, data=Path(path) if name == "data" else None,
            column=options.text_column, label_column=options.label_column, pair_column=options.pair_column,
            limit=options.limit, batch_size=options.batch_size, mask_prob=options.mask_prob, seed=options.seed,
            steps=options.steps, drop=options.drop, progress=progress, resume=cache_dir() / RESUME,
            random_orders=options.random_orders)
    else:
        source = _read(options)
        loaded = load_eager(options.spec())
        resume = cache_dir() / RESUME
        if options.action == "stats":
            output = actions.stats(loaded, source, clusters=options.clusters, cluster_tokens=options.cluster_tokens,
                                   seed=options.seed, batch_size=options.batch_size, progress=progress, resume=resume)
        else:
            wanted = [r.strip() for r in options.relations.split(",") if r.strip()] if options.relations else None
            output = actions.parse(loaded, source, wanted, batch_size=options.batch_size, progress=progress,
                                   resume=resume, reading=options.reading, symmetry=options.tree,
                                   min_count=options.min_count)
    if said := note({"action": options.action, **output.info}):  # the words the jobs table shows, in the log too
        control.log(said)
    output.write(out)
    info = {"action": options.action, **output.model, "options": options.to_dict(), name: path, **output.info,
            "versions": versions()}
    RunRecord(f"heads {options.action}", info).write(out)
    control.log(f"wrote {', '.join(output.files)}, run.json")
    return {"kind": NAME, "action": options.action, "files": list(output.files),
            **{k: v for k, v in output.info.items() if k in ("base_accuracy", "best_tree", "layers", "heads",
                                                             "resumed_after")}}


UNITS = {"attention": "sentences", "importance": "batches", "pruning": "passes", "layers": "layers"}


def stage(progress: dict) -> str:
    """``attention: 120 of 300 sentences · 40% of the job``: where a running heads job is (its progress)."""
    p = progress or {}
    if not p:
        return ""
    name = p.get("stage", "")
    return (f"{name}: {p.get('step', 0)} of {p.get('total_steps', '?')} {UNITS.get(name, 'steps')} · "
            f"{p.get('fraction', 0):.0%} of the job")


def note(metrics: dict) -> str:
    """What a finished heads job adds to its row: ``resumed after 4 passes`` when it went on from a cancelled
    job's resume file."""
    done = (metrics or {}).get("resumed_after")
    if not done:
        return ""
    unit = "passes (the gate gradients, then scored sets of masked heads)" if metrics.get("action") == "importance" \
        else "sentences summed"
    return f"resumed after {done} {unit} of an earlier job"
