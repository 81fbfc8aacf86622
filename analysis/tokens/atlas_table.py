"""The table Embedding Atlas serves for a layer's token map (issue 29 item 3): one row per token, ``x`` and ``y``
(the layer's 2-D map, :func:`analysis.tokens.maps.pca_map` or another method of ``maps.layer_map``) beside the
token's metadata from ``tokens.parquet`` and its text from ``texts.parquet``. Row ``r`` is row ``r`` of
``tokens.parquet`` (its ``row`` column).

Cached beside the vectors as ``maps/layerNN.<map>.atlas.parquet`` (``<map>`` the coordinates' file stem, e.g.
``layer04.pca2`` gives ``layer04.pca2.atlas.parquet``), written whole (a temporary file renamed), rewritten when the
coordinates or ``tokens.parquet`` are newer than it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.staging import write_atomic
from analysis.tokens import maps
from analysis.tokens.vectors import TokenVectors

#: ``tokens.parquet`` columns carried into the table, where present (``start``/``end``/``shard``/``token_id`` are
#: left out: the page reads them from the extraction when it needs them).
META_COLUMNS = ["row", "text_id", "position", "token", "word", "word_index", "first_subword", "label", "upos",
                "deprel"]


def coordinates(tv: TokenVectors, layer: int, method: str = "pca", **kw) -> tuple[np.ndarray, dict]:
    """``(rows, 2)`` coordinates of hidden state ``layer`` by ``method`` and their description."""
    if method == "pca" and not kw:
        return maps.pca_map(tv, layer, components=2)
    return maps.layer_map(tv, layer, method, **kw)  # UMAP and the methods maps.py adds


def table_path(tv: TokenVectors, meta: dict) -> Path:
    return tv.directory / "maps" / (Path(meta["file"]).stem + ".atlas.parquet")


def build_table(tv: TokenVectors, coords: np.ndarray, text: bool = True) -> pd.DataFrame:
    """The table in memory: ``x``, ``y`` (float32, row ``r`` of ``coords``), the metadata columns and, with
    ``text``, the token's text (``texts.parquet``'s ``text`` of its ``text_id``, a dictionary column)."""
    coords = np.asarray(coords)
    if coords.ndim != 2 or coords.shape[0] != tv.rows or coords.shape[1] < 2:
        raise ValueError(f"coordinates of shape {coords.shape} for {tv.rows} tokens")
    tokens = tv.tokens()
    frame = pd.DataFrame({"x": np.asarray(coords[:, 0], np.float32), "y": np.asarray(coords[:, 1], np.float32)})
    for c in META_COLUMNS:
        if c in tokens.columns:
            frame[c] = tokens[c].to_numpy()
    if text:
        texts = tv.texts().set_index("text_id")["text"]
        codes = texts.index.get_indexer(tokens["text_id"].to_numpy())
        if (codes < 0).any():
            raise ValueError("tokens.parquet names a text_id that texts.parquet lacks")
        # categorical: each distinct text held once in memory, as parquet's dictionary encoding stores it
        distinct, unique = pd.factorize(texts.to_numpy())
        frame["text"] = pd.Categorical.from_codes(distinct[codes], categories=pd.Index(unique, dtype=object))
    return frame


def atlas_table(tv: TokenVectors | Path | str, layer: int, method: str = "pca", text: bool = True,
                force: bool = False, **kw) -> Path:
    """The parquet Embedding Atlas serves for hidden state ``layer`` (written or found in ``maps/``)."""
    tv = tv if isinstance(tv, TokenVectors) else TokenVectors.open(tv)
    coords, meta = coordinates(tv, layer, method, **kw)
    path = table_path(tv, meta)
    if not text:
        path = path.with_name(path.name.replace(".atlas.", ".atlas-notext."))
    sources = [tv.directory / "maps" / meta["file"], tv.directory / "tokens.parquet"]
    if path.is_file() and not force and all(path.stat().st_mtime_ns >= s.stat().st_mtime_ns for s in sources
                                            if s.is_file()):
        return path
    frame = build_table(tv, coords, text=text)
    write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False, row_group_size=256 * 1024))
    return path
