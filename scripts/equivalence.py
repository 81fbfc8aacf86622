"""Prove that a refactor changed no result: run a fixed set of CLI commands, then compare two such runs.

    python scripts/equivalence.py run OUTDIR      # every command below, each into OUTDIR/<name>/, LAYERLENS_HOME
                                                  # in OUTDIR/home; exit codes and output lines in OUTDIR/<name>.json
    python scripts/equivalence.py run OUTDIR heads   # only the commands whose name starts with "heads"
    python scripts/equivalence.py diff A B        # the same files; every integer and text cell identical; floats
                                                  # within 1e-5 (1e-3 for trained artefacts); the same exit codes and
                                                  # messages; exits 1 naming each difference

The commands are the README's CLI block on the demo model plus structure, tokens extract/neighbours/geometry,
compare, lens train and finetune, with fixed inputs and seeds, and the bad inputs the suite tries. Keep the
outputs outside the repository. Values that record when or where a run happened (times, dates, paths, versions,
process ids) are left out of the comparison and listed by ``diff``.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
TIMING = re.compile(r"\[\d+:\d+<[^\]]*\]\s*$")  # a progress bar's closing [elapsed<left, rate]: a time, no result


BAR = re.compile(r"^(.*?):\s+\d+%\|.*$")  # a progress bar's last drawing: where it stopped redrawing is timing


def _untimed(line: str) -> str:
    return BAR.sub(r"\1: <progress bar>", TIMING.sub("", line))

DATA = "analysis/data/demo_sentiment.csv"
WORDORDER = "analysis/data/demo_wordorder.csv"
UD = "tests/data/ud_tiny_train.conllu"
UD_TEST = "tests/data/ud_tiny_test.conllu"
CORPUS = "tests/data/english_valid_400.txt.gz"

# name -> (arguments after `python -m analysis`, trained: floats compared at 1e-3). {out} is this command's folder.
COMMANDS: dict[str, tuple[list[str], bool]] = {
    "info": (["info", "--model", "demo", "--out", "{out}"], False),
    "probe": (["probe", "--model", "demo", "--input", DATA, "--out", "{out}"], False),
    "atlas": (["atlas", "--model", "demo", "--data", DATA, "--out", "{out}"], False),
    "atlas_random": (["atlas", "--model", "random:demo", "--data", WORDORDER, "--pooling", "mean", "--out", "{out}"],
                     False),
    "finetune": (["finetune", "--model", "demo", "--train", "demo", "--head", "attention", "--out", "{out}"], True),
    "duplicate": (["duplicate", "--model", "demo", "--duplicate-first", "2", "--preview-input", DATA,
                   "--out", "{out}"], False),
    "lens": (["lens", "train", "--model", "demo", "--corpus", "demo", "--steps", "20", "--out", "{out}"], True),
    "probe_lens": (["probe", "--model", "demo", "--input", DATA, "--lens", "{root}/lens", "--out", "{out}"], True),
    "compare": (["compare", "--model", "demo", "--model", "random:demo", "--data", DATA, "--out", "{out}"], False),
    "structure": (["structure", "--model", "demo", "--train", UD, "--test", UD_TEST, "--max-epochs", "5",
                   "--seed", "0", "--out", "{out}"], True),
    "tokens_extract": (["tokens", "extract", "--model", "demo", "--input", CORPUS, "--limit", "200",
                        "--out", "{out}"], False),
    "tokens_neighbours": (["tokens", "neighbours", "--model", "demo", "--input", CORPUS, "--limit", "200",
                           "--word", "the", "--exact", "--out", "{out}"], False),
    "tokens_geometry": (["tokens", "geometry", "--model", "demo", "--input", CORPUS, "--limit", "200",
                         "--seed", "0", "--out", "{out}"], False),
    "tokens_index": (["tokens", "index", "--model", "demo", "--input", CORPUS, "--limit", "200", "--index", "ivf",
                      "--recall-queries", "20", "--layers", "0,2", "--out", "{out}"], False),
    "tokens_map": (["tokens", "map", "--model", "demo", "--input", CORPUS, "--limit", "200", "--layer", "2",
                    "--out", "{out}"], False),
    "tokens_neighbours_row": (["tokens", "neighbours", "--model", "demo", "--input", CORPUS, "--limit", "200",
                               "--row", "5", "-k", "3", "--standardize", "--layers", "1,3", "--out", "{out}"], False),
    "tokens_extract_no_out": (["tokens", "extract", "--model", "demo", "--input", CORPUS, "--limit", "50"], False),
    "compare_three": (["compare", "--model", "demo", "--model", "random:demo", "--model", "demo", "--data", DATA,
                       "--pair-layers", "relative", "--bootstrap", "5", "--no-reconstruction", "--out", "{out}"],
                      False),
    "heads_stats": (["heads", "stats", "--model", "demo", "--input", UD, "--out", "{out}"], False),
    "heads_stats_texts": (["heads", "stats", "--model", "demo", "--input", DATA, "--limit", "40", "--no-clusters",
                           "--out", "{out}"], False),
    "heads_parse": (["heads", "parse", "--model", "demo", "--treebank", UD_TEST, "--min-count", "2",
                     "--out", "{out}"], False),
    "heads_importance": (["heads", "importance", "--model", "demo", "--input", DATA, "--limit", "24", "--steps", "4",
                          "--random-orders", "1", "--out", "{out}"], False),
    "heads_view": (["heads", "view", "--model", "demo", "--text", "the cat sat on the mat .", "--layer", "2",
                    "--head", "1", "--out", "{out}"], False),
    "heads_view_compare": (["heads", "view", "--model", "demo", "--text", "a dog ran .", "--compare", "random:demo",
                            "--out", "{out}"], False),
    # bad inputs: the exit code and the message must stay the same
    "bad_probe_missing": (["probe", "--model", "demo", "--input", "no/such/file.txt", "--out", "{out}"], False),
    "bad_atlas_missing": (["atlas", "--model", "demo", "--data", "no/such.csv", "--out", "{out}"], False),
    "bad_model": (["info", "--model", "no/such/model", "--out", "{out}"], False),
    "bad_compare_one": (["compare", "--model", "demo", "--data", DATA, "--out", "{out}"], False),
    "bad_structure": (["structure", "--model", "demo", "--train", "no.conllu", "--out", "{out}"], False),
    "bad_heads_no_out": (["heads", "stats", "--model", "demo", "--input", UD], False),
    "bad_heads_head": (["heads", "view", "--model", "demo", "--text", "a dog .", "--head", "1", "--out", "{out}"],
                       False),
    "bad_heads_treebank": (["heads", "parse", "--model", "demo", "--treebank", DATA, "--out", "{out}"], False),
    "bad_heads_importance": (["heads", "importance", "--model", "demo", "--input", "no/such.txt", "--out", "{out}"],
                             False),
    "bad_heads_layer": (["heads", "view", "--model", "demo", "--text", "a dog .", "--layer", "9", "--out", "{out}"],
                        False),
    "bad_finetune_train": (["finetune", "--model", "demo", "--out", "{out}"], False),
    "bad_finetune_backend": (["finetune", "--model", "demo", "--train", "demo", "--backend", "slurm",
                              "--out", "{out}"], False),
    "bad_finetune_preset": (["finetune", "--train", "demo", "--preset", "nope", "--out", "{out}"], False),
    "bad_finetune_config": (["finetune", "--config", "no/such.yaml", "--out", "{out}"], False),
    "bad_finetune_no_out": (["finetune", "--train", "demo"], False),
    "bad_finetune_value": (["finetune", "--train", "demo", "--epochs", "0", "--out", "{out}"], False),
    "bad_tokens_no_input": (["tokens", "extract", "--model", "demo", "--out", "{out}"], False),
    "bad_tokens_no_vectors": (["tokens", "geometry", "--model", "demo", "--out", "{out}"], False),
    "bad_tokens_no_query": (["tokens", "neighbours", "--model", "demo", "--input", CORPUS, "--limit", "50",
                             "--out", "{out}"], False),
    "bad_tokens_missing": (["tokens", "extract", "--model", "demo", "--input", "no/such.txt", "--out", "{out}"],
                           False),
    "bad_tokens_layer": (["tokens", "map", "--model", "demo", "--input", CORPUS, "--limit", "50", "--layer", "9",
                          "--out", "{out}"], False),
    "bad_tokens_row": (["tokens", "neighbours", "--model", "demo", "--input", CORPUS, "--limit", "50", "--row",
                        "999999", "--out", "{out}"], False),
    "bad_compare_modes": (["compare", "--model", "demo", "--model", "demo", "--group", "g", "--out", "{out}"], False),
    "bad_compare_no_data": (["compare", "--model", "demo", "--model", "random:demo", "--out", "{out}"], False),
    "bad_compare_job": (["compare", "--job", "99", "--out", "{out}"], False),
    "bad_compare_job_data": (["compare", "--job", "99", "--data", DATA, "--out", "{out}"], False),
    "bad_compare_group": (["compare", "--group", "nope", "--out", "{out}"], False),
    "bad_compare_ref": (["compare", "--model", "demo", "--model", "job:7", "--data", DATA, "--out", "{out}"], False),
    "bad_compare_no_out": (["compare", "--model", "demo", "--model", "demo", "--data", DATA], False),
    "bad_layers": (["probe", "--model", "demo", "--input", DATA, "--layers", "99", "--out", "{out}"], False),
}

# keys whose value says when or where a run happened: any ``_``-separated part of the key is one of these words
VOLATILE_WORDS = {"time", "times", "seconds", "date", "started", "finished", "elapsed", "created", "host", "path",
                  "dir", "version", "versions", "pid", "out", "python", "torch", "threads", "load", "rss", "memory",
                  "peak"}
KEPT = {"held_out", "held_out_texts", "left_out_a", "left_out_b", "slurm_time"}


def volatile(key: str) -> bool:
    return key not in KEPT and bool(VOLATILE_WORDS & set(key.lower().split("_")))


FLOAT_TOL, TRAINED_TOL = 1e-5, 1e-3


def _chosen(prefix: str) -> dict:
    return {name: command for name, command in COMMANDS.items() if name.startswith(prefix)}


def run(root: Path, prefix: str = "") -> None:
    root = root.absolute()
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, LAYERLENS_HOME=str(root / "home"), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONHASHSEED="0")
    for name, (args, _) in _chosen(prefix).items():
        out = root / name
        argv = [a.format(out=out, root=root) for a in args]
        done = subprocess.run([sys.executable, "-m", "analysis", *argv], cwd=REPO, env=env, capture_output=True,
                              text=True)
        last = [line for line in done.stderr.splitlines() if line.strip()]
        record = {"argv": argv, "rc": done.returncode, "stderr_last": last[-1] if last else "",
                  "stdout_lines": len(done.stdout.splitlines())}
        (root / f"{name}.json").write_text(json.dumps(record, indent=1))
        print(f"{name}: exit {done.returncode} {record['stderr_last'][:120]}", flush=True)


def _files(folder: Path) -> set[str]:
    if not folder.is_dir():
        return set()
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and ".staging-" not in str(p)}


TIMINGS = re.compile(r"\d+(\.\d+)? ?(s|it/s)\b|\[\d\d:\d\d<\d\d:\d\d[^\]]*\]")


def _norm(text, root: Path):
    """A message or path value with the run's own output folder as ``<root>`` and timings blanked: two runs in
    different folders write the same thing."""
    return TIMINGS.sub("<time>", str(text).replace(str(root), "<root>")) if isinstance(text, str) else text


def _strip(obj, root: Path):
    if isinstance(obj, dict):
        return {k: _strip(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip(v, root) for v in obj]
    return _norm(obj, root)


def _same_value(x, y, tol: float) -> bool:
    if isinstance(x, bool) or isinstance(y, bool) or isinstance(x, str) or isinstance(y, str) or x is None or y is None:
        return x == y
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    x, y = float(x), float(y)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return abs(x - y) <= tol * max(1.0, abs(x))


def _json(a, b, tol: float, where: str, problems: list[str], skipped: set[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if volatile(str(key)):
                skipped.add(str(key))
                continue
            if key not in a or key not in b:
                problems.append(f"{where}.{key}: only in {'B' if key not in a else 'A'}")
                continue
            _json(a[key], b[key], tol, f"{where}.{key}", problems, skipped)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            problems.append(f"{where}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _json(x, y, tol, f"{where}[{i}]", problems, skipped)
    elif not _same_value(a, b, tol):
        problems.append(f"{where}: {str(a)[:80]!r} vs {str(b)[:80]!r}")


def _frames(a: pd.DataFrame, b: pd.DataFrame, tol: float, where: str, problems: list[str]) -> None:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        problems.append(f"{where}: columns/rows {list(a.columns)}x{len(a)} vs {list(b.columns)}x{len(b)}")
        return
    for col in a.columns:
        x, y = a[col], b[col]
        if volatile(col):  # a timing column (build_seconds): when, not what
            continue
        if pd.api.types.is_float_dtype(x) or pd.api.types.is_float_dtype(y):
            x, y = x.to_numpy(float), y.to_numpy(float)
            bad = ~(np.isclose(x, y, rtol=tol, atol=tol) | (np.isnan(x) & np.isnan(y)))
        else:
            bad = (x.astype(str) != y.astype(str)).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            problems.append(f"{where}[{col}]: {int(bad.sum())} cells differ, first row {i}: "
                            f"{a[col].iloc[i]!r} vs {b[col].iloc[i]!r}")


def diff(a_root: Path, b_root: Path, prefix: str = "") -> int:
    problems: list[str] = []
    skipped: set[str] = set()
    chosen = _chosen(prefix)
    for name, (_, trained) in chosen.items():
        tol = TRAINED_TOL if trained else FLOAT_TOL
        ra, rb = (json.loads((r / f"{name}.json").read_text()) for r in (a_root, b_root))
        if (ra["rc"], _untimed(_norm(ra["stderr_last"], a_root))) != (rb["rc"],
                                                                     _untimed(_norm(rb["stderr_last"], b_root))):
            problems.append(f"{name}: exit {ra['rc']} {ra['stderr_last']!r} vs {rb['rc']} {rb['stderr_last']!r}")
        if ra.get("stdout_lines") != rb.get("stdout_lines"):
            problems.append(f"{name}: {ra.get('stdout_lines')} vs {rb.get('stdout_lines')} lines on stdout")
        fa, fb = _files(a_root / name), _files(b_root / name)
        if fa != fb:
            problems.append(f"{name}: files only in A {sorted(fa - fb)[:5]}, only in B {sorted(fb - fa)[:5]}")
        for rel in sorted(fa & fb):
            pa, pb, where = a_root / name / rel, b_root / name / rel, f"{name}/{rel}"
            if rel.endswith(".csv"):
                _frames(pd.read_csv(pa, keep_default_na=False, na_values=[""]),
                        pd.read_csv(pb, keep_default_na=False, na_values=[""]), tol, where, problems)
            elif rel.endswith(".parquet"):
                _frames(pd.read_parquet(pa), pd.read_parquet(pb), tol, where, problems)
            elif rel.endswith(".json"):
                ja, jb = _strip(json.loads(pa.read_text()), a_root), _strip(json.loads(pb.read_text()), b_root)
                _json(ja, jb, tol, where, problems, skipped)
            elif rel.endswith(".jsonl"):
                la, lb = pa.read_text().splitlines(), pb.read_text().splitlines()
                _json(_strip([json.loads(x) for x in la], a_root), _strip([json.loads(x) for x in lb], b_root), tol,
                      where, problems, skipped)
            elif rel.endswith(".npy"):
                x, y = np.load(pa), np.load(pb)
                if x.shape != y.shape or not np.allclose(x, y, rtol=tol, atol=tol, equal_nan=True):
                    problems.append(f"{where}: arrays differ")
            elif rel.endswith(".npz"):
                x, y = np.load(pa), np.load(pb)
                if sorted(x.files) != sorted(y.files):
                    problems.append(f"{where}: arrays {sorted(x.files)} vs {sorted(y.files)}")
                for key in set(x.files) & set(y.files):
                    u, v = x[key], y[key]
                    same = (u.shape == v.shape and (np.array_equal(u, v) if u.dtype.kind in "USOb" else
                                                    np.allclose(u, v, rtol=tol, atol=tol, equal_nan=True)))
                    if not same:
                        problems.append(f"{where}[{key}]: arrays differ")
    print(f"left out of the comparison (when/where a run happened): {', '.join(sorted(skipped))}")
    for p in problems:
        print(p)
    print(f"{len(problems)} differences in {len(chosen)} commands")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "run":
        run(Path(sys.argv[2]), *sys.argv[3:])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "diff":
        sys.exit(diff(Path(sys.argv[2]), Path(sys.argv[3]), *sys.argv[4:]))
    else:
        sys.exit(__doc__)
