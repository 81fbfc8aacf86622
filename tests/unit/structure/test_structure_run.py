"""One linguistic-structure run (analysis.structure.run): every probe step reported and a Stop honoured within a
layer; the position baselines against a plain computation; several seeds pooled into the summary's intervals."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.core.treebank import read_conllu
from analysis.structure import mdl, probes
from analysis.structure.options import StructureOptions
from analysis.structure.run import run_structure
from models.loading import load_model
from models.spec import ModelSpec
from tests.support.data import FIXTURES

TRAIN, TEST = read_conllu(FIXTURES / "ud_tiny_train.conllu"), read_conllu(FIXTURES / "ud_tiny_test.conllu")


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
    return load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))


def _blocks() -> int:
    """The MDL blocks of UPOS on the tiny training file (every sentence fits the tiny model)."""
    words = sum(len(s) for s in TRAIN.sentences)
    return len(mdl.block_ends(words)) - 1


def test_every_probe_step_is_reported_as_it_ends(tiny):
    """The stage 'probes' counts each fit, each MDL block and each structural epoch, not (layer, task) results:
    a layer's first report no longer waits for its whole MDL chain (issue 34: 254 s at 'test word vectors
    2029/2029' on full EWT, which were layer 0's UPOS task, control and 10 MDL fits)."""
    seen = []
    options = StructureOptions(tasks="upos,distance", layers="0,2", max_epochs=3, rank=4)
    run_structure(tiny, TRAIN, TEST, options, progress=lambda stage, done, total: seen.append((stage, done, total)))
    steps = [(d, t) for stage, d, t in seen if stage == "probes"]
    per_layer = 2 + _blocks() + options.max_epochs  # task, control, MDL blocks; the distance probe's epochs
    assert {t for _, t in steps} == {2 * per_layer}
    done = [d for d, _ in steps]
    assert done == sorted(set(done)) and done[-1] == 2 * per_layer
    assert len(done) >= 2 * (2 + _blocks() + 1)  # every fit and block on its own; the epochs (an early stop: at once)


def test_a_stop_ends_the_running_fits_at_their_next_step(tiny, monkeypatch):
    """A Stop (progress raising) at the first step: the fits not started are dropped and the MDL chain ends at
    its next block, so far fewer than the layer's task + control + MDL fits run."""
    from analysis.structure import softmax

    fits = []
    real = softmax.fit_softmax

    def counted(*args, **kwargs):
        fits.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(softmax, "fit_softmax", counted)
    monkeypatch.setattr(probes, "fit_softmax", counted)

    def progress(stage, done, total):
        if stage == "probes":
            raise KeyboardInterrupt("Stop")

    with pytest.raises(KeyboardInterrupt):
        run_structure(tiny, TRAIN, TEST, StructureOptions(tasks="upos", layers="0"), progress=progress)
    assert 1 <= len(fits) < 2 + _blocks()


def _chain_and_root_baselines(train, test):
    """Written out: the chain's edges between consecutive non-punctuation words against the gold arcs between
    non-punctuation words; the training file's most frequent root index among non-punctuation words."""
    hit = total = 0
    for s in test:
        keep = [i for i, u in enumerate(s.upos) if u != "PUNCT"]
        gold = {frozenset((i, s.heads[i] - 1)) for i in keep if s.heads[i] and s.upos[s.heads[i] - 1] != "PUNCT"}
        chain = {frozenset(p) for p in zip(keep, keep[1:], strict=False)}
        hit, total = hit + len(gold & chain), total + len(gold)
    places = {}
    for s in train:
        keep = [i for i, u in enumerate(s.upos) if u != "PUNCT"]
        if s.root in keep:
            places[keep.index(s.root)] = places.get(keep.index(s.root), 0) + 1
    k = sorted(places, key=lambda p: (-places[p], p))[0]
    roots = [s.root == keep[min(k, len(keep) - 1)] for s in test
             if (keep := [i for i, u in enumerate(s.upos) if u != "PUNCT"])]
    return hit / total, float(np.mean(roots)), k


def test_the_position_baselines_are_the_chain_and_the_commonest_root_place(tiny):
    result = run_structure(tiny, TRAIN, TEST, StructureOptions(tasks="distance,depth", layers="0,1", max_epochs=1,
                                                                rank=4))
    uuas, root, k = _chain_and_root_baselines(TRAIN.sentences, TEST.sentences)
    rows = result.probes.set_index(["task", "metric"])
    assert rows.loc[("distance", "uuas"), "position_baseline"].tolist() == pytest.approx([uuas] * 2)
    assert rows.loc[("depth", "root_acc"), "position_baseline"].tolist() == pytest.approx([root] * 2)
    assert rows.loc[("distance", "spearman"), "position_baseline"].isna().all()
    assert result.info["position_baselines"]["root_position"] == k
