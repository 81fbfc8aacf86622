"""The options schemas' shared core: one pydantic base and the blocks every technique composes.

Each technique defines ONE schema of its options (``training/options.py``, ``probe/options.py``,
``structure/options.py``, ``tokens/options.py``), composed by inheritance from :class:`ModelOptions` (which
checkpoint, where it runs, in which dtype) and, for jobs, :class:`PlacementOptions` (which backend). Everything
else is derived from a schema: the CLI flags (:func:`cli.common.add_option_flag`), config files, a job's stored
JSON, the page forms (:mod:`ui.options`) and the README's option tables (:func:`markdown_table`).

pydantic does the type checks and coercion (``"3"`` is 3, ``"abc"`` is an error naming the option), because a
config file, a job's JSON and a form all arrive as loosely typed values and argparse only covers one of them; its
errors are rewritten into one readable :class:`InputError` (:func:`describe`). This module imports neither torch
nor transformers (the CLI's parsers are built from the schemas, and ``layerlens jobs`` stays fast).
"""

from __future__ import annotations

import typing
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from analysis.core.inputs import InputError
from models.spec import DEMO_NAME, DEVICES, DTYPE_NAMES, SUGGESTED_MODELS

MAX_SEED = 2**32 - 1  # numpy's and scikit-learn's random_state take no more
TRUNCATIONS = ("head", "tail", "head+tail")  # which tokens a text over the length limit keeps
POOLINGS = ("cls", "mean", "model")  # a sentence vector: [CLS], the mean of the tokens, a sentence encoder's own
METHODS = ("pca", "umap", "tsne")  # 2-D projections
BACKENDS = ("local", "slurm")  # where a job runs (jobs.backends)
Truncation = Literal[TRUNCATIONS]  # type: ignore[valid-type]
Dtype = Literal[DTYPE_NAMES]  # type: ignore[valid-type]
PRECISIONS = ("float32", "certified")  # analysis.core.precision: the MLM head's vocabulary product
HALVES = ("output", "attention")  # analysis.core.activations.hidden_states: which states are read
HALF_HELP = ("which states are read: 'output' the embeddings and each layer's output (L + 1 states); 'attention' "
             "also the residual stream after each layer's attention block, before its feed-forward block (2L + 1 "
             "states, two per layer)")


FREE = {"cost": "none"}  # the json_schema_extra of a number option whose size costs no work nor disk (a seed, an index)
PATH_KINDS = {
    "data": "a data file: 'demo', a hub dataset name (hf:NAME:SPLIT) or a file under the data roots",
    "model": "a model: a hub id, 'demo', random:NAME or a folder under the model roots",
    "models": "models: a folder of checkpoints, MODEL@rev1,rev2 or A,B,C, each under the model roots",
    "store": "a folder LayerLens wrote under LAYERLENS_HOME (an extraction's vectors, a run's folder)",
    "output": "a file LayerLens writes under LAYERLENS_HOME/exports",
}


def path(kind: str) -> dict:
    """The ``json_schema_extra`` of an option that names a path (a file, a folder or a model): ``kind`` is one of
    :data:`PATH_KINDS`, which says where a job from the browser may point it (:func:`jobs.submit.browser_checked`);
    every such option is marked, so the browser's check is derived from the schema, never from a list per kind."""
    assert kind in PATH_KINDS, kind
    return {"path": kind}


class Options(BaseModel):
    """A schema whose validation errors are one readable :class:`InputError` naming each bad option."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    # option -> why a page's job form does not offer it (issue 53 item 3: every other option of a job a page submits
    # is on its form; tests/integration/test_job_forms.py). A schema adds its own; :meth:`kept_from_browser` merges.
    browser_kept: ClassVar[dict[str, str]] = {}

    @classmethod
    def kept_from_browser(cls) -> dict[str, str]:
        """Every option of this schema kept from the browser's job forms, with its reason (its bases' too)."""
        out: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            out.update(vars(klass).get("browser_kept", {}))
        return {name: why for name, why in out.items() if name in cls.model_fields}

    def __init__(self, **values):
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise InputError(describe(exc, type(self))) from None

    def to_dict(self) -> dict:
        return self.model_dump()

    @classmethod
    def from_dict(cls, d: dict):
        return cls(**{k: v for k, v in d.items() if k in cls.model_fields})

    def replace(self, **changes):
        """A validated copy with ``changes`` (``dataclasses.replace`` for these schemas)."""
        return type(self)(**{**self.model_dump(), **changes})


class ModelOptions(Options):
    """The model block every technique's schema starts with: which checkpoint, where it runs, in which dtype."""

    browser_kept: ClassVar[dict[str, str]] = {
        "device": "a job runs on its machine's own device (auto: the job machine's GPU when it has one), not one "
                  "chosen in the browser",
        "allow_pickle": "pickle weights can run code when loaded: a job from the browser never loads them (the "
                        "CLI's --allow-pickle)"}

    model: str = Field(DEMO_NAME, min_length=1, json_schema_extra=path("model"),
                       title="model", description="hub id, local save_pretrained "
                       "directory, or 'demo'; e.g. " + ", ".join(SUGGESTED_MODELS[1:]) + "; random:NAME is NAME's "
                       "architecture with seeded random weights (the control)")
    revision: str | None = Field(None, title="revision", description="hub branch, tag or commit")
    device: str = Field("auto", pattern=rf"^({'|'.join(DEVICES)})(:\d+)?$", title="device",
                        description="auto: cuda, then mps, then cpu")
    dtype: Dtype = Field("auto", title="dtype", description="compute dtype; training keeps float32 master weights")
    allow_pickle: bool = Field(False, title="allow pickle", description="also load pickle (.bin) weights; only "
                               "for sources you trust")

    def spec(self):
        """The :class:`models.spec.ModelSpec` these options name."""
        from models.spec import ModelSpec

        return ModelSpec(self.model, revision=self.revision, device=self.device, dtype=self.dtype,
                         allow_pickle=self.allow_pickle)


