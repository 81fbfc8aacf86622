"""Issue 53 item 12: a layer's prunable share is said with whether the allowed drop is one the targets resolve."""

import math

from analysis.heads.importance import drop_resolution


def test_a_one_point_drop_on_493_targets_is_within_noise():
    said = drop_resolution(0.375, 493, 0.01)
    assert math.isclose(said["accuracy_se"], math.sqrt(0.375 * 0.625 / 493))  # 2.2 points
    assert not said["drop_resolved"] and "within noise" in said["prunable_note"] and "4.4%" in said["prunable_note"]


def test_enough_targets_resolve_it():
    said = drop_resolution(0.375, 20_000, 0.01)
    assert said["drop_resolved"] and "within noise" not in said["prunable_note"]


def test_head_importance_reads_class_ids_as_the_classifier_lens_does():
    """Issue 53 item 16: heads importance --data refused 0/1 labels that lens classifier accepts; one reading now."""
    import pytest

    from analysis.core.inputs import InputError, TextInputs, class_ids
    from analysis.heads.batches import classifier_batches
    from tests.support.models import tiny_tokenizer

    data = TextInputs(("a good film", "a bad film", "fine"), labels=("1", "negative", "0"))
    batches = classifier_batches(tiny_tokenizer(), data, {"negative": 0, "positive": 1}, 16)
    assert sorted(int(x) for b in batches for x in b.labels) == sorted(class_ids(data.labels, ["negative", "positive"]))
    with pytest.raises(InputError, match="nor a class id 0..1"):
        classifier_batches(tiny_tokenizer(), TextInputs(("x",), labels=("7",)), {"negative": 0, "positive": 1}, 16)
