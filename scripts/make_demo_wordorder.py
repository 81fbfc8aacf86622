"""Writes ``analysis/data/demo_wordorder.csv``: a bundled labelled set on which layers differ.

The task is Conneau et al. (2018)'s *bigram shift* ("What you can cram into a single $&!#* vector", §3.1, BShift):
in half of the sentences two adjacent words are swapped, and a probe must tell ``original`` from ``swapped``.
Every word of a sentence stays in it, so a bag of words (the embedding layer, mean-pooled) carries almost no
signal, while the word order that the encoder's layers read does: Jawahar et al. (2019) find BShift rising through
BERT's middle layers. The demo sentiment set, in contrast, is lexical: one opinion word decides the label.

Sentences: UD English-EWT dev (CC BY-SA 4.0, Silveira et al. 2014), the ``# text`` of each sentence of 6 to 20
words (word lines with integer ids). A swapped sentence exchanges two adjacent alphabetic, different, non-initial
words (so capitalisation does not give it away) and is rebuilt with the treebank's own spacing (``SpaceAfter=No``).
Balanced: 500 original, 500 swapped, from 1,000 different sentences. Deterministic (seed 0).

    python scripts/make_demo_wordorder.py [path/to/en_ewt-ud-dev.conllu.gz]
"""

import csv
import gzip
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "analysis" / "data" / "demo_wordorder.csv"
SOURCE = ROOT.parent / "shared" / "data" / "ud_english_ewt" / "en_ewt-ud-dev.conllu.gz"
PER_CLASS = 500


def sentences(path: Path):
    """(sent_id, words, spaces after) of each sentence: word lines with integer ids, in order."""
    sent_id, words, spaces = None, [], []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("# sent_id"):
                sent_id = line.split("=", 1)[1].strip()
            elif not line:
                if words:
                    yield sent_id, words, spaces
                sent_id, words, spaces = None, [], []
            elif not line.startswith("#"):
                cols = line.split("\t")
                if cols[0].isdigit():  # not a multiword range (1-2) or an empty node (8.1)
                    words.append(cols[1])
                    spaces.append("SpaceAfter=No" not in cols[9])


def text_of(words: list[str], spaces: list[bool]) -> str:
    return "".join(w + (" " if s else "") for w, s in zip(words, spaces, strict=True)).strip()


def main(source: Path = SOURCE, out: Path = OUT) -> None:
    rng = random.Random(0)
    pool = [(i, w, s) for i, w, s in sentences(source) if 6 <= len(w) <= 20]
    rng.shuffle(pool)
    rows = []
    for sent_id, words, spaces in pool:
        label = "swapped" if len(rows) % 2 else "original"
        if label == "swapped":
            spots = [k for k in range(1, len(words) - 1) if words[k].isalpha() and words[k + 1].isalpha()
                     and words[k].lower() != words[k + 1].lower()]
            if not spots:
                continue
            k = rng.choice(spots)
            words = [*words[:k], words[k + 1], words[k], *words[k + 2:]]
        rows.append((text_of(words, spaces), label, sent_id))
        if len(rows) == 2 * PER_CLASS:
            break
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label", "sent_id"])
        writer.writerows(rows)
    print(f"wrote {out} ({len(rows)} rows)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else SOURCE)
