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
from tests.support.data import FIXTURES


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


def most_attending_other(column: np.ndarray, i: int) -> int:
    """Clark's transposed reading: the other word that attends most to word ``i``."""
    return most_attended_other(column, i)


@pytest.mark.parametrize(("reading", "symmetry"), [("clark", "sum"), ("row", "max")])
def test_accuracy_baseline_and_uuas_equal_a_brute_force_loop(tiny_dirs, treebank, reading, symmetry):
    """Issue 43 items 6 and 7: every count against a loop over sentences and words; the best head and the best
    offset are chosen on the selection split (even sentences) and scored on the held-out split (odd ones), with
    Wilson's interval on the held-out words; head -> dependent is Clark's transposed map (the word attending most
    to the dependent is its head) or the head word's own row; trees are over W + W^T (Clark's "both") or
    max(W, W^T)."""
    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    result = analyse(loaded, treebank, batch_size=4, max_cells=2000, min_count=1, reading=reading,
                     symmetry=symmetry)
    sentences = treebank.sentences
    maps = brute_force_word_maps(tiny_dirs["bert"], sentences)
    layers, heads = maps[0].shape[:2]
    correct, count, offsets = Counter(), Counter(), {}
    tree_correct, tree_total = np.zeros((2, layers, heads), int), np.zeros(2, int)
    for k, (s, w) in enumerate(zip(sentences, maps, strict=True)):
        split = k % 2
        for i, (h, rel) in enumerate(zip(s.heads, s.deprels, strict=True)):
            if h == 0:
                continue
            count[split, rel] += 1
            offsets.setdefault((split, rel), Counter())[h - 1 - i] += 1
            for layer in range(layers):
                for head in range(heads):
                    a = w[layer, head]
                    correct[split, rel, 0, layer, head] += most_attended_other(a[i], i) == h - 1
                    hit = (most_attending_other(a[:, i], i) == h - 1 if reading == "clark" else
                           most_attended_other(a[h - 1], h - 1) == i)
                    correct[split, rel, 1, layer, head] += hit
        for layer in range(layers):
            for head in range(heads):
                a = w[layer, head]
                sym = a + a.T if symmetry == "sum" else np.maximum(a, a.T)
                c, t, _, _ = uuas_counts(-sym, s)  # the structure analysis' own code on the same edges
                tree_correct[split, layer, head] += c
        tree_total[split] += uuas_counts(np.zeros((len(s), len(s))), s)[1]
    relations = sorted({rel for (_, rel) in count})
    acc = result.accuracies
    for row in acc.itertuples():
        d = DIRECTIONS.index(row.direction)
        assert row.correct == sum(correct[x, row.relation, d, row.layer - 1, row.head] for x in (0, 1)), row
        assert row.count == count[0, row.relation] + count[1, row.relation]
    table = result.relations
    assert list(table.columns) == ["relation", "direction", "layer", "head", "accuracy", "low", "high",
                                   "baseline_offset", "baseline_accuracy", "count", "selection_accuracy",
                                   "selection_count"]
    scored = [r for r in relations if count[0, r] and count[1, r]]
    assert sorted(set(table["relation"])) == scored and len(table) == 2 * len(scored)
    for row in table.itertuples():
        d = DIRECTIONS.index(row.direction)
        grid = {x: np.array([[correct[x, row.relation, d, la, h] for h in range(heads)] for la in range(layers)])
                for x in (0, 1)}
        flat = int(np.argmax(grid[0].ravel()))  # chosen on the selection split, ties: the first
        assert (row.layer - 1, row.head) == divmod(flat, heads)
        assert row.selection_accuracy == grid[0].max() / count[0, row.relation]
        assert row.selection_count == count[0, row.relation] and row.count == count[1, row.relation]
        held = int(grid[1].ravel()[flat])
        assert row.accuracy == held / row.count and (row.low, row.high) == wilson_interval(held, row.count)
        k, _ = min(offsets[0, row.relation].items(), key=lambda kv: (-kv[1], abs(kv[0]), kv[0]))
        assert row.baseline_offset == (k if d == 0 else -k)
        assert row.baseline_accuracy == offsets[1, row.relation][k] / row.count
    uuas = result.uuas
    assert (uuas["edges"] == tree_total.sum()).all()
    np.testing.assert_array_equal(uuas["correct"].to_numpy().reshape(layers, heads), tree_correct.sum(0))
    best = result.info["best_tree"]
    flat = int(np.argmax(tree_correct[0].ravel()))
    assert (best["layer"] - 1, best["head"]) == divmod(flat, heads)
    assert best["uuas"] == tree_correct[1].ravel()[flat] / tree_total[1]
    assert best["selection_uuas"] == tree_correct[0].max() / tree_total[0]


