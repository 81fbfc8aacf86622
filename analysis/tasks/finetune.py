"""``finetune``: fine-tune a layer-pooling classifier head and the encoder on labelled data
(:func:`analysis.training.finetune.run_options`): metrics.json, predictions.csv, checkpoint/, run.json, ... Its
options resolve through presets and the model's defaults (:func:`analysis.training.options.resolve`: the schema's
defaults, then the model's, then the preset's, then a ``--config`` file's, then the typed flags). Its job kind is the
hand-written ``finetune`` (:mod:`analysis.training.job`: the jobs page's epochs, losses and sweeps)."""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError
from analysis.core.task import Context, Result, Task
from analysis.training.options import FinetuneOptions


class FinetuneRun(Result):
    """The run's files are in the output folder already (written as it trained); its metrics to print."""

    def __init__(self, metrics: dict, out: Path):
        self.metrics, self.out = metrics, out

    def write(self, out: Path) -> list[str]:
        return sorted(f"{p.name}/" if p.is_dir() else p.name for p in Path(out).iterdir())  # all that is there

    def done_line(self, shown_out: str, written: list[str]) -> str:
        return f"wrote {shown_out}/: {', '.join(written)}"

    def summary(self) -> str:
        m = self.metrics
        std = f" ± {m['accuracy_std']:.4f}" if "accuracy_std" in m else ""
        base = m.get("baseline") or {}
        return (f"{m.get('evaluated_on', '')} accuracy {m.get('accuracy', float('nan')):.4f}{std} (majority class "
                f"{base.get('accuracy', float('nan')):.4f}), macro-F1 {m.get('macro_f1', float('nan')):.4f}; head "
                f"parameters {m['head_trainable_parameters']:,}"
                + ("; every prediction is one class" if m.get("one_class") else ""))


class Finetune(Task):
    name = "finetune"
    help = "fine-tune a layer-pooling classifier head and the encoder on labelled data"
    writes = "fine-tuning writes metrics.json, predictions.csv, checkpoint/, ..."
    Options = FinetuneOptions
    model_flags = False  # the model block is the schema's own (no --head-from, no shared --batch-size)
    config_file = True
    page = "pages/5_Fine_Tune_Jobs.py"
    example = {"train": "demo", "head": "cls", "epochs": 1}
    unit = "step"

    def build(self, values: dict) -> FinetuneOptions:
        """Resolved as every fine-tuning run is: schema, model, preset, then what was given."""
        from analysis.training.options import resolve

        return resolve(values)

    def run(self, options: FinetuneOptions, ctx: Context) -> FinetuneRun | None:
        from analysis.core.parallel import is_main_process
        from analysis.training.finetune import run_options

        if not options.train:
            raise InputError("--train is required (a file, 'demo', or hf:NAME[/CONFIG]:SPLIT)")
        if options.backend != "local":
            raise InputError(f"backend {options.backend} is where a job runs: queue it with `layerlens jobs submit "
                             "--config FILE` (finetune runs here, now)")

        def progress(event, state, control):
            if event == "step":
                ctx.progress("fine-tuning", state.step, state.total_steps)
            else:
                h = state.history[-1]
                ctx.log(f"epoch {h['epoch']}: val loss {h['val_loss']:.4f}, accuracy {h['val_accuracy']:.4f}, "
                        f"macro-F1 {h['val_macro_f1']:.4f}")

        main = is_main_process()
        # under a launcher the main process writes; the others train with it, and are given the folder asked for
        out = ctx.output() if main else getattr(ctx, "out", None)
        try:
            metrics = run_options(options, out, [progress] if main else [], log=ctx.log if main else lambda s: None)
        except ValueError as exc:  # a head that does not fit this model
            raise InputError(str(exc)) from None
        return FinetuneRun(metrics, out) if main else None
