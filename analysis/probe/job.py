"""The ``lens`` job kind (:mod:`jobs.kinds`): train a tuned lens (:mod:`analysis.probe.lens`).

Checked at submit (:func:`validate`): the options (:class:`analysis.probe.options.LensOptions`), the texts (more
than ``eval_texts``), the model's config and its own MLM head. Run (:func:`run`):
:func:`analysis.probe.lens_training.train`,
its checkpoints straight in the artifacts (``STAGED`` False), so a cancelled job resumes. This module never imports
``jobs``: the browser's check, the model-config reader, the log, the progress reporter and the stop request are
passed in.
"""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError
from analysis.core.task import RunRecord
from analysis.probe.options import LensOptions

NAME = "lens"
OPTIONS = LensOptions
STAGED = False  # checkpoints go straight to the artifacts (to resume), file by file
OPENED_ON = ("pages/1_Reconstruction.py", "its lens is offered under 'Tuned lens'")


def label(config: dict) -> str:
    """What the store and the pages call the job's work."""
    return "tuned lens"


def describe(config: dict) -> list[str]:
    """The job name's parts after its label and model: the texts and the steps (``demo set · 250 steps``)."""
    corpus = str(config.get("corpus") or "")
    return ["demo set" if corpus == "demo" else corpus[3:] if corpus.startswith("hf:") else Path(corpus).name,
            f"{config.get('steps')} steps"]


def validate(config: dict, browser, model_config) -> tuple[dict, str]:
    """(the options to store, with ``kind``, the device the job will run on); a refusal is an :class:`InputError`,
    a ``ModelLoadError`` or a ``ValueError`` whose message says why. ``browser``: None, or the browser's check of
    the options (``browser(options)``), applied before anything is read; ``model_config(spec)``: the model's
    (config, family), or a ``ModelLoadError``."""
    from analysis.probe.lens_training import read_corpus
    from models.loading import has_own_mlm_head

    options = LensOptions(**{k: v for k, v in config.items() if k != "kind"})
    if browser:
        options = browser(options)
    texts = read_corpus(options)
    if len(texts) <= options.eval_texts:
        raise InputError(f"{len(texts)} texts: a lens needs more than eval_texts={options.eval_texts}")
    spec = options.spec().resolved()
    model_config(spec)
    if not has_own_mlm_head(spec):
        raise InputError(f"'{spec.name}' has no MLM head of its own: a tuned lens is read through one")
    return {"kind": NAME, **options.to_dict()}, spec.device


def run(config: dict, out: Path, control) -> dict:
    """A tuned-lens job: :func:`analysis.probe.lens_training.train` with its progress through ``control.reporter()``.
    Cancel (``control.listen()``: its SIGTERM recorded) stops it after the current step with a checkpoint in the
    artifacts, and the process exits with status 1; a later job of the same options (and weights and texts)
    resumes from the furthest such checkpoint of the earlier jobs (``control.earlier``)."""
    from analysis.probe import lens_training
    from models.loading import load_model

    options = LensOptions(**{k: v for k, v in config.items() if k != "kind"})
    control.listen()
    loaded = load_model(options.spec())
    texts = lens_training.read_corpus(options)
    control.log(f"model: {loaded.spec.name} ({loaded.num_layers} layers) on {loaded.spec.device}; {len(texts):,} "
                "texts")
    report = control.reporter()

    def progress(step, total, losses):
        report(f"step {step}/{total}: KL summed over layers {sum(losses):.4f}",
               {"step": step, "total_steps": total, "loss": sum(losses)}, force=step == total)

    training = lens_training.train(loaded, texts, options, out, progress, should_stop=control.stopped, log=control.log,
                          earlier=control.earlier)
    if training is None:
        raise SystemExit(1)  # the worker records the cancel
    held = training["held_out"]
    RunRecord("lens train", lens_training.record_facts(training)).write(out)  # what `layerlens lens train` writes
    control.log("held-out KL to the final layer (masked positions), raw -> tuned: " + ", ".join(
        f"{r:.3f}->{t:.3f}" for r, t in zip(held["raw"]["masked"]["kl"], held["tuned"]["masked"]["kl"], strict=True)))
    return {"kind": NAME, "steps": training["steps"], "held_out": held, "seconds": training["seconds"]}