def test_relations_under_the_minimum_count_are_left_out_and_named(tiny_dirs, treebank):
    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    result = analyse(loaded, treebank, batch_size=4, max_cells=2000, min_count=3, statistics=False,
                     clusters=False)
    held = result.accuracies.groupby("relation")["count"].first()
    left_out = result.info["relations_under_min_count"]
    assert left_out and all(min(counts) < 3 for counts in left_out.values())
    assert (result.relations["count"] >= 3).all() and (result.relations["selection_count"] >= 3).all()
    assert set(result.relations["relation"]).isdisjoint(left_out) and set(left_out) <= set(held.index)


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
    parsing = Parsing(1, 1, relations_of(sents), min_count=1)
    both = sents + sents  # each sentence once in the selection split, once in the held-out one
    batch = parsing.batch(both, [0] * len(sents) + [1] * len(sents))
    n = max(map(len, sents))
    w = torch.zeros((len(both), 1, n, n), dtype=torch.float64)
    for b, s in enumerate(both):
        for i in range(1, len(s)):
            w[b, 0, i, i - 1] = 1.0
        w[b, 0, 0, 0] = 1.0  # the first word attends to itself: no prediction
    parsing.add(0, w, batch)
    acc = parsing.accuracies()
    d2h = acc[acc.direction == "dependent_to_head"].set_index("relation")
    for r, relation in enumerate(parsing.relations):
        previous = parsing.offsets[r][-1] + parsing.offsets[len(parsing.relations) + r][-1]
        assert d2h.loc[relation, "correct"] == previous
    table = parsing.table().set_index(["relation", "direction"])
    for relation in ("amod", "obj"):  # relations whose most frequent offset is -1
        row = table.loc[(relation, "dependent_to_head")]
        assert row["baseline_offset"] == -1 and row["accuracy"] == row["baseline_accuracy"]
        assert row["selection_accuracy"] == row["accuracy"]  # the same sentences in both splits


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


def test_a_batch_out_of_memory_is_read_again_in_halves_to_the_same_tables(tiny_dirs, treebank, monkeypatch):
    """Issue 45 (the heads engine on the extraction loop's memory rule): when the forward pass of a batch runs out of
    memory, the batch is read again in halves (nothing was summed yet); every table equals a run that never ran
    out, to float rounding (the sums are added in other groups)."""
    import analysis.heads.run as run

    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    options = dict(batch_size=4, max_cells=4000, cluster_tokens=64, min_count=1)
    whole = analyse(loaded, treebank, **options)
    real, sizes = run.attentions, []

    def small_memory(model, inputs, name):
        sizes.append(len(inputs["input_ids"]))
        if len(inputs["input_ids"]) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, inputs, name)
    monkeypatch.setattr(run, "attentions", small_memory)
    halved = analyse(loaded, treebank, **options)
    assert max(sizes) == 4 and sizes.count(1) == len(treebank.sentences)  # each sentence read alone, once
    for name in ("heads", "clusters", "relations", "accuracies", "uuas"):
        pd.testing.assert_frame_equal(getattr(halved, name), getattr(whole, name), check_exact=False, rtol=1e-5,
                                      atol=1e-6, obj=name)
    assert halved.info["sentences"] == whole.info["sentences"]


def test_out_of_memory_once_summing_began_is_an_error_not_a_retry(tiny_dirs, treebank, monkeypatch):
    """A retry after some of a batch's sums were added would count its rows twice: one line, not a retry."""
    import analysis.heads.run as run

    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))

    def full(self, layer, a, n, flags):
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 1 GB")
    monkeypatch.setattr(run.TokenStatistics, "add", full)
    with pytest.raises(RuntimeError, match="while summing a batch of 4 sentences: lower --batch-size"):
        analyse(loaded, treebank, batch_size=4, max_cells=4000)
