"""Writes ``analysis/data/demo_sentiment.csv``: the small labelled set bundled for the Layer atlas.

Sentences are composed from hand-written parts (five domains, their aspect terms, and opinions of each
polarity), so every row is plain, grammatical English with a known label. Most rows name an aspect term
(the ``aspect`` column, for sentence + aspect pairs as in aspect-based sentiment); sentence-level rows leave
it empty.
Deterministic: running it again writes the same file.

    python scripts/make_demo_sentiment.py
"""

import csv
import itertools
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "analysis" / "data" / "demo_sentiment.csv"

DOMAINS = {
    "restaurant": ["food", "service", "pasta", "dessert", "wine list", "staff", "prices", "atmosphere"],
    "laptop": ["battery", "screen", "keyboard", "speakers", "price", "trackpad", "fan", "charger"],
    "hotel": ["room", "bed", "breakfast", "location", "pool", "staff", "shower", "view"],
    "phone": ["camera", "battery", "screen", "price", "signal", "case", "charger", "speaker"],
    "film": ["plot", "acting", "music", "ending", "dialogue", "pacing", "cast", "soundtrack"],
}
OPINIONS = {
    "positive": ["The {a} was excellent.", "I really loved the {a}.", "The {a} is wonderful and worth it.",
                 "Honestly, the {a} exceeded every expectation.", "The {a} was a real delight.",
                 "We were impressed by the {a}.", "The {a} could not have been better."],
    "negative": ["The {a} was terrible.", "I really hated the {a}.", "The {a} is awful and not worth it.",
                 "Honestly, the {a} was a huge disappointment.", "The {a} was a complete mess.",
                 "We were annoyed by the {a}.", "The {a} could not have been worse."],
    "neutral": ["The {a} was as described.", "I noticed the {a} only once.", "The {a} is the usual kind.",
                "There was a {a}, as listed.", "The {a} was neither good nor bad.",
                "We asked about the {a} before booking.", "The {a} is similar to the last one."],
}
PLAIN = {
    "positive": ["What a lovely {d} experience this was.", "This {d} made my whole week better.",
                 "I would happily recommend this {d} to anyone.", "Everything about this {d} felt just right.",
                 "A great {d}, and I will be back for more."],
    "negative": ["What a dreadful {d} experience this was.", "This {d} ruined my whole week.",
                 "I would never recommend this {d} to anyone.", "Nothing about this {d} felt right.",
                 "A poor {d}, and I will not be back."],
    "neutral": ["I went to see about a {d} on Tuesday.", "This {d} is one of several in the area.",
                "The {d} opened some years ago.", "I read a short article about this {d}.",
                "The {d} is listed on the usual websites."],
}


def rows() -> list[dict]:
    out = []
    for label, templates in OPINIONS.items():
        for (domain, aspects), (t, template) in itertools.product(DOMAINS.items(), enumerate(templates)):
            for aspect in (aspects[t % 8], aspects[(t + 3) % 8], aspects[(t + 5) % 8]):
                out.append({"text": template.format(a=aspect), "aspect": aspect, "label": label, "domain": domain})
    for label, templates in PLAIN.items():
        for domain, template in itertools.product(DOMAINS, templates):
            out.append({"text": template.format(d=domain), "aspect": "", "label": label, "domain": domain})
    unique = list({r["text"] + "|" + r["aspect"]: r for r in out}.values())
    random.Random(0).shuffle(unique)
    return unique


def main() -> None:
    data = rows()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "aspect", "label", "domain"])
        writer.writeheader()
        writer.writerows(data)
    print(f"wrote {len(data)} rows to {OUT}")


if __name__ == "__main__":
    main()
