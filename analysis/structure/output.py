"""A linguistic-structure run's files, written and read back: ``probes.csv``, ``mdl.csv``, ``summary.csv``,
``trees.jsonl`` and ``run.json`` (``docs/structure.md``, "Outputs"). A ``structure`` job writes its artifacts with
:func:`write_outputs`; the page opens a finished job's artifacts with :func:`read_outputs`, which gives back the
:class:`~analysis.structure.run.StructureResult` the files were written from."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.core.inputs import InputError

FILES = ("probes.csv", "mdl.csv", "summary.csv", "trees.jsonl", "run.json")


def run_info(result, loaded, processes: int = 1, label_data: str | None = None) -> dict:
    """What ``run.json`` holds: the run's facts, the model (name, fingerprint, spec), its precision mode, the
    number of processes and the versions."""
    from analysis import versions
    from analysis.core.precision import model_mode

    info = dict(result.info)
    if label_data is not None and info.get("label_task"):
        info["label_task"] = {**info["label_task"], "data": str(label_data)}
    return {**info, "model": loaded.spec.name, "fingerprint": loaded.fingerprint, "model_spec": loaded.spec.to_dict(),
            "precision": model_mode(loaded.model), "processes": processes, "versions": versions()}


def write_outputs(result, out: Path, info: dict) -> None:
    """The five files of ``result`` into the folder ``out`` (which exists), ``info`` as ``run.json``
    (:func:`run_info`). The CSVs go through :func:`analysis.core.csvout.to_csv` (no spreadsheet formulas)."""
    from analysis.core.csvout import to_csv
    from analysis.core.task import RunRecord

    out = Path(out)
    to_csv(result.probes, out / "probes.csv")
    to_csv(result.mdl, out / "mdl.csv")
    to_csv(result.summary, out / "summary.csv")
    with open(out / "trees.jsonl", "w", encoding="utf-8") as f:
        for record in result.trees:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    RunRecord("structure", info).write(out)


def read_outputs(folder: Path):
    """The :class:`~analysis.structure.run.StructureResult` whose files are in ``folder`` (``info`` is
    ``run.json``), or an :class:`InputError` naming what is missing or unreadable."""
    from analysis.structure.run import StructureResult

    folder = Path(folder)
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise InputError(f"{folder}: not a linguistic-structure result ({', '.join(missing)} missing)")
    try:
        tables = {}
        for name in ("probes", "mdl", "summary"):
            path = folder / f"{name}.csv"
            tables[name] = pd.read_csv(path) if path.stat().st_size > 1 else pd.DataFrame()
        with open(folder / "trees.jsonl", encoding="utf-8") as f:
            trees = [json.loads(line) for line in f if line.strip()]
        info = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{folder}: its files cannot be read ({exc})") from None
    return StructureResult(tables["probes"], tables["mdl"], tables["summary"], trees, info)
