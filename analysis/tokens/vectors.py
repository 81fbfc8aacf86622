"""Every counted token's vector at the chosen layers, on disk as float16 shards (issue 29 item 1).

Layout of an extraction directory (``LAYERLENS_HOME/cache/token_vectors/<key>/``, the key made by
:func:`analysis.core.store.key_of` from the model fingerprint, the data's hash, the layers, the length limit and the
shard size, as the atlas keys its vectors):

- ``manifest.json``: model, fingerprint, ``layers`` (hidden-state indices, Hugging Face's numbering), ``hidden``,
  ``rows``, ``dtype`` (``float16``), ``shards`` (``file``, ``rows``, ``first_row``, ``dtype``, and for a float32
  shard ``float32_layers``), ``storage`` (the same in words), ``nonfinite`` (per hidden state: the count of NaN and
  infinite values; 0 for an extraction, which refuses them), the source and what was left out;
- ``tokens.parquet``: one row per token (:data:`analysis.tokens.corpus.TOKEN_COLUMNS`, + ``label``,
  ``upos``, ``deprel`` where known, + ``shard``); row ``r`` is row ``r`` of every layer;
- ``texts.parquet``: one row per text (``text_id``, ``text``, ``source_row``, ``label`` or ``sent_id``);
- ``shard_00000.npy`` ...: ``(len(layers), rows, hidden)`` float16 ``.npy``, read memory-mapped. One file per
  shard holds all its layers, layer-major: a layer of a shard is one contiguous block (a per-layer read touches
  only that layer's bytes), and a shard is one file, so one rename makes it whole (whole or absent).

Values (issue 34 item 4): a shard where a hidden state exceeds float16's range (65,504) is computed again in
float32, named in the manifest; NaN or infinite values in the model's own output are refused (hidden states and
counts named); the readers refuse a layer holding non-finite values. Whole (item 7): the parquet files are written
before the manifest (the commit point), :meth:`TokenVectors.open` checks every part, a missing or damaged one is a
line naming the file and saying to re-run the extraction, which rewrites what is missing or damaged.

Shards hold whole texts, in order. Each is written in place through a memory map on a temporary file beside it
(its blocks reserved first: :func:`analysis.core.staging.open_npy`, so a full disk is one line, not a SIGBUS) and
renamed when full: a run killed at any point leaves only whole shards (and a temporary file that the next run
removes); the next run computes the missing shards only. Under ``accelerate launch`` (``ranks``) every process
runs its share of each shard's batches and the main process writes them (:mod:`analysis.core.parallel`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from analysis.core.inputs import InputError
from analysis.core.parallel import ONE, Ranks
from analysis.core.staging import clean_stale_files, open_npy, save_npy, write_atomic
from analysis.core.store import MANIFEST, SHARD, ArrayStore, VectorSet, commit, key_of
from analysis.core.vectors import Progress, batch_plan, run_plan
from analysis.tokens.corpus import TokenCorpus

log = logging.getLogger(__name__)
VERSION = 2  # 2: float32 shards where float16 overflows, non-finite values refused, every part checked on open
SHARD_BYTES = 256 * 2**20  # a shard's size on disk when not given: ~256 MB (the resume granularity)
KIND = "token_vectors"
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65,504
RERUN = ("re-run the same extraction (`tokens extract` with the same model and input, or Extract on the Token "
         "atlas page): it rewrites what is missing or damaged")


def shard_rows_for(layers: int, hidden: int, shard_bytes: int = SHARD_BYTES) -> int:
    return max(1024, shard_bytes // (2 * layers * hidden))


def plan_shards(counts: np.ndarray, shard_rows: int) -> list[tuple[int, int]]:
    """``[(first_text, end_text), ...]``: whole texts, in order, each shard closed once it holds at least
    ``shard_rows`` tokens (a shard is never empty)."""
    out, start, n = [], 0, 0
    for t, c in enumerate(counts.tolist()):
        n += c
        if n >= shard_rows:
            out.append((start, t + 1))
            start, n = t + 1, 0
    if start < len(counts) and counts[start:].sum() > 0:
        out.append((start, len(counts)))
    return out


def storage_dtype(block: np.ndarray) -> type:
    """float16, or float32 where a finite value of ``block`` would become infinite in float16."""
    with np.errstate(over="ignore"):
        wide = np.isinf(np.asarray(block, np.float16)) & np.isfinite(block)
    return np.float32 if wide.any() else np.float16


def storage_text(manifest: dict) -> str:
    """What the shards are stored in, in words (run.json, the CLI's and the page's lines)."""
    wide = [s for s in manifest["shards"] if s.get("dtype") == "float32"]
    if not wide:
        return "float16"
    layers = sorted({x for s in wide for x in s.get("float32_layers", [])})
    return (f"float32 in {len(wide)} of {len(manifest['shards'])} shard(s), where hidden state "
            f"{', '.join(map(str, layers))} exceeds float16's range (65,504); float16 elsewhere"
            if len(wide) < len(manifest["shards"]) else
            f"float32: hidden state {', '.join(map(str, layers))} exceeds float16's range (65,504)")


def _parquet_damage(path: Path, rows: int) -> str | None:
    """Why the parquet file at ``path`` is not whole with ``rows`` rows (None when it is)."""
    import pyarrow.parquet as pq

    if not path.is_file():
        return "missing"
    try:
        found = pq.read_metadata(path).num_rows
    except Exception:  # noqa: BLE001 - pyarrow's errors for a cut footer vary
        return "cut or damaged (not a readable parquet file)"
    return None if found == rows else f"{found:,} rows where the manifest says {rows:,}"


@dataclasses.dataclass
class TokenVectors(VectorSet):
    """An extraction directory (a layered vector set, :class:`analysis.core.store.VectorSet`, with the token and text
    tables as its row metadata), read memory-mapped: ``layer_blocks(l)`` yields each shard's ``(rows, hidden)``
    block of hidden state ``l`` (float16, float32 where float16 could not hold it) without reading the other
    layers; a layer holding non-finite values is refused."""

    _nonfinite: dict = dataclasses.field(default_factory=dict, repr=False)

    REQUIRED: ClassVar[tuple[str, ...]] = ("layers", "hidden", "rows", "texts", "shards")
    RERUN: ClassVar[str] = RERUN
    RESUME: ClassVar[str] = "run the same `tokens extract` to resume"
    ROW: ClassVar[str] = "token row"
    NOUN: ClassVar[str] = "extraction"

    @classmethod
    def open(cls, directory: Path | str) -> TokenVectors:
        """The extraction in ``directory`` (or the one an ``extract --out`` folder names), every part checked:
        an :class:`InputError` naming the first part that is missing or damaged."""
        directory = Path(directory)
        if (directory / "run.json").is_file() and not (directory / MANIFEST).is_file():
            try:  # an extract --out
                directory = Path(json.loads((directory / "run.json").read_text())["vectors"])
            except (ValueError, KeyError, TypeError):
                raise InputError(f"{directory / 'run.json'}: not a whole run.json of `tokens extract`") from None
        if not (directory / MANIFEST).is_file():
            raise InputError(f"{directory}: not a token-vector extraction (no manifest.json); run `tokens extract`")
        return super().open(directory)

    def check_parts(self) -> None:
        for name, rows in (("tokens.parquet", self.rows), ("texts.parquet", int(self.manifest["texts"]))):
            if why := _parquet_damage(self.directory / name, rows):
                raise InputError(f"{self.directory / name}: {why}; {RERUN}")

    def check_layer(self, layer: int) -> None:
        self.check_finite(layer)

    @property
    def storage(self) -> str:
        return storage_text(self.manifest)

    def nonfinite(self, layer: int) -> int:
        """How many NaN or infinite values hidden state ``layer`` holds: the manifest's count, or for an
        extraction written before the counts were kept, counted over the layer once."""
        counts = self.manifest.get("nonfinite")
        if counts is not None and str(layer) in counts:
            return int(counts[str(layer)])
        if layer not in self._nonfinite:
            slot = self.layer_slot(layer)
            self._nonfinite[layer] = sum(int((~np.isfinite(self.shard(i)[slot])).sum())
                                         for i in range(len(self.manifest["shards"])))
        return self._nonfinite[layer]

    def check_finite(self, layer: int) -> None:
        """An :class:`InputError` when hidden state ``layer`` holds NaN or infinite values (a map, a neighbour
        search or a geometry of them would be NaN or empty, or fail in a linear-algebra routine)."""
        bad = self.nonfinite(layer)
        if bad:
            raise InputError(f"hidden state {layer} of {self.directory} holds {bad:,} non-finite values (NaN or "
                             "infinite), so it has no map, neighbours or geometry; re-run the extraction with this "
                             "version (it keeps values beyond float16's range in float32 and refuses a model whose "
                             "output is not finite)")

    def tokens(self, columns: list[str] | None = None) -> pd.DataFrame:
        return pd.read_parquet(self.directory / "tokens.parquet", columns=columns)

    def texts(self) -> pd.DataFrame:
        return pd.read_parquet(self.directory / "texts.parquet")

    def run_info(self, **extra) -> dict:
        """What every ``tokens`` command's and job's ``run.json`` says of the extraction, then ``extra``."""
        from analysis import versions

        return {"vectors": str(self.directory), "model": self.manifest["model"],
                "fingerprint": self.manifest["fingerprint"], "layers": self.layers, "rows": self.rows,
                "hidden": self.hidden, "storage": self.storage, **extra, "versions": versions()}


def extraction_key(loaded, corpus: TokenCorpus, layers: list[int], shard_rows: int) -> str:
    return key_of(kind=KIND, model=loaded.fingerprint, data=corpus.data_hash, layers=layers,
                  max_length=corpus.encoded.max_length, shard_rows=shard_rows, version=VERSION)


class _Wider(Exception):
    """A shard being written in float16 met a value float16 cannot hold: it is computed again in float32."""


def _shard_entries(plan: list[tuple[int, int]], offsets: np.ndarray) -> list[dict]:
    return [{"file": SHARD.format(i), "texts": [a, b], "first_row": int(offsets[a]),
             "rows": int(offsets[b] - offsets[a])} for i, (a, b) in enumerate(plan)]


def _base(manifest: dict) -> dict:
    """The manifest without what is known only once the shards are written (their dtypes, ``storage``)."""
    return {**{k: v for k, v in manifest.items() if k != "storage"},
            "shards": [{k: v for k, v in s.items() if k not in ("dtype", "float32_layers", "size", "sha256")}
                       for s in manifest["shards"]]}


def _write_metadata(directory: Path, manifest: dict, tokens: Callable[[], pd.DataFrame],
                    texts: pd.DataFrame) -> dict:
    """The metadata as one unit: each parquet file that is not whole is (re)written, then the manifest, the commit
    point, unless the one there already says the same. Returns the manifest in force."""
    for name, frame, rows in (("tokens.parquet", tokens, manifest["rows"]), ("texts.parquet", lambda: texts,
                                                                             manifest["texts"])):
        if _parquet_damage(directory / name, rows):
            table = frame()
            write_atomic(directory / name, lambda p, table=table: table.to_parquet(p, index=False))
    path = directory / MANIFEST
    try:
        old = TokenVectors.read_manifest(path) if path.is_file() else None
    except InputError:
        old = None
    if old is not None and _base(old) == _base(manifest):
        return old
    commit(directory, manifest)
    return manifest


def _finish(tv: TokenVectors) -> TokenVectors:
    """Each shard's dtype (and for a float32 one, the hidden states float16 cannot hold) and ``storage`` written
    into the manifest, once every shard is whole."""
    manifest = tv.manifest
    for i, s in enumerate(manifest["shards"]):
        shard = tv.shard(i)
        s["dtype"] = str(shard.dtype)
        if shard.dtype == np.float32:
            s["float32_layers"] = [layer for slot, layer in enumerate(tv.layers)
                                   if storage_dtype(shard[slot]) is np.float32]
    manifest["storage"] = storage_text(manifest)
    commit(tv.directory, manifest)
    return tv


def extract(loaded, corpus: TokenCorpus, layers: list[int] | None = None, batch_size: int = 32,
            shard_rows: int | None = None, progress: Progress | None = None, store: ArrayStore | None = None,
            ranks: Ranks = ONE, after_shard: Callable[[int], None] | None = None,
            before_shard: Callable[[int, list[int], int], None] | None = None) -> TokenVectors | None:
    """Every counted token's vector of ``corpus`` at hidden states ``layers`` (default all), written to (or found
    in) the cache; the shards already there (and whole) are kept. Returns the extraction (None in a helper
    process). A shard where a hidden state exceeds float16's range is computed again and stored in float32; NaN
    or infinite values in the model's output are an :class:`InputError` naming the first hidden state that holds
    them and their count (the core's one check, :func:`analysis.core.activations.check_finite`).

    Hooks (main process; none changes a number): ``progress("token vectors", tokens done, tokens)`` after every
    batch, ``before_shard(shard, the shards this run computes, all shards)`` before a shard is computed and
    ``after_shard(shard)`` once it is written. An exception raised by one of them (a job's cancel) stops the run
    there: the shard being written is removed, the shards written before stay (whole or absent)."""
    import torch

    from analysis.core import activations as act

    n_states = loaded.num_layers + 1
    layers = list(range(n_states)) if layers is None else [int(x) for x in layers]
    if not layers or any(not 0 <= x < n_states for x in layers):
        raise InputError(f"layers {layers} are not hidden states 0..{n_states - 1} of this model")
    hidden = loaded.anatomy.hidden_size
    if corpus.n_rows == 0:
        raise InputError("the corpus has no counted token (every text is empty or special tokens only)")
    shard_rows = shard_rows or shard_rows_for(len(layers), hidden)
    store = store or ArrayStore()
    key = extraction_key(loaded, corpus, layers, shard_rows)
    directory = store.root / KIND / key
    plan = plan_shards(corpus.counts, shard_rows)
    offsets = np.concatenate([[0], np.cumsum(corpus.counts)])
    if ranks.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        clean_stale_files(directory)
        shards = _shard_entries(plan, offsets)
        manifest = {"version": VERSION, "key": key, "model": loaded.spec.name, "fingerprint": loaded.fingerprint,
                    "layers": layers, "hidden": hidden, "rows": corpus.n_rows, "dtype": "float16",
                    "max_length": corpus.encoded.max_length, "texts": len(corpus.encoded),
                    "source": corpus.source, "counted": "non-special tokens (analysis.core.activations.counted_mask)",
                    "nonfinite": {str(x): 0 for x in layers}, "shards": shards}
        shard_of = np.repeat(np.arange(len(plan)), [m["rows"] for m in shards])
        manifest = _write_metadata(directory, manifest, lambda: corpus.tokens.assign(shard=shard_of), corpus.texts)
        tv = TokenVectors(directory, manifest)
        todo = tv.missing()
        unfinished = bool(todo) or "storage" not in manifest
    todo = ranks.broadcast(todo if ranks.is_main else None)
    special = list(loaded.tokenizer.all_special_ids)
    pad = loaded.tokenizer.pad_token_id
    pick = torch.as_tensor(layers)

    @torch.inference_mode()
    def run(idx: list[int]):
        """``(texts, counted tokens per text, (layers, counted, hidden) vectors)``: float16, each layer's counted
        rows taken and halved before they are stacked (stacking the float32 (layers, batch, seq, hidden) first held
        ~0.3 GB more at bert-base, batch 64); float32 when a value would overflow float16. States that are not
        finite never reach here: the core's one check (:func:`analysis.core.activations.check_finite`) refuses
        them in ``hidden_states``, naming the state and the count."""
        batch = act.make_batch(corpus.encoded, idx, pad, loaded.spec.device)
        states = act.hidden_states(loaded, batch)
        mask = act.counted_mask(batch, special, include_special=False)
        halves, wide = [], False
        for i in pick.tolist():
            x = states[i][mask]
            halves.append(x.to(torch.float16))
            lo, hi = torch.aminmax(x) if x.numel() else (torch.zeros(()), torch.zeros(()))
            peak = float(torch.maximum(-lo, hi))
            wide = wide or (peak > FLOAT16_MAX and bool(torch.isinf(halves[-1]).any()))
        counts = mask.sum(1).cpu().numpy()
        if wide:
            halves = [states[i][mask].float() for i in pick.tolist()]
        return idx, counts, torch.stack(halves).cpu().numpy()

    done_rows = sum(int(corpus.counts[a:b].sum()) for i, (a, b) in enumerate(plan) if i not in todo)
    for i in todo:
        a, b = plan[i]
        texts = list(range(a, b))
        sub = act.Encoded([corpus.encoded.input_ids[t] for t in texts],
                      None if corpus.encoded.token_type_ids is None else
                      [corpus.encoded.token_type_ids[t] for t in texts], corpus.encoded.max_length, 0)
        batches = [[texts[j] for j in idx] for idx in batch_plan(loaded, sub, batch_size, ranks)]  # corpus indices
        if not ranks.is_main:
            again = True
            while again:  # the main process may ask for the shard again, in float32
                for _ in run_plan(batches, run, ranks):
                    pass
                again = ranks.broadcast(None)
            continue
        if before_shard:
            before_shard(i, todo, len(plan))
        info = manifest["shards"][i]
        path = directory / info["file"]
        shape = (len(layers), info["rows"], hidden)
        base = int(offsets[a])

        def fill(tmp: Path, dtype, batches=batches, shape=shape, base=base) -> None:
            nonlocal done_rows
            out = open_npy(tmp, dtype, shape)
            wider = False
            for step in run_plan(batches, run, ranks):
                for part, counts, vectors in step:
                    if vectors.dtype.itemsize > out.dtype.itemsize:
                        if ranks.count == 1:
                            raise _Wider
                        wider = True  # the other processes go on to the end of the shard: steps stay in lockstep
                    if wider:
                        continue
                    start = 0
                    for t, c in zip(part, counts.tolist(), strict=True):
                        if c != corpus.counts[t]:
                            raise RuntimeError(f"text {t}: {c} counted tokens in the forward pass, "
                                               f"{corpus.counts[t]} in the metadata")
                        lo = int(offsets[t]) - base
                        out[:, lo:lo + c] = vectors[:, start:start + c]
                        start += c
                    done_rows += int(counts.sum())
                if progress and not wider:
                    progress("token vectors", done_rows, corpus.n_rows)
            if wider:
                raise _Wider
            out.flush()
            del out

        dtype, again = np.float16, True
        while again:
            before = done_rows
            try:
                write_atomic(path, lambda tmp, dtype=dtype: fill(tmp, dtype))
                again = False
            except _Wider:
                done_rows, dtype = before, np.float32
                log.info("%s: a hidden state exceeds float16's range; the shard is stored in float32", path.name)
            ranks.broadcast(again)
        if after_shard:
            after_shard(i)
    if not ranks.is_main:
        return None
    return TokenVectors.open(_finish(tv).directory if unfinished else directory)


def write_arrays(directory: Path, vectors: np.ndarray, tokens: pd.DataFrame, texts: pd.DataFrame,
                 layers: list[int] | None = None, shard_rows: int = 65_536, model: str = "arrays") -> TokenVectors:
    """An extraction directory from vectors already in memory, ``(layers, rows, hidden)``, with their metadata
    (planted data for tests, synthetic data for benchmarks); shards cut at text boundaries as :func:`extract`,
    float16 (float32 where float16 cannot hold a value); NaN and infinite values are kept and counted (the
    readers refuse those layers)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    counts = np.bincount(tokens["text_id"].to_numpy(), minlength=len(texts))
    plan = plan_shards(counts, shard_rows)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    layers = list(range(vectors.shape[0])) if layers is None else layers
    shards = _shard_entries(plan, offsets)
    nonfinite = {str(layer): int((~np.isfinite(vectors[slot])).sum()) for slot, layer in enumerate(layers)}
    manifest = {"version": VERSION, "key": None, "model": model, "fingerprint": None, "layers": layers,
                "hidden": int(vectors.shape[2]), "rows": int(vectors.shape[1]), "dtype": "float16",
                "max_length": None, "texts": len(texts), "source": {"kind": "arrays"}, "nonfinite": nonfinite,
                "shards": shards}
    for s in shards:
        block = vectors[:, s["first_row"]:s["first_row"] + s["rows"]]
        block = np.ascontiguousarray(block, dtype=storage_dtype(block))
        write_atomic(directory / s["file"], lambda p, block=block: save_npy(p, block))
    shard_of = np.repeat(np.arange(len(plan)), [s["rows"] for s in shards])
    _write_metadata(directory, manifest, lambda: tokens.assign(shard=shard_of), texts)
    return TokenVectors.open(_finish(TokenVectors(directory, manifest)).directory)
