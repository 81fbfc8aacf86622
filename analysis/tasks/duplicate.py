"""``duplicate``: a deeper model made of the pre-trained layers (Kao et al. 2020 §3), exported as a checkpoint (its
``duplication.json`` says the plan), and optionally probed (``preview/layers.csv``) and swept (``sweep.csv``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from analysis.core.csvout import to_csv
from analysis.core.inputs import InputError
from analysis.core.options import path
from analysis.core.task import Context, ReadingOptions, Result, RunRecord, Task
from models.spec import DTYPE_NAMES

SAVE_DTYPES = ("source", *(d for d in DTYPE_NAMES if d != "auto"))


class DuplicateOptions(ReadingOptions):
    """The model block, one plan (the paper's first-k, an explicit plan, or ALBERT's depth) and what to measure."""

    duplicate_first: int | None = Field(None, ge=0, json_schema_extra={"browser_max": 64},
                                        title="duplicate first", description="the paper's plan: copy "
                                        "each of the first K layers right after itself (L -> L + K)")
    plan: str | None = Field(None, min_length=1, title="plan", description="0-based source layer of each new "
                             "layer, e.g. 0,0,1,1,2,2,3,4,5")
    depth: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 96},
                              title="depth", description="ALBERT: apply the shared layer this many "
                              "times")
    preview_input: Path | None = Field(None, json_schema_extra=path("data"),
                                       title="preview texts", description="texts to probe the deeper model "
                                       "on (writes preview/)")
    column: str = Field("text", min_length=1, title="text column", description="text column of --preview-input "
                        "(csv/tsv/jsonl)")
    sweep: bool = Field(False, title="sweep", description="final-layer accuracy for K = 0..L duplicated layers on "
                        "--preview-input (writes sweep.csv)")
    save_dtype: Literal[SAVE_DTYPES] = Field("source", title="save dtype", description="dtype of the saved model "  # type: ignore[valid-type]
                                            "(default: the source checkpoint's own, whatever --dtype it is computed "
                                            "in; in duplication.json)")

    @model_validator(mode="after")
    def _one_plan(self):
        given = [name for name in ("duplicate_first", "plan", "depth") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"give one plan: {' or '.join(given)}, not both")
        if self.sweep and self.preview_input is None:
            raise ValueError("--sweep needs --preview-input (the texts to probe)")
        return self


class DuplicateRun(Result):
    def __init__(self, plan_line: str, layers, table, out: Path, loads: str):
        self.plan_line, self.layers, self.table, self.out, self.loads = plan_line, layers, table, out, loads

    def write(self, out: Path) -> list[str]:
        written = []
        if self.layers is not None:
            (out / "preview").mkdir(exist_ok=True)
            to_csv(self.layers, out / "preview" / "layers.csv")
            written.append("preview/layers.csv")
        if self.table is not None:
            to_csv(self.table, out / "sweep.csv")
            written.append("sweep.csv")
        RunRecord("duplicate", {"plan": self.plan_line, "loads": self.loads}).write(out)  # report reads it (item 13)
        return [*written, "run.json"]

    def summary(self) -> str:
        parts = [self.plan_line] + [frame.to_string(index=False, float_format=lambda x: f"{x:.4f}")
                                    for frame in (self.layers, self.table) if frame is not None]
        return "\n".join(parts)

    def done_line(self, shown_out: str, written: list[str]) -> str:
        return f"wrote {shown_out} ({self.loads})"


class Duplicate(Task):
    name = "duplicate"
    help = "layer duplication: a deeper model from the pre-trained layers, without training"
    writes = "the deeper model is saved there"
    Options = DuplicateOptions
    example = {"duplicate_first": 2}
    page = "pages/4_Layer_Duplication.py"
    exclusive_optional = ("duplicate_first", "plan", "depth")

    def run(self, options: DuplicateOptions, ctx: Context) -> DuplicateRun:
        from analysis.core.inputs import read_file
        from analysis.duplication.export import export, loads_with
        from analysis.duplication.plan import check_depth, duplicate_first, parse_plan, preview
        from analysis.probe.reconstruction import probe
        from analysis.tasks.duplication import sweep
        from models.loading import config_and_family, load_model

        inputs = read_file(options.preview_input, options.column) if options.preview_input else None
        spec = options.spec()
        config, family = config_and_family(spec)  # the plan is checked before the weights are loaded
        albert, layers = family == "albert", config.num_hidden_layers
        if options.depth is not None:
            if not albert:
                raise InputError("--depth is for ALBERT (one shared layer); use --duplicate-first or --plan")
            plan = [0] * check_depth(options.depth, layers)
        elif options.plan is not None:
            if albert:
                raise InputError("ALBERT shares one layer across depth: give --depth N instead of a plan")
            plan = parse_plan(options.plan, layers)
        else:
            plan = duplicate_first(layers, options.duplicate_first or 0)
        loaded = load_model(spec)
        out = ctx.output()
        export(loaded, plan, out, dtype=None if options.save_dtype == "source" else options.save_dtype)
        line = f"plan ({len(plan)} layers): {','.join(map(str, plan)) if not albert else f'shared x {len(plan)}'}"
        result = probe(preview(loaded, plan), inputs).layers if inputs is not None else None
        table = sweep(loaded, inputs) if options.sweep else None
        return DuplicateRun(line, result, table, out, loads_with(out))
