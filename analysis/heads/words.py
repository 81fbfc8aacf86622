"""Word-level attention from subword attention, Clark et al. 2019 §4.1 ("What Does BERT Look At?"):

    "we convert token-token attention maps to word-word attention maps. For attention *to* a split-up word, we
    sum up the attention weights over its tokens. For attention *from* a split-up word, we take the mean of the
    attention weights over its tokens."

With ``S`` the ``(tokens, words)`` indicator of which word each subword belongs to and ``M = diag(1 / pieces)
S^T`` the mean over each word's pieces, the word map is ``W = M A S`` ``(words, words)``: rows still sum to 1
less the attention that went to special tokens ([CLS]/[SEP], ``<s>``/``</s>``), which belong to no word and are
dropped, as in Clark et al.'s code. The alignment is the tokenizer's own word ids
(:func:`analysis.core.activations.encode_words`), so WordPiece, SentencePiece (ALBERT, XLM-R) and byte-level BPE
(RoBERTa) are handled alike; tests check all three against a loop over transformers' ``word_ids()``.
"""

from __future__ import annotations

import numpy as np
import torch


def pooling_matrices(word_ids: list[list[int | None]], n_words: list[int], width: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, total)`` for a batch: ``mean`` ``(batch, words, width)`` averages the rows of a word's pieces,
    ``total`` ``(batch, width, words)`` sums the columns of a word's pieces (``words`` = the batch's longest
    sentence in words; padding rows and columns are zero)."""
    batch, most = len(word_ids), max(n_words)
    total = np.zeros((batch, width, most), dtype=np.float32)
    for b, ids in enumerate(word_ids):
        for t, w in enumerate(ids):
            if w is not None:
                total[b, t, w] = 1.0
    pieces = total.sum(1)  # (batch, words)
    mean = np.transpose(total, (0, 2, 1)) / np.maximum(pieces, 1)[:, :, None]
    return torch.from_numpy(mean), torch.from_numpy(total)


def word_attention(attn: torch.Tensor, mean: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``(batch, heads, words, words)`` word-to-word attention from ``attn`` ``(batch, heads, width, width)``
    (Clark §4.1: mean over the attending word's pieces, sum over the attended word's pieces)."""
    return mean[:, None].to(attn.dtype) @ attn @ total[:, None].to(attn.dtype)


def word_attention_loop(attn: np.ndarray, word_ids: list[int | None], n_words: int) -> np.ndarray:
    """The same for one sentence's ``(heads, tokens, tokens)`` map, word by word (the tests' reference)."""
    out = np.zeros((attn.shape[0], n_words, n_words))
    for i in range(n_words):
        rows = [t for t, w in enumerate(word_ids) if w == i]
        for j in range(n_words):
            cols = [t for t, w in enumerate(word_ids) if w == j]
            out[:, i, j] = attn[:, rows][:, :, cols].sum(-1).mean(-1)
    return out
