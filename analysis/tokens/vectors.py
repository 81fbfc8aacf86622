"""Every counted token's vector at the chosen layers, on disk as float16 shards (issue 29 item 1).

Layout of an extraction directory (``LAYERLENS_HOME/cache/token_vectors/<key>/``, the key made by
:func:`analysis.store.key_of` from the model fingerprint, the data's hash, the layers, the length limit and the
shard size, as the atlas keys its vectors):

- ``manifest.json``: model, fingerprint, ``layers`` (hidden-state indices, Hugging Face's numbering), ``hidden``,
  ``rows``, ``dtype`` (``float16``), ``shards`` (``file``, ``rows``, ``first_row``), the source and what was left out;
- ``tokens.parquet``: one row per token (:data:`analysis.tokens.corpus.TOKEN_COLUMNS`, + ``label``,
  ``upos``, ``deprel`` where known, + ``shard``); row ``r`` is row ``r`` of every layer;
- ``texts.parquet``: one row per text (``text_id``, ``text``, ``source_row``, ``label`` or ``sent_id``);
- ``shard_00000.npy`` ...: ``(len(layers), rows, hidden)`` float16 ``.npy``, read memory-mapped. One file per
  shard holds all its layers, layer-major: a layer of a shard is one contiguous block (a per-layer read touches
  only that layer's bytes), and a shard is one file, so one rename makes it whole (whole or absent).

Shards hold whole texts, in order. Each is written in place through a memory map on a temporary file beside it
and renamed when full: a run killed at any point leaves only whole shards (and a temporary file that the next run
removes); the next run computes the missing shards only. Under ``accelerate launch`` (``ranks``) every process
runs its share of each shard's batches and the main process writes them (:mod:`analysis.parallel`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.inputs import InputError
from analysis.parallel import ONE, Ranks
from analysis.store import ArrayStore, key_of
from analysis.tokens.corpus import TokenCorpus

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]
VERSION = 1
SHARD_BYTES = 256 * 2**20  # a shard's size on disk when not given: ~256 MB (the resume granularity)
KIND = "token_vectors"


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


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would add ".npy" to a temporary name
        np.save(f, array, allow_pickle=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(directory: Path) -> int:
    """Remove the temporary files of writers that are no longer running (a killed extraction's half shard)."""
    removed = 0
    for tmp in directory.glob(".*.tmp"):
        try:
            pid = int(tmp.name.split(".")[-3])
        except (ValueError, IndexError):
            continue
        if not _alive(pid):
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


@dataclasses.dataclass
class TokenVectors:
    """An extraction directory, read memory-mapped: ``layer_blocks(l)`` yields each shard's ``(rows, hidden)``
    float16 block of hidden state ``l`` without reading the other layers."""

    directory: Path
    manifest: dict

    @classmethod
    def open(cls, directory: Path | str) -> TokenVectors:
        directory = Path(directory)
        if (directory / "run.json").is_file() and not (directory / "manifest.json").is_file():
            directory = Path(json.loads((directory / "run.json").read_text())["vectors"])  # an extract --out
        path = directory / "manifest.json"
        if not path.is_file():
            raise InputError(f"{directory}: not a token-vector extraction (no manifest.json); run `tokens extract`")
        manifest = json.loads(path.read_text())
        tv = cls(directory, manifest)
        missing = tv.missing()
        if missing:
            raise InputError(f"{directory}: the extraction is incomplete ({len(missing)} of "
                             f"{len(manifest['shards'])} shards missing); run the same `tokens extract` to resume")
        return tv

    @property
    def layers(self) -> list[int]:
        return list(self.manifest["layers"])

    @property
    def rows(self) -> int:
        return int(self.manifest["rows"])

    @property
    def hidden(self) -> int:
        return int(self.manifest["hidden"])

    def missing(self) -> list[int]:
        return [i for i, s in enumerate(self.manifest["shards"]) if not (self.directory / s["file"]).is_file()]

    def layer_slot(self, layer: int) -> int:
        if layer not in self.layers:
            raise InputError(f"layer {layer} was not extracted; this extraction has hidden states "
                             f"{', '.join(map(str, self.layers))}")
        return self.layers.index(layer)

    def shard(self, i: int) -> np.ndarray:
        return np.load(self.directory / self.manifest["shards"][i]["file"], mmap_mode="r", allow_pickle=False)

    def layer_blocks(self, layer: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, block)`` per shard: hidden state ``layer``'s float16 ``(rows, hidden)`` block (mapped)."""
        slot = self.layer_slot(layer)
        for i, s in enumerate(self.manifest["shards"]):
            yield int(s["first_row"]), self.shard(i)[slot]

    def rows_at(self, layer: int, rows: np.ndarray) -> np.ndarray:
        """float32 ``(len(rows), hidden)``: the vectors of ``rows`` (any order) at hidden state ``layer``."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.rows):
            raise InputError(f"token row out of range: this extraction has rows 0..{self.rows - 1}")
        slot = self.layer_slot(layer)
        firsts = np.array([s["first_row"] for s in self.manifest["shards"]] + [self.rows])
        where = np.searchsorted(firsts, rows, side="right") - 1
        out = np.empty((len(rows), self.hidden), np.float32)
        for i in np.unique(where):
            sel = np.flatnonzero(where == i)
            local = rows[sel] - firsts[i]
            order = np.argsort(local)
            out[sel[order]] = self.shard(int(i))[slot][local[order]]
        return out

    def tokens(self, columns: list[str] | None = None) -> pd.DataFrame:
        return pd.read_parquet(self.directory / "tokens.parquet", columns=columns)

    def texts(self) -> pd.DataFrame:
        return pd.read_parquet(self.directory / "texts.parquet")

    def disk_bytes(self) -> int:
        return sum((self.directory / s["file"]).stat().st_size for s in self.manifest["shards"])

    def run_info(self, **extra) -> dict:
        """What every ``tokens`` command's and job's ``run.json`` says of the extraction, then ``extra``."""
        from analysis import versions

        return {"vectors": str(self.directory), "model": self.manifest["model"],
                "fingerprint": self.manifest["fingerprint"], "layers": self.layers, "rows": self.rows,
                "hidden": self.hidden, **extra, "versions": versions()}


def extraction_key(loaded, corpus: TokenCorpus, layers: list[int], shard_rows: int) -> str:
    return key_of(kind=KIND, model=loaded.fingerprint, data=corpus.data_hash, layers=layers,
                  max_length=corpus.encoded.max_length, shard_rows=shard_rows, version=VERSION)


def extract(loaded, corpus: TokenCorpus, layers: list[int] | None = None, batch_size: int = 32,
            shard_rows: int | None = None, progress: Progress | None = None, store: ArrayStore | None = None,
            ranks: Ranks = ONE, after_shard: Callable[[int], None] | None = None,
            before_shard: Callable[[int, list[int], int], None] | None = None) -> TokenVectors | None:
    """Every counted token's vector of ``corpus`` at hidden states ``layers`` (default all), written to (or found
    in) the cache; the shards already there are kept. Returns the extraction (None in a helper process).

    Hooks (main process; none changes a number): ``progress("token vectors", tokens done, tokens)`` after every
    batch, ``before_shard(shard, the shards this run computes, all shards)`` before a shard is computed and
    ``after_shard(shard)`` once it is written. An exception raised by one of them (a job's cancel) stops the run
    there: the shard being written is removed, the shards written before stay (whole or absent)."""
    import torch

    from analysis.activations import Encoded, bucket_indices, counted_mask, halving_on_oom, hidden_states, make_batch

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
        clean_stale(directory)
        manifest = {"version": VERSION, "key": key, "model": loaded.spec.name, "fingerprint": loaded.fingerprint,
                    "layers": layers, "hidden": hidden, "rows": corpus.n_rows, "dtype": "float16",
                    "max_length": corpus.encoded.max_length, "texts": len(corpus.encoded),
                    "source": corpus.source, "counted": "non-special tokens (analysis.activations.counted_mask)",
                    "shards": [{"file": f"shard_{i:05d}.npy", "texts": [a, b], "first_row": int(offsets[a]),
                                "rows": int(offsets[b] - offsets[a])} for i, (a, b) in enumerate(plan)]}
        if not (directory / "tokens.parquet").is_file():
            shard_of = np.repeat(np.arange(len(plan)), [m["rows"] for m in manifest["shards"]])
            tokens = corpus.tokens.assign(shard=shard_of)
            _write_atomic(directory / "tokens.parquet", lambda p: tokens.to_parquet(p, index=False))
            _write_atomic(directory / "texts.parquet", lambda p: corpus.texts.to_parquet(p, index=False))
        _write_atomic(directory / "manifest.json", lambda p: p.write_text(json.dumps(manifest, indent=1)))
        tv = TokenVectors(directory, manifest)
        todo = tv.missing()
    todo = ranks.broadcast(todo if ranks.is_main else None)
    special = list(loaded.tokenizer.all_special_ids)
    pad = loaded.tokenizer.pad_token_id
    pick = torch.as_tensor(layers)

    @torch.inference_mode()
    def run(idx: list[int]):
        batch = make_batch(corpus.encoded, idx, pad, loaded.spec.device)
        states = hidden_states(loaded, batch)
        mask = counted_mask(batch, special, include_special=False)
        # (layers, counted, hidden) float16, text by text: each layer's counted rows taken and halved before they
        # are stacked (stacking the float32 (layers, batch, seq, hidden) first held ~0.3 GB more at bert-base, batch 64)
        vectors = torch.stack([states[i][mask].to(torch.float16) for i in pick.tolist()]).cpu().numpy()
        return idx, mask.sum(1).cpu().numpy(), vectors

    done_rows = sum(int(corpus.counts[a:b].sum()) for i, (a, b) in enumerate(plan) if i not in todo)
    for i in todo:
        a, b = plan[i]
        texts = list(range(a, b))
        sub = Encoded([corpus.encoded.input_ids[t] for t in texts],
                      None if corpus.encoded.token_type_ids is None else
                      [corpus.encoded.token_type_ids[t] for t in texts], corpus.encoded.max_length, 0)
        batches = ranks.broadcast([[texts[j] for j in idx] for idx in bucket_indices(sub, batch_size, loaded)]
                                  if ranks.is_main else None)
        if not ranks.is_main:
            for idx in ranks.steps(batches):
                ranks.gather(list(halving_on_oom(run, idx)) if idx is not None else [])
            continue
        if before_shard:
            before_shard(i, todo, len(plan))
        info = manifest["shards"][i]
        path = directory / info["file"]
        shape = (len(layers), info["rows"], hidden)
        base = int(offsets[a])

        def fill(tmp: Path, batches=batches, shape=shape, base=base) -> None:
            nonlocal done_rows
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=shape)
            for idx in ranks.steps(batches):
                for part, counts, vectors in (p for parts in ranks.gather(
                        list(halving_on_oom(run, idx)) if idx is not None else []) for p in parts):
                    start = 0
                    for t, c in zip(part, counts.tolist(), strict=True):
                        if c != corpus.counts[t]:
                            raise RuntimeError(f"text {t}: {c} counted tokens in the forward pass, "
                                               f"{corpus.counts[t]} in the metadata")
                        lo = int(offsets[t]) - base
                        out[:, lo:lo + c] = vectors[:, start:start + c]
                        start += c
                    done_rows += int(counts.sum())
                if progress:
                    progress("token vectors", done_rows, corpus.n_rows)
            out.flush()
            del out

        _write_atomic(path, fill)
        if after_shard:
            after_shard(i)
    return TokenVectors.open(directory) if ranks.is_main else None


def write_arrays(directory: Path, vectors: np.ndarray, tokens: pd.DataFrame, texts: pd.DataFrame,
                 layers: list[int] | None = None, shard_rows: int = 65_536, model: str = "arrays") -> TokenVectors:
    """An extraction directory from vectors already in memory, ``(layers, rows, hidden)``, with their metadata
    (planted data for tests, synthetic data for benchmarks); shards cut at text boundaries as :func:`extract`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    counts = np.bincount(tokens["text_id"].to_numpy(), minlength=len(texts))
    plan = plan_shards(counts, shard_rows)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    layers = list(range(vectors.shape[0])) if layers is None else layers
    manifest = {"version": VERSION, "key": None, "model": model, "fingerprint": None, "layers": layers,
                "hidden": int(vectors.shape[2]), "rows": int(vectors.shape[1]), "dtype": "float16",
                "max_length": None, "texts": len(texts), "source": {"kind": "arrays"},
                "shards": [{"file": f"shard_{i:05d}.npy", "texts": [a, b], "first_row": int(offsets[a]),
                            "rows": int(offsets[b] - offsets[a])} for i, (a, b) in enumerate(plan)]}
    for s in manifest["shards"]:
        block = np.ascontiguousarray(vectors[:, s["first_row"]:s["first_row"] + s["rows"]], dtype=np.float16)
        _write_atomic(directory / s["file"], lambda p, block=block: _save_npy(p, block))
    shard_of = np.repeat(np.arange(len(plan)), [s["rows"] for s in manifest["shards"]])
    tokens.assign(shard=shard_of).to_parquet(directory / "tokens.parquet", index=False)
    texts.to_parquet(directory / "texts.parquet", index=False)
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return TokenVectors.open(directory)
