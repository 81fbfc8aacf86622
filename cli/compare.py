"""``layerlens compare``: checkpoints layer by layer on the same rows (:mod:`analysis.compare`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.compare.options import COMPARE_FLAGS, CompareConfig
from analysis.core.task import RunRecord
from cli.common import (
    StageBars,
    UserError,
    add_option_flag,
    find_job,
    model_spec,
    nonnegative_int,
    positive_int,
    prepare_out,
)


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models and data")
    g.add_argument("--model", action="append", metavar="MODEL",
                   help="a checkpoint (hub id, directory, demo, random:NAME, job:N: job N's fine-tuned model read by "
                   "the MLM head it started from); give it twice or more: the first is the reference A, each other "
                   "one is compared with it")
    g.add_argument("--job", type=nonnegative_int, metavar="N", help="instead of --model: the epochs of fine-tuning "
                   "job N against the model it started from, from the vectors each epoch saved (epochs/<e>/, not "
                   "recomputed), on the job's validation rows (no --data)")
    g.add_argument("--group", metavar="G", help="instead of --model: every finished job of sweep group G against "
                   "the model they started from (--data, or the held-out rows of the group's first job)")
    g.add_argument("--head-from", metavar="MODEL", help="lend this masked LM's MLM head to every compared model that "
                   "has none of its own (a fine-tuned classifier: the model it was fine-tuned from), for the "
                   "reconstruction columns; a model with its own head keeps it")
    for name in ("device", "dtype", "allow_pickle"):
        add_option_flag(g, name)
    g.add_argument("--data", type=Path, help="rows: .txt, .csv, .tsv or .jsonl (labels optional)")
    g.add_argument("--text-column", default="text", help="column holding the texts (default: text)")
    g.add_argument("--pair-column", help="column holding the second text of a pair")
    g.add_argument("--label-column", default="label", help="column holding the class labels, if any (default: "
                   "label; without it the probe columns are left out)")
    for name, flag in COMPARE_FLAGS.items():  # from the schema: default, choices, help; checked in cmd_compare
        add_option_flag(g, name, schema=CompareConfig, flag=flag)
    g.add_argument("--bootstrap", type=positive_int, help=argparse.SUPPRESS)  # before the CKA jackknife: ignored
    g.add_argument("--out", type=Path, help="directory for cka_cross.csv, layer_summary.csv, movers.csv, "
                   "coords_aligned.csv, run.json")


def read_rows(args: argparse.Namespace):
    """The rows of ``--data`` (with labels when the label column is there; said when not)."""
    from analysis.core.inputs import InputError, read_file

    try:
        data = read_file(args.data, args.text_column, args.pair_column, label_column=args.label_column)
    except InputError as exc:  # no label column (or a .txt file): compare without labels, and say so
        if args.label_column not in str(exc) and "label" not in str(exc):
            raise
        data = read_file(args.data, args.text_column, args.pair_column)
        print(f"note: no '{args.label_column}' column: comparing without labels (no probe columns)", file=sys.stderr)
    for note in data.notes():
        print(f"note: {note}", file=sys.stderr)
    return data


def load(spec, args: argparse.Namespace):
    """``spec`` loaded; one without an MLM head of its own gets ``--head-from``'s when given."""
    import dataclasses

    from models.loading import load_model

    loaded = load_model(spec)
    if loaded.mlm_head is None and args.head_from and args.reconstruction:
        loaded = load_model(dataclasses.replace(spec, head_from=args.head_from))
    return loaded


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare checkpoints layer by layer."""
    from analysis.compare.checks import check_rows
    from analysis.compare.run import compare

    if args.out is None:
        raise UserError("--out DIR is required: compare writes cka_cross.csv, layer_summary.csv, movers.csv, "
                        "coords_aligned.csv, run.json")
    modes = [flag for flag, given in (("--model", args.model), ("--job", args.job is not None),
                                      ("--group", args.group)) if given]
    if len(modes) > 1:
        raise UserError(f"give one of --model (twice or more), --job or --group, not {' and '.join(modes)}")
    if not modes or (args.model and len(args.model) < 2):
        raise UserError("give --model at least twice: the reference first, then the checkpoints to compare with it "
                        "(or --job N for a job's epochs, --group G for a sweep)")
    if args.bootstrap is not None:
        print("note: --bootstrap is ignored: the CKA interval is a delete-one jackknife over the rows now (no "
              "resamples)", file=sys.stderr)
    config = CompareConfig(**{name: getattr(args, name) for name in COMPARE_FLAGS})
    extra: dict = {}
    if args.job is not None:
        return write(*compare_job(args, config), args)
    else:
        if args.group:
            specs, names, data, extra = group_models(args)
        else:
            if args.data is None:
                raise UserError("--data FILE is required: the rows both models read")
            specs, names = [], []
            for name in args.model:
                spec, label = model_spec(name, args.model[0], None, args)
                specs.append(spec)
                names.append(label)
            data = read_rows(args)
        check_rows(data, config.folds, config.debiased)  # before any model is loaded
        models = [load(spec, args) for spec in specs]
        out = prepare_out(args.out)
        with StageBars() as progress:
            result = compare(models, data, config, progress, names)
        result.info |= extra
        return write(result, out, args)


def compare_job(args: argparse.Namespace, config):
    """``--job N``: the job's epochs against its base (:mod:`analysis.compare.epochs`); ``(result, staged out)``."""
    from analysis.compare.epochs import compare_epochs
    from analysis.training.runs import job_run
    from jobs.store import JobStore

    if args.data is not None:
        raise UserError("--job compares the vectors each epoch saved for the job's validation rows: give no --data")
    if args.pooling != "cls":
        raise UserError("a job's epochs kept only the [CLS] vectors: --pooling cls (the default)")
    job = find_job(JobStore(), args.job)
    run = job_run(job.artifacts, job.config, job.metrics, job.label)
    base = load(run.base_spec(args.device), args)
    spec = run.checkpoint_spec(args.device)
    checkpoint = load(spec, args) if spec is not None and args.reconstruction else None
    out = prepare_out(args.out)
    with StageBars() as progress:
        result = compare_epochs(base, run, config, checkpoint, progress)
    result.info["job"] = job.id
    return result, out


