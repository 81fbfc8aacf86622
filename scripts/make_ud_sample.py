"""Writes ``analysis/data/ud_english_ewt_sample/``: a small slice of UD English-EWT that the clone carries, so the
Linguistic structure page runs at once without ``../shared``.

The slice: the first 300 sentences of ``en_ewt-ud-dev.conllu`` (the probes' training file) and the first 150 of
``en_ewt-ud-test.conllu`` (the file they are scored on), each sentence's lines unchanged (comments included), in
the original order, gzipped deterministically (no name, mtime 0). The licence (CC BY-SA 4.0) is copied beside
them as ``LICENSE`` (no ``.txt``: the pages offer ``.txt`` files under the data roots as texts).

    python scripts/make_ud_sample.py [path/to/ud_english_ewt]
"""

import gzip
import io
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "analysis" / "data" / "ud_english_ewt_sample"
SOURCE = ROOT.parent / "shared" / "data" / "ud_english_ewt"
SLICES = {"en_ewt-ud-dev.conllu.gz": ("en_ewt-ud-dev-first300.conllu.gz", 300),
          "en_ewt-ud-test.conllu.gz": ("en_ewt-ud-test-first150.conllu.gz", 150)}


def first_sentences(path: Path, n: int) -> str:
    """The text of the first ``n`` sentences (blocks ending in a blank line) of a CoNLL-U file, unchanged."""
    blocks, current = [], []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            current.append(line)
            if not line.strip():
                if any(not x.startswith("#") and x.strip() for x in current):
                    blocks.append("".join(current))
                current = []
                if len(blocks) == n:
                    break
    if len(blocks) < n:
        raise SystemExit(f"{path}: only {len(blocks)} sentences")
    return "".join(blocks)


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else SOURCE
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (target, n) in SLICES.items():
        buffer = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz:
            gz.write(first_sentences(source / name, n).encode("utf-8"))
        (OUT / target).write_bytes(buffer.getvalue())
        print(f"wrote {OUT / target}: {n} sentences, {len(buffer.getvalue()):,} bytes")
    shutil.copyfile(source / "LICENSE.txt", OUT / "LICENSE")


if __name__ == "__main__":
    main()
