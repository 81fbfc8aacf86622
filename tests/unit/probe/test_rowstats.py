import numpy as np
import torch

from analysis.probe.rowstats import row_stats_numpy, row_stats_torch


def test_numba_kernel_matches_torch():
    torch.manual_seed(0)
    logits = torch.randn(300, 1000) * 3
    targets = torch.randint(0, 1000, (300,))
    fast = row_stats_numpy(logits.numpy().copy(), targets.numpy(), 5)
    ref = row_stats_torch(logits, targets, 5)
    for name, a, b in zip(["pred", "prob", "rank", "top_ids", "top_probs"], fast, ref, strict=True):
        if name in {"prob", "top_probs"}:
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b.numpy(), err_msg=name)


def test_ties_take_the_first_index_and_rank_counts_strictly_greater():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], dtype=np.float32)
    pred, prob, rank, top_ids, top_probs = row_stats_numpy(logits.copy(), np.array([2, 3]), 2)
    assert pred.tolist() == [1, 0]  # torch.argmax also returns the first maximum
    assert rank.tolist() == [1, 1]  # nothing is strictly greater than a tied target
    assert top_ids.tolist() == [[1, 2], [0, 1]]
    np.testing.assert_allclose(prob, [np.exp(3) / (np.exp(1) + 2 * np.exp(3) + 1), 0.25], rtol=1e-6)
    assert torch.argmax(torch.from_numpy(logits), -1).tolist() == pred.tolist()


def test_k_larger_than_vocabulary():
    out = row_stats_numpy(np.array([[0.5, 0.1]], dtype=np.float32), np.array([1]), 5)
    assert out[3].shape == (1, 2)
