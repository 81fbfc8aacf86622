"""Heads as parsers (analysis.heads.parse; Clark et al. 2019 §4.2): per-relation accuracy and the fixed-offset
baseline against a brute-force loop over the treebank, the attention trees' UUAS against the structure analysis'
own MST and punctuation code (analysis.core.trees) on the same edges, a planted previous-word head, and a treebank
with no relation in common."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from analysis.core.inputs import InputError
from analysis.core.scores import wilson_interval
from analysis.core.treebank import Sentence, Treebank, read_conllu
from analysis.core.trees import prim_edges, uuas_counts
from analysis.heads.model import load_eager
from analysis.heads.parse import DIRECTIONS, Parsing, prim_parents, relations_of
from analysis.heads.run import analyse
from analysis.heads.words import word_attention_loop
from models.loading import ModelSpec
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def treebank() -> Treebank:
    return read_conllu(FIXTURES / "ud_tiny_train.conllu")


def brute_force_word_maps(directory, sentences):
    """Per sentence ``(layers, heads, n, n)`` word attention: one sentence at a time through transformers."""
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    out = []
    for s in sentences:
        enc = tok(list(s.words), is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            maps = model(**enc, output_attentions=True).attentions
        out.append(np.stack([word_attention_loop(a[0].double().numpy(), enc.word_ids(), len(s)) for a in maps]))
    return out


def most_attended_other(row: np.ndarray, i: int) -> int:
    best, where = 0.0, -1
    for j, value in enumerate(row):
        if j != i and value > best:
            best, where = value, j
    return where


def test_accuracy_baseline_and_uuas_equal_a_brute_force_loop(tiny_dirs, treebank):
    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    result = analyse(loaded, treebank, batch_size=4, max_cells=2000)
    sentences = treebank.sentences
    maps = brute_force_word_maps(tiny_dirs["bert"], sentences)
    layers, heads = maps[0].shape[:2]
    correct, count, offsets = Counter(), Counter(), {}
    tree_correct, tree_total = np.zeros((layers, heads), int), 0
    for s, w in zip(sentences, maps, strict=True):
        for i, (h, rel) in enumerate(zip(s.heads, s.deprels, strict=True)):
            if h == 0:
                continue
            count[rel] += 1
            offsets.setdefault(rel, Counter())[h - 1 - i] += 1
            for layer in range(layers):
                for head in range(heads):
                    correct[rel, 0, layer, head] += most_attended_other(w[layer, head, i], i) == h - 1
                    correct[rel, 1, layer, head] += most_attended_other(w[layer, head, h - 1], h - 1) == i
        for layer in range(layers):
            for head in range(heads):
                sym = np.maximum(w[layer, head], w[layer, head].T)
                c, t, _, _ = uuas_counts(-sym, s)  # the structure analysis' own code on the same edges
                tree_correct[layer, head] += c
        tree_total += uuas_counts(np.zeros((len(s), len(s))), s)[1]
    acc = result.accuracies
    for row in acc.itertuples():
        d = DIRECTIONS.index(row.direction)
        assert row.correct == correct[row.relation, d, row.layer - 1, row.head], row
        assert row.count == count[row.relation]
    table = result.relations
    assert list(table.columns) == ["relation", "direction", "layer", "head", "accuracy", "low", "high",
                                   "baseline_offset", "baseline_accuracy", "count"]
    assert set(table["relation"]) == set(count) and len(table) == 2 * len(count)
    for row in table.itertuples():
        d = DIRECTIONS.index(row.direction)
        grid = np.array([[correct[row.relation, d, la, h] for h in range(heads)] for la in range(layers)])
        assert row.accuracy == grid.max() / count[row.relation]
        assert grid[row.layer - 1, row.head] == grid.max() and (row.low, row.high) == wilson_interval(grid.max(),
                                                                                                       row.count)
        k, best = min(offsets[row.relation].items(), key=lambda kv: (-kv[1], abs(kv[0]), kv[0]))
        assert row.baseline_accuracy == best / count[row.relation]
        assert row.baseline_offset == (k if d == 0 else -k)
    uuas = result.uuas
    assert (uuas["edges"] == tree_total).all()
    np.testing.assert_array_equal(uuas["correct"].to_numpy().reshape(layers, heads), tree_correct)


def test_batched_prim_equals_the_structure_analysis_mst():
    rng = np.random.default_rng(0)
    sizes = np.array([1, 2, 5, 7, 7, 3])
    m = 7
    dist = rng.random((len(sizes), m, m))
    dist = dist + np.swapaxes(dist, 1, 2)
    parent = prim_parents(dist, sizes)
    for g, n in enumerate(sizes):
        edges = {(min(j, int(parent[g, j])), max(j, int(parent[g, j]))) for j in range(1, n)}
        assert edges == prim_edges(dist[g, :n, :n])


def sentence(heads, rels, upos=None) -> Sentence:
    n = len(heads)
    return Sentence(str(n), 1, tuple(f"w{i}" for i in range(n)), tuple(upos or ["NOUN"] * n), tuple(heads),
                    tuple(rels))


def test_a_previous_word_head_equals_the_offset_baseline():
    """A head that attends to the previous word: its dependent -> head accuracy for every relation is the
    share of that relation's words whose head is the previous word, which is the baseline at offset -1."""
    sents = [sentence([2, 0, 2, 3, 3], ["det", "root", "obj", "amod", "punct"]),
             sentence([0, 1, 2, 1], ["root", "amod", "det", "obj"]),
             sentence([3, 3, 0, 3, 4], ["det", "amod", "root", "obj", "det"])]
    parsing = Parsing(1, 1, relations_of(sents))
    batch = parsing.batch(sents)
    n = max(map(len, sents))
    w = torch.zeros((len(sents), 1, n, n), dtype=torch.float64)
    for b, s in enumerate(sents):
        for i in range(1, len(s)):
            w[b, 0, i, i - 1] = 1.0
        w[b, 0, 0, 0] = 1.0  # the first word attends to itself: no prediction
    parsing.add(0, w, batch)
    acc = parsing.accuracies()
    d2h = acc[acc.direction == "dependent_to_head"].set_index("relation")
    for r, relation in enumerate(parsing.relations):
        previous = parsing.offsets[r][-1]
        assert d2h.loc[relation, "correct"] == previous
    table = parsing.table().set_index(["relation", "direction"])
    for relation in ("amod", "obj"):  # relations whose most frequent offset is -1
        row = table.loc[(relation, "dependent_to_head")]
        assert row["baseline_offset"] == -1 and row["accuracy"] == row["baseline_accuracy"]