def group_models(args: argparse.Namespace):
    """``--group G``: ``(specs, names, rows, info)``: the model the group's jobs started from, then each finished
    job's fine-tuned model; the rows of ``--data``, else the first job's held-out rows."""
    from analysis.compare.modelref import resolve_group
    from analysis.core.inputs import InputError
    from analysis.training.finetune import held_out_rows
    from analysis.training.options import resolve
    from jobs.store import JobStore
    from models.spec import ModelSpec

    store = JobStore()
    try:
        found = resolve_group(store.list(limit=1_000_000), args.group, str(store.root))
    except InputError as exc:
        raise UserError(str(exc)) from None
    done = list(found.members)
    base = resolve(done[0].config).spec()
    specs = [ModelSpec(base.name, revision=base.revision, device=args.device, dtype=args.dtype,
                       allow_pickle=args.allow_pickle)]
    names = [base.name]
    for job in done:
        spec, label = model_spec(f"job:{job.id}", base.name, store, args)
        specs.append(spec)
        names.append(label)
    if args.data is not None:
        rows, where = read_rows(args), str(args.data)
    else:
        rows, where = held_out_rows(resolve(done[0].config), done[0].artifacts)
        print(f"note: rows: {where} (job #{done[0].id}); jobs whose held-out rows differ may have trained on some "
              "of them: give --data to choose", file=sys.stderr)
    if found.skipped:
        print(f"note: group '{args.group}': jobs {', '.join(map(str, found.skipped))} not compared (not finished, or "
              "no checkpoint)", file=sys.stderr)
    return specs, names, rows, {"group": args.group, "jobs": [j.id for j in done], "rows_are": where}


def write(result, out: Path, args: argparse.Namespace) -> int:
    from analysis.core.csvout import to_csv

    to_csv(result.cka_cross, out / "cka_cross.csv")
    to_csv(result.layer_summary, out / "layer_summary.csv")
    to_csv(result.movers, out / "movers.csv")
    to_csv(result.coords, out / "coords_aligned.csv")
    RunRecord("compare", result.info).write(out)
    s = result.layer_summary
    shown = [c for c in ("layer", "layer_b", "cka", "cka_ci_low", "cka_ci_high", "mean_movement",
                         "neighbours_mostly_changed", "probe_accuracy_a", "probe_accuracy_b", "mcnemar_p",
                         "recon_accuracy_a", "recon_accuracy_b", "recon_change", "recon_mcnemar_p") if c in s.columns]
    for name, part in s.groupby("model_b", sort=False):
        print(f"{part['model_a'].iloc[0]} vs {name}")
        print(part[shown].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    for pairing in result.info.get("layer_pairs", []):
        if pairing["left_out_a"] or pairing["left_out_b"]:
            print(f"note: {pairing['model_b']}: layers paired by {pairing['pairing']} (depths "
                  f"{pairing['depths'][0]} and {pairing['depths'][1]}); left out: "
                  + "; ".join(f"{side}'s {', '.join(map(str, pairing[f'left_out_{side.lower()}']))}" for side in "AB"
                              if pairing[f"left_out_{side.lower()}"]) + " (cka_cross.csv has every pair)",
                  file=sys.stderr)
    if result.info.get("few_rows"):
        print(f"note: {result.info['few_rows']}", file=sys.stderr)
    print(f"wrote {args.out}/cka_cross.csv, layer_summary.csv, movers.csv, coords_aligned.csv, run.json",
          file=sys.stderr)
    return 0