class PlacementOptions(Options):
    """Where a job runs (:mod:`jobs.backends`): this machine's worker, or one Slurm job through submitit."""

    backend: Literal[BACKENDS] = Field("local", title="runs on",  # type: ignore[valid-type]
                                       description="jobs: local (this machine's worker) or slurm (one Slurm job "
                                       "through submitit; LAYERLENS_HOME shared with the cluster)")
    slurm_partition: str | None = Field(None, title="Slurm partition", description="jobs on slurm: the "
                                        "partition (default: the cluster's)")
    slurm_time: int = Field(120, ge=1, le=10080, title="Slurm time limit (min)", description="jobs on slurm: "
                            "minutes before Slurm stops the job")
    slurm_gpus: int = Field(1, ge=0, le=16, title="Slurm GPUs", description="jobs on slurm: GPUs per job (0: "
                            "CPU only)")


def text_column():
    """The text column's field, the same in every schema that reads a table."""
    return Field("text", min_length=1, title="text column")


def max_length_field(lowest: int = 2):
    """The length limit's field, the same in every engine schema that reads texts (None: the model's limit)."""
    return Field(None, ge=lowest, json_schema_extra={"browser_max": 8192}, title="max length",
                 description="cut texts to this many tokens (default: the model's limit)")


def batch_size_field():
    """Texts per forward pass (memory only: the numbers never depend on it)."""
    return Field(32, ge=1, json_schema_extra={"browser_max": 256}, title="batch size",
                 description="texts per forward pass")


def pair_column():
    return Field(None, title="second text column", description="the aspect (ABSA) or hypothesis (NLI)")


def label_column():
    return Field("label", min_length=1, title="label column")



def describe(exc: ValidationError, schema: type[BaseModel]) -> str:
    """One line naming each bad option, e.g. ``epochs (epochs): must be at least 1, got 0``."""
    messages = {"greater_than_equal": "must be at least {ge}", "greater_than": "must be greater than {gt}",
                "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
                "int_parsing": "expected a whole number", "int_from_float": "expected a whole number",
                "float_parsing": "expected a number", "bool_parsing": "must be true or false",
                "literal_error": "must be one of {expected}", "string_too_short": "must not be empty",
                "string_pattern_mismatch": "must match {pattern}", "extra_forbidden": "unknown option",
                "string_type": "expected text", "int_type": "expected a whole number",
                "float_type": "expected a number", "bool_type": "must be true or false",
                "finite_number": "must be a finite number"}
    parts = []
    for err in exc.errors():
        if err["type"] == "value_error" and not err["loc"]:  # a check across options: its message is whole
            parts.append(str(err["ctx"]["error"]))
            continue
        name = str(err["loc"][0]) if err["loc"] else "options"
        field = schema.model_fields.get(name)
        label = f"{name} ({field.title})" if field is not None and field.title and field.title != name else name
        template = messages.get(err["type"])
        text = template.format(**err.get("ctx", {})) if template else err["msg"]
        parts.append(f"{label}: {text}, got {err['input']!r}" if err["type"] != "extra_forbidden" else
                     f"{text} {name}")
    return "; ".join(parts)


def field_info(name: str, schema: type[BaseModel]):
    return schema.model_fields[name]


def bounds(name: str, schema: type[BaseModel]) -> tuple[float | None, float | None]:
    """(lowest, highest) value a number option accepts, inclusive where the schema says so (None: open)."""
    low = high = None
    for m in field_info(name, schema).metadata:
        low = getattr(m, "ge", None) if getattr(m, "ge", None) is not None else low
        high = getattr(m, "le", None) if getattr(m, "le", None) is not None else high
    return low, high


MAX_SERVER_TEXTS = 2000  # texts (sentences) a page runs through a model in the server process, per run


def max_server_texts() -> int:
    """The most texts (sentences) a page passes through a model in the server process per run, a pass over N texts
    counting N (``LAYERLENS_MAX_SERVER_TEXTS``, default :data:`MAX_SERVER_TEXTS`): above it the page offers a job,
    which runs in a process of its own (issue 43, item 13)."""
    from analysis.core.textfiles import setting

    return setting("LAYERLENS_MAX_SERVER_TEXTS", MAX_SERVER_TEXTS)