def test_relations_in_common(treebank):
    assert "nsubj" in relations_of(treebank.sentences)
    assert relations_of(treebank.sentences, ["nsubj", "no-such"]) == ["nsubj"]
    with pytest.raises(InputError, match="none of the relations asked for") as err:
        relations_of(treebank.sentences, ["no-such", "other"])
    assert "\n" not in str(err.value)


def test_a_treebank_with_no_relation_in_common_is_one_line(tiny_dirs, treebank):
    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    with pytest.raises(InputError, match="none of the relations asked for"):
        analyse(loaded, treebank, relations=["no-such-relation"])


def test_a_stopped_run_resumes_to_the_numbers_of_a_run_never_stopped(tiny_dirs, treebank, tmp_path):
    """The sums are saved when a run is stopped (should_stop, or a progress hook raising: a job's cancel), and the
    same run started again continues after the last batch summed; every table equals an uninterrupted run's."""
    from analysis.heads.run import Stopped

    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    options = dict(batch_size=2, max_cells=2000, cluster_tokens=64)
    whole = analyse(loaded, treebank, **options)
    calls = []

    def cancel_at_third(stage, done, total):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a cancel raised from the progress hook
    with pytest.raises(KeyboardInterrupt):
        analyse(loaded, treebank, progress=cancel_at_third, resume=tmp_path, **options)
    saved = list(tmp_path.glob("*.npz"))
    assert len(saved) == 1
    with pytest.raises(Stopped):  # stopped again at once: nothing is lost, nothing counted twice
        analyse(loaded, treebank, should_stop=lambda: True, resume=tmp_path, **options)
    seen = []
    again = analyse(loaded, treebank, progress=lambda s, d, t: seen.append(d), resume=tmp_path, **options)
    assert again.info["resumed_after"] == calls[2] and seen[0] > calls[2] and seen[-1] == len(treebank.sentences)
    assert not list(tmp_path.glob("*.npz"))  # removed once complete
    for name in ("heads", "clusters", "relations", "accuracies", "uuas"):
        pd.testing.assert_frame_equal(getattr(again, name), getattr(whole, name), check_exact=True, obj=name)
    other = analyse(loaded, treebank, resume=tmp_path, **{**options, "batch_size": 3})  # another plan: no resume
    assert "resumed_after" not in other.info


def test_an_unreadable_checkpoint_starts_afresh(tiny_dirs, treebank, tmp_path):
    from analysis.heads.run import Stopped

    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    with pytest.raises(Stopped):
        analyse(loaded, treebank, batch_size=2, max_cells=2000, should_stop=lambda: True, resume=tmp_path)
    (saved,) = tmp_path.glob("*.npz")
    saved.write_bytes(b"cut")
    result = analyse(loaded, treebank, batch_size=2, max_cells=2000, resume=tmp_path)
    assert "resumed_after" not in result.info and result.info["sentences"] > 0
