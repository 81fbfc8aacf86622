"""decoded.csv's table (issue 44, item 3): ``python -m benchmarks.bench_decoded [--texts 20000] [--states 13]``.

The probe's ``decoded_table`` for ``--texts`` texts x ``--states`` hidden states of predicted ids (SST-2-length rows
of random ids of the bert-base-uncased vocabulary, ``../shared``; the tiny test vocabulary without it), against
the naive way it replaced: one ``convert_ids_to_tokens`` and one ``convert_tokens_to_string`` per row. Both tables
are checked equal. The device here is the host alone (no model runs), so the ceiling printed is the backend's own
batched decode of the same rows, without building the table."""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from analysis.probe.reconstruction import decoded_table
from benchmarks import SHARED


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--texts", type=int, default=20_000)
    p.add_argument("--states", type=int, default=13)
    args = p.parse_args()
    from transformers import AutoTokenizer

    path = SHARED / "tokenizers" / "bert-base-uncased"
    if path.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(path)
    else:
        from tests.conftest import tiny_tokenizer

        tokenizer = tiny_tokenizer()
    rng = np.random.default_rng(0)
    predicted = {t: rng.integers(999, len(tokenizer), (args.states, int(rng.integers(5, 20))))
                 for t in range(args.texts)}
    start = time.perf_counter()
    ours = decoded_table(tokenizer, predicted, args.states)
    fast = time.perf_counter() - start
    start = time.perf_counter()
    rows = [{"text_id": t, "layer": s, "text": tokenizer.convert_tokens_to_string(
        tokenizer.convert_ids_to_tokens(predicted[t][s].tolist()))} for t in sorted(predicted)
        for s in range(args.states)]
    naive = pd.DataFrame(rows, columns=["text_id", "layer", "text"])
    slow = time.perf_counter() - start
    pd.testing.assert_frame_equal(ours, naive)
    start = time.perf_counter()
    tokenizer.backend_tokenizer.decode_batch([predicted[t][s].tolist() for t in sorted(predicted)
                                              for s in range(args.states)], skip_special_tokens=False)
    floor = time.perf_counter() - start
    print(f"{args.texts:,} texts x {args.states} states = {len(ours):,} rows ({tokenizer.name_or_path or 'tiny'}): "
          f"decoded_table {fast:.2f} s; one decode per row {slow:.2f} s ({slow / fast:.1f}x slower); the backend's "
          f"batched decode alone {floor:.2f} s (decoded_table at {floor / fast:.0%} of that); tables equal")


if __name__ == "__main__":
    main()