def path_fields(schema: type[BaseModel]) -> dict[str, str]:
    """``{option: its path kind}`` of every option of ``schema`` that names a path (:func:`path`)."""
    return {name: (info.json_schema_extra or {})["path"] for name, info in schema.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and "path" in info.json_schema_extra}


def browser_bounds(name: str, schema: type[BaseModel]) -> tuple[float | None, float | None]:
    """:func:`bounds` as a job from the browser may use them: the highest lowered to the field's ``browser_max``
    where the schema gives one (a worker shared by every browser session should not take a million-token head
    map from one form; the CLI keeps the schema's own bounds)."""
    low, high = bounds(name, schema)
    if high is None:  # a strict bound (a fraction < 1) bounds it too
        high = next((m.lt for m in field_info(name, schema).metadata if getattr(m, "lt", None) is not None), None)
    cap = (field_info(name, schema).json_schema_extra or {}).get("browser_max")
    return low, cap if cap is not None and (high is None or cap < high) else high


def costs_nothing(name: str, schema: type[BaseModel]) -> bool:
    """Whether option ``name`` is marked as costing no work nor disk whatever its value (:data:`FREE`): every
    other number option has a bound a job from the browser is held to (:func:`browser_bounds`; a test checks
    every job kind's schema)."""
    return (field_info(name, schema).json_schema_extra or {}).get("cost") == "none"


def check_browser_bounds(options: BaseModel) -> None:
    """An :class:`InputError` naming the first option over its :func:`browser_bounds`."""
    schema = type(options)
    for name in schema.model_fields:
        value = getattr(options, name)
        high = browser_bounds(name, schema)[1] if kind(name, schema) in ("int", "float") else None
        if high is not None and value is not None and value > high:
            raise InputError(f"{name} {value:,} is more than a job from the browser may ask for ({high:,}); run it "
                             "with the CLI (layerlens ...), which allows up to the schema's own bound")
    if hasattr(options, "check_for_browser"):  # a bound across options (the checkpoints a job saves)
        options.check_for_browser()


def choices(name: str, schema: type[BaseModel]) -> tuple | None:
    """The allowed values of a choice option (None: not a choice)."""
    annotation = field_info(name, schema).annotation
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return None


def kind(name: str, schema: type[BaseModel]) -> str:
    """``bool``, ``int``, ``float``, ``choice``, ``list`` (given once per value: ``compare --model A --model B``) or
    ``str``."""
    if choices(name, schema):
        return "choice"
    annotation = field_info(name, schema).annotation
    if any(typing.get_origin(t) is list for t in (annotation, *typing.get_args(annotation))):
        return "list"
    for t in (bool, int, float):
        if annotation is t or t in typing.get_args(annotation):
            return t.__name__
    return "str"


def help_text(name: str, schema: type[BaseModel]) -> str:
    info = field_info(name, schema)
    default = info.default
    text = info.description or info.title or name
    return f"{text} (default {default})" if not info.is_required() and default not in (None, "") else text


def accepts(name: str, schema: type[BaseModel]) -> str:
    """What an option accepts, in words: ``float > 0 and ≤ 1``, ``head, tail, head+tail``."""
    if choices(name, schema):
        return ", ".join(map(str, choices(name, schema)))
    low = high = ""
    for m in field_info(name, schema).metadata:
        low = f"≥ {m.ge}" if getattr(m, "ge", None) is not None else f"> {m.gt}" if getattr(m, "gt", None) is not None \
            else low
        high = f"≤ {m.le}" if getattr(m, "le", None) is not None else f"< {m.lt}" if getattr(m, "lt", None) \
            is not None else high
    return f"{kind(name, schema)} {' and '.join(b for b in (low, high) if b)}".strip()


def markdown_table(schema: type[BaseModel], flags: dict[str, str] | None = None) -> str:
    """The option table the README shows (a test checks the README holds exactly this): every field, as a flag
    and a config key; or, with ``flags`` (field -> the command's flag), those fields as the command's flags."""
    head = "| option (`--flag` / config key) |" if flags is None else "| flag |"
    rows = [f"{head} default | accepts | meaning |", "|---|---|---|---|"]
    for name in schema.model_fields if flags is None else flags:
        info = schema.model_fields[name]
        meaning = (info.description or info.title or "").replace("|", "\\|")
        flag = f"`--{name.replace('_', '-')}` / `{name}`" if flags is None else f"`{flags[name]}`"
        rows.append(f"| {flag} | {info.default} | {accepts(name, schema)} | {meaning} |")
    return "\n".join(rows)


def command_flags(names: tuple[str, ...], **renamed: str) -> dict[str, str]:
    """``{field: "--flag"}`` of a command's flags derived from its schema (``renamed``: a field whose flag has
    another name, e.g. ``pairing="--pair-layers"``)."""
    return {name: renamed.get(name, f"--{name.replace('_', '-')}") for name in (*names, *renamed)}
