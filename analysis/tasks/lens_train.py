"""``lens train``: a tuned lens for a model (:mod:`analysis.probe.lens_training`): config.json,
translators.safetensors, training.json and checkpoint.safetensors, written straight into the output folder, from
which a stopped or killed run resumes (``in_place``). Its job kind is the hand-written ``lens``
(:mod:`analysis.probe.job`: a cancelled job resumes from an earlier job's checkpoint)."""

from __future__ import annotations

from pathlib import Path

from analysis.core.task import Context, Result, RunRecord, Task
from analysis.probe.options import LensOptions

WRITTEN = "config.json, translators.safetensors, training.json"


class LensRun(Result):
    """The lens's files are in the output folder already (written as it trained); what to print of them."""

    def __init__(self, training: dict):
        self.training = training

    def write(self, out: Path) -> list[str]:
        from analysis.probe.lens_training import record_facts

        RunRecord("lens train", record_facts(self.training)).write(out)
        return [*WRITTEN.split(", "), "run.json"]

    def done_line(self, shown_out: str, written: list[str]) -> str:
        return f"wrote {shown_out}/{WRITTEN}"

    def summary(self) -> str:
        held = self.training["held_out"]
        states = self.training.get("states") or [[i, "output"] for i in range(len(held["raw"]["masked"]["kl"]))]
        width = 15 if "states" in self.training else 5  # "3 attention": a lens of both halves names each half
        lines = [f"{'layer':<{width}}  held-out KL to final (masked)  raw -> tuned   top-1 agreement  raw -> tuned"]
        for (layer, half), kr, kt, ar, at in zip(states, held["raw"]["masked"]["kl"], held["tuned"]["masked"]["kl"],
                                                 held["raw"]["masked"]["agreement"],
                                                 held["tuned"]["masked"]["agreement"], strict=True):
            name = f"{layer}" + (" attention" if half == "attention" else "")
            lines.append(f"{name:{'<' if 'states' in self.training else '>'}{width}}  {kr:>22.4f} -> {kt:<10.4f}  "
                         f"{ar:>15.4f} -> {at:.4f}")
        return "\n".join(lines)


class LensTrain(Task):
    name = "lens train"
    help = "train a tuned lens (resumes when --out holds one stopped with the same options)"
    description = ("Train one affine translator per layer so that the MLM head reads each layer as the final layer's "
                   "distribution (KL at masked positions). Writes config.json, translators.safetensors, "
                   "training.json and checkpoint.safetensors (the one file a stopped or killed run resumes from) to "
                   "--out.")
    writes = f"the lens is written there ({WRITTEN})"
    Options = LensOptions
    kind = "lens"  # its job kind: the hand-written one (resumes from an earlier job's checkpoint)
    model_flags = False  # its model flags are its own options' (no --head-from: a lens reads the model's own head)
    config_file = True
    in_place = True
    page = "pages/1_Reconstruction.py"  # its form: "Train a tuned lens for this model (a background job)"
    example = {"corpus": "demo", "steps": 4, "eval_texts": 32}
    unit = "step"

    def run(self, options: LensOptions, ctx: Context) -> LensRun | None:
        from analysis.probe import lens_training
        from models.loading import load_model

        texts = lens_training.read_corpus(options)
        loaded = load_model(options.spec())
        out = ctx.output()
        training = lens_training.train(loaded, texts, options, out,
                                       progress=lambda step, total, losses: ctx.progress("training the lens", step,
                                                                                         total),
                                       should_stop=ctx.should_stop, log=ctx.log)
        return None if training is None else LensRun(training)
