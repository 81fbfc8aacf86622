"""Per-token probe rows, kept in memory or streamed to a Parquet file batch by batch.

Token columns are dictionary-encoded against the tokenizer's vocabulary: ids are stored, strings are never
built per row, and the file reads back as ordinary strings. A file is written by one background thread (issue 44
item 4), so encoding and writing overlap the next batch's work.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

QUEUE_TABLES = 8  # batches' tables waiting for the writer thread at most
ROW_GROUP_ROWS = 1 << 20  # rows per Parquet row group (a batch is ~40,000 rows at bert-base size)
TOKEN_COLUMNS = ["text_id", "layer", "position", "input_token", "predicted_token", "correct", "prob", "rank",
                 "top_tokens", "top_probs"]


def vocabulary(tokenizer) -> pa.Array:
    """Token strings indexed by id (ids the tokenizer does not name become ``[id]``)."""
    n = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
    names = [f"[{i}]" for i in range(n)]
    for token, i in tokenizer.get_vocab().items():
        names[i] = token
    return pa.array(names, type=pa.string())


class TokenSink:
    """Collects per-token rows; ``path`` streams them to Parquet instead of keeping them in memory."""

    def __init__(self, tokenizer, top_k: int, path: Path | None = None, halves: bool = False):
        self.vocab = vocabulary(tokenizer)
        self.halves = halves  # a ``half`` column (the attention halves are read), even in an empty file
        self.top_k = top_k
        self.path = path
        self._tables: list[pa.Table] = []
        self._queue: queue.Queue = queue.Queue(QUEUE_TABLES)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _tokens(self, ids: np.ndarray) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array(ids.astype(np.int32)), self.vocab)

    def _table(self, *, text_ids, layers, positions, targets, preds, probs, ranks, top_ids, top_probs,
               halves=None) -> pa.Table:
        k = self.top_k if top_ids.ndim < 2 else top_ids.shape[1]
        half = {} if halves is None else {"half": pa.array(halves, type=pa.string())}
        return pa.table({
            "text_id": pa.array(text_ids.astype(np.int64)),
            "layer": pa.array(layers.astype(np.int16)),
            **half,
            "position": pa.array(positions.astype(np.int32)),
            "input_token": self._tokens(targets),
            "predicted_token": self._tokens(preds),
            "correct": pa.array(targets == preds, type=pa.bool_()),
            "prob": pa.array(probs.astype(np.float32)),
            "rank": pa.array(ranks.astype(np.int32)),
            "top_tokens": pa.FixedSizeListArray.from_arrays(self._tokens(top_ids.reshape(-1)), k),
            "top_probs": pa.FixedSizeListArray.from_arrays(pa.array(top_probs.reshape(-1).astype(np.float32)), k),
        })

    def _empty(self) -> pa.Table:
        z = np.zeros(0, dtype=np.int64)
        top = np.zeros((0, self.top_k), dtype=np.int64)
        return self._table(text_ids=z, layers=z, positions=z, targets=z, preds=z, probs=z, ranks=z,
                           top_ids=top, top_probs=top, halves=np.zeros(0, str) if self.halves else None)

    def add(self, **columns) -> None:
        """One batch of rows: ``text_ids, layers, positions, targets, preds, probs, ranks`` are numpy arrays
        over rows; ``top_ids`` and ``top_probs`` are ``(rows, k)``; ``halves`` (when the attention halves are
        read) each row's half, a ``half`` column after ``layer``.

        Streaming to a file, the table is handed to one writer thread through a bounded queue
        (:data:`QUEUE_TABLES` tables: the caller waits only when the disk is that far behind) and written in row
        groups of :data:`ROW_GROUP_ROWS`; pyarrow releases the GIL while it encodes and writes, so the file is
        written while the next batch is computed. A write error (a full disk) is raised by the next ``add`` or by
        ``close``."""
        table = self._table(**columns)
        if self.path is None:
            self._tables.append(table)
            return
        if self._thread is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._write, args=(table.schema,), daemon=True,
                                            name="layerlens-token-writer")
            self._thread.start()
        self._raise()
        self._queue.put(table)

    def _write(self, schema: pa.Schema) -> None:
        """The writer thread: tables from the queue, gathered into large row groups, until ``None``."""
        pending: list[pa.Table] = []
        finished = False
        try:
            with pq.ParquetWriter(self.path, schema) as writer:
                while not (finished := (table := self._queue.get()) is None):
                    if self._error is not None:
                        continue  # drain: the caller raises the error at its next add
                    pending.append(table)
                    if sum(map(len, pending)) >= ROW_GROUP_ROWS:
                        writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
                        pending = []
                if pending and self._error is None:
                    writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
        except BaseException as exc:  # handed to the caller's thread
            self._error = exc
            while not finished:  # drain until close: a caller blocked on put goes on
                finished = self._queue.get() is None

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Stop the writer thread after a failure elsewhere (the run stopped): the file is left as it is (a
        staged output folder removes it)."""
        if self._thread is not None and self._thread.is_alive():
            self._error = self._error or RuntimeError("the probe stopped")
            self._queue.put(None)
            self._thread.join()

    def close(self) -> pd.DataFrame | None:
        """Finish: the rows as a DataFrame sorted by text, layer and position (in memory), or None after
        closing the Parquet file (raising the writer's error, if it had one)."""
        if self.path is not None:
            if self._thread is None:  # no rows: still write a valid, empty file
                self.path.parent.mkdir(parents=True, exist_ok=True)
                pq.ParquetWriter(self.path, self._empty().schema).close()
                return None
            self._queue.put(None)
            self._thread.join()
            self._raise()
            return None
        table = pa.concat_tables(self._tables) if self._tables else self._empty()
        self._tables = []
        order = [("text_id", "ascending"), ("layer", "ascending"), ("position", "ascending")]
        if "half" in table.column_names:  # a layer's attention half ("attention") before its output ("output")
            order.insert(2, ("half", "ascending"))
        return table.sort_by(order).to_pandas()
