"""The certified MLM head (issue 26): the vocabulary product in bfloat16 where the machine has bf16 matrix units,
every row's rounding error bounded, and a row the bound cannot certify recomputed in float32 (the policy that
chooses it: :mod:`analysis.core.precision`).

The bound (Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, §3.1: a dot product of length h in
floating point has error at most gamma_h * sum|x_i y_i|, gamma_h = h u / (1 - h u)). For a row ``z`` (the head's
transform output) and a vocabulary row ``w`` with bias ``b``:

- rounding z and w to bfloat16 (unit roundoff U = 2^-8) changes the exact product by at most
  (2U + U^2) * |z| * |w| (|z_i w_i| summed, then Cauchy-Schwarz);
- the float32 accumulation adds at most gamma_h (1 + U)^2 |z| |w| (u = 2^-24);
- torch's CPU bfloat16 product returns bfloat16, so its result is rounded once more: U (1 + U)^2 (1 + gamma_h)
  |z| |w|;
- the float32 reference itself is off the exact value by gamma_h |z| |w|, and the two bias additions by
  2u (|z| |w| + |b|) each.

So every logit of row i is within ``E_i = c * |z_i| * max_j |w_j| + 4u * max_j |b_j|`` of the float32 reference's,
``c = 2U + U^2 + gamma_h ((1 + U)^2 + 1) + U (1 + U)^2 (1 + gamma_h) + 4u`` (:meth:`CertifiedHead.bound`). A row
is certified when its top-k+1 logits are more than ``2 E_i`` apart in turn (argmax, top-k order, and the k-th
against all the rest) and no other logit is within ``2 E_i`` of the target's (the rank); the rest are recomputed
in float32 exactly as the ``float32`` mode computes them. Probabilities: the target's and the top-k logits are
recomputed in float32 (one dot product each), the normaliser uses the bfloat16 logits for every other token, so
``|log p - log p_float32| <= log(1 + r_i (exp(E_i) - 1))`` plus the float32 noise of two float32 logits of the
same token (``4 (gamma_h + 2u) |z_i| max|w| + 8u max|b|``), where ``r_i`` is the share of the probability mass
outside the recomputed tokens; each row's bound is kept and the largest is reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref

import numpy as np
import torch

U_BF16 = 2.0 ** -8  # unit roundoff of bfloat16 (8 significand bits, round to nearest)
U_F32 = 2.0 ** -24
CANDIDATES = 11  # logits recomputed in float32 beyond the top-k: they settle the top-k and most of the normaliser
NEAR_SHARE, NEAR_MIN = 64, 16  # a row's rank is settled token by token when at most vocab / 64 (>= 16) are near
PAIR_CHUNK = 8192  # (row, token) pairs gathered at once when settling ranks: 8192 x hidden floats


@dataclasses.dataclass
class Certified:
    """What the certified path did: rows scored, rows recomputed in float32, the largest logit bound ``E_i`` and
    the largest bound on ``|log p - log p_float32|`` of a reported probability."""

    rows: int = 0
    recomputed: int = 0
    settled: int = 0  # rows whose rank was settled token by token (not recomputed)
    max_logit_bound: float = 0.0
    max_log_prob_bound: float = 0.0
    rows_per_state: list[int] = dataclasses.field(default_factory=list)  # per hidden state read, in order
    recomputed_per_state: list[int] = dataclasses.field(default_factory=list)

    def add(self, other: Certified) -> None:
        self.rows += other.rows
        self.recomputed += other.recomputed
        self.settled += other.settled
        for mine, theirs in ((self.rows_per_state, other.rows_per_state),
                             (self.recomputed_per_state, other.recomputed_per_state)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, value in enumerate(theirs):
                mine[i] += value
        self.max_logit_bound = max(self.max_logit_bound, other.max_logit_bound)
        self.max_log_prob_bound = max(self.max_log_prob_bound, other.max_log_prob_bound)

    def to_dict(self) -> dict:
        """The counts, and per hidden state the share of rows certified (not recomputed in float32)."""
        out = dataclasses.asdict(self)
        out["certified_share_per_state"] = [round(1 - r / n, 6) if n else None for r, n in
                                            zip(self.recomputed_per_state, self.rows_per_state, strict=True)]
        return out

    def count_states(self, sure: torch.Tensor, states: int) -> None:
        """Add a block's rows, ``states`` hidden states one after another (``sure``: each row certified)."""
        if states <= 0 or len(sure) % states:
            return
        per = sure.reshape(states, -1)
        rows = [per.shape[1]] * states
        redo = (~per).sum(1).tolist()
        self.add(Certified(rows_per_state=rows, recomputed_per_state=redo))


class CertifiedHead:
    """``decoder(transform(h))`` scored with the vocabulary product in bfloat16, certified row by row against the
    float32 result (module docstring). Holds a bfloat16 copy of the decoder's weight (made once per weight)."""

    def __init__(self, transform, decoder: torch.nn.Linear):
        self.transform, self.decoder = transform, decoder
        weight = decoder.weight.detach()
        self.weight = weight.float()
        self.bias = (decoder.bias.detach().float() if decoder.bias is not None
                     else torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device))
        self.weight16 = _bf16_copy(weight)
        self.wmax = float(self.weight.norm(dim=1).max()) * (1 + 1e-5)  # norms in float32: a hair up
        self.bmax = float(self.bias.abs().max()) if len(self.bias) else 0.0
        h = weight.shape[1] + 1  # the bias enters the reference's sum
        gamma = h * U_F32 / (1 - h * U_F32)
        u = U_BF16
        self.c = 2 * u + u * u + gamma * ((1 + u) ** 2 + 1) + u * (1 + u) ** 2 * (1 + gamma) + 4 * U_F32
        self.c_f32 = 4 * (gamma + 2 * U_F32)  # two float32 logits of the same token: ours and the reference's
        self.stats = Certified()
        self.on_device = False  # the torch path (a GPU's) even on the CPU: the tests run it there

    def bound(self, z: torch.Tensor) -> torch.Tensor:
        """``(n,)``: the most any logit of each row of ``z`` ``(n, hidden)`` can differ from the float32 head's."""
        return self.c * z.norm(dim=1) * (1 + 1e-5) * self.wmax + 4 * U_F32 * self.bmax

    def exact_logits(self, z: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Float32 logits of ``z`` ``(n, hidden)`` for the vocabulary ids ``ids`` ``(n, m)``: ``(n, m)``."""
        return torch.einsum("nh,nmh->nm", z, self.weight[ids]) + self.bias[ids]

    @torch.inference_mode()
    def score(self, states: torch.Tensor, targets: torch.Tensor, k: int, n_states: int = 0):
        """``(pred, prob, rank, top_ids, top_probs)`` of ``states`` ``(n, hidden)`` against ``targets``, equal to
        :func:`analysis.probe.rowstats.row_stats` of the float32 head's logits (probabilities within the bound).

        One bf16 product gives every logit within ``E_i``; the target's logit and the ``k + CANDIDATES``
        largest are recomputed in float32. A row is certified when the float32 top-k of those candidates cannot
        be beaten by any other token (the k-th exceeds the largest other bf16 logit by more than ``E_i``), when
        they are apart from each other by more than float32's own noise (so their order is the reference's), and
        when no bf16 logit lies within ``E_i`` of the target's float32 logit (so the rank is exact)."""
        from analysis.probe.rowstats import row_scan

        if self.on_device or states.device.type != "cpu":
            return self._score_torch(states, targets, k, n_states)
        z, k, m, bound, noise, logits, exact_target = self._product(states, targets, k)
        vocab = logits.shape[1]
        near_cap = max(NEAR_MIN, vocab // NEAR_SHARE)
        _, rank, near, top_ids, top_vals, _, total, near_ids = row_scan(
            logits.numpy(), targets.numpy(), min(m + 1, vocab), (bound + noise).numpy(), near_cap)
        ids = torch.from_numpy(np.ascontiguousarray(top_ids[:, :m]))
        rank_t = torch.from_numpy(rank)
        rank_sure = self._settle_ranks(z, exact_target, noise, rank_t, near, near_ids)
        return self._certify(z, targets, k, m, ids, torch.from_numpy(top_vals), torch.from_numpy(total)[:, None],
                             exact_target, bound, noise, rank_t, rank_sure, torch.from_numpy(near), n_states)


    def _score_torch(self, states: torch.Tensor, targets: torch.Tensor, k: int, n_states: int = 0):
        """:meth:`score` in torch operations only, for a GPU (issue 44 item 5): the same certificate and the same
        results, with the rank's near tokens found by a ``topk`` over the tokens within the bound (at most
        :data:`NEAR_MIN` a row, no host round trip) and the rows it cannot certify recomputed in float32 in one
        compacted batch (the path's one host sync). On CUDA the bf16 product accumulates in float32 with
        reduced-precision reductions off, as the bound assumes."""

        z, k, m, bound, noise, logits, exact_target = self._product(states, targets, k)
        vocab, rows = logits.shape[1], torch.arange(len(z), device=z.device)
        tol = (bound + noise)[:, None]
        t = exact_target[:, None]
        greater = (logits > t + tol).sum(1)
        near_mask = (logits >= t - tol) & (logits <= t + tol)
        near_mask[rows, targets] = False
        near = near_mask.sum(1)
        top_vals, top_ids = logits.topk(min(m + 1, vocab), dim=1)  # candidates (sorted: values only matter)
        best = top_vals[:, :1]
        total = (logits - best).exp().sum(1, keepdim=True)
        cap = min(NEAR_MIN, vocab)
        near_vals, near_ids = logits.masked_fill(~near_mask, -math.inf).topk(cap, dim=1)
        valid = near_vals > -math.inf
        gap = self.exact_logits(z, near_ids) - exact_target[:, None]
        rank = greater + 1 + ((gap > noise[:, None]) & valid).sum(1)
        rank_sure = (near <= cap) & ~((gap.abs() <= noise[:, None]) & valid).any(1)
        return self._certify(z, targets, k, m, top_ids[:, :m], top_vals, total, exact_target, bound, noise, rank,
                             rank_sure, near, n_states)

    def _product(self, states: torch.Tensor, targets: torch.Tensor, k: int):
        """Both paths' first step: the transform's output ``z`` (float32), ``k`` and the candidates ``m`` within
        the vocabulary, each row's logit bound and float32 noise, the bf16 product's logits (float32 accumulation;
        on CUDA with reduced-precision reductions off) with the target's replaced by its float32 logit, which the
        others are ranked against."""
        z = self.transform(states).float()
        vocab = self.weight.shape[0]
        k = max(1, min(k, vocab))
        m = min(k + CANDIDATES, vocab)
        bound = self.bound(z)
        noise = self.c_f32 * z.norm(dim=1) * (1 + 1e-5) * self.wmax + 8 * U_F32 * self.bmax + 1e-6  # two float32
        with _full_precision_reductions():  # logits of one token: ours and the reference's
            logits = (z.to(torch.bfloat16) @ self.weight16.T).float().add_(self.bias)
        exact_target = self.exact_logits(z, targets[:, None])[:, 0]
        logits[torch.arange(len(z), device=z.device), targets] = exact_target
        return z, k, m, bound, noise, logits, exact_target

    def _certify(self, z, targets, k, m, ids, vals, total, exact_target, bound, noise, rank, rank_sure, near,
                 n_states):
        """Both paths' last step: the candidates' float32 logits (``ids`` ``(n, m)``; ``vals``: the scan's
        largest ``m + 1`` logits, ``total``: its ``sum exp(l - best)``), the certificate of the top-k set and order
        (with the rank's, ``rank_sure``), the probabilities and their bound, the uncertified rows recomputed in
        float32 as the float32 mode computes them (one compacted batch), and the counts."""
        from analysis.probe.rowstats import row_stats

        n, device = len(z), z.device
        outside = vals[:, m] if vals.shape[1] > m else torch.full((n,), -math.inf, device=device)  # not a candidate
        exact = self.exact_logits(z, ids)  # (n, m) float32
        ordered, order = exact.sort(dim=1, descending=True, stable=True)
        top = ids.gather(1, order[:, :k])
        set_sure = ordered[:, k - 1] - noise > outside + bound
        gaps = ordered[:, :min(k + 1, m)]
        order_sure = ((gaps[:, :-1] - gaps[:, 1:] > 2 * noise[:, None]).all(1) if gaps.shape[1] > 1 else
                      torch.ones(n, dtype=torch.bool, device=device))
        sure = set_sure & order_sure & rank_sure
        # probabilities: float32 logits for the target and the candidates, bf16 ones for every other token
        best = vals[:, :1]
        in_candidates = (ids == targets[:, None]).any(1, keepdim=True)
        target_term = torch.where(in_candidates, 0.0, (exact_target[:, None] - best).exp())
        rest = (total - (vals[:, :m] - best).exp().sum(1, keepdim=True) - target_term).clamp(min=0)
        normaliser = rest + (exact - best).exp().sum(1, keepdim=True) + target_term
        lse = best + normaliser.log()
        prob = (exact_target[:, None] - lse)[:, 0].exp()
        top_probs = (ordered[:, :k] - lse).exp()
        log_bound = torch.log1p((rest / normaliser)[:, 0] * torch.expm1(bound)) + 2 * noise
        pred = top[:, 0].clone()
        redo = (~sure).nonzero()[:, 0]  # on a GPU the path's one sync: how many rows to recompute
        if len(redo):
            again = row_stats(self.decoder(z[redo]).float(), targets[redo], k)
            pred[redo], prob[redo], rank[redo], top[redo], top_probs[redo] = again
            log_bound[redo] = 0.0
        zero = torch.zeros((), dtype=torch.float64, device=device)
        recomputed, settled, max_bound, max_log = torch.stack([
            (~sure).sum().double(), (sure & (near > 0)).sum().double(), bound.max().double() if n else zero,
            log_bound.max().double() if n else zero]).tolist()
        self.stats.add(Certified(rows=n, recomputed=int(recomputed), settled=int(settled),
                                 max_logit_bound=max_bound, max_log_prob_bound=max_log))
        self.stats.count_states(sure, n_states)
        return pred, prob, rank, top, top_probs

    def _settle_ranks(self, z, exact_target, noise, rank, near, near_ids) -> torch.Tensor:
        """Settle the rank of each row whose bf16 scan left ``near[i]`` (at most ``near_ids.shape[1]``) tokens
        within the bound of the target: their float32 logits, one dot product each, are compared with the
        target's; those clearly above it are added to ``rank`` (in place). Returns whether each row's rank is now
        exact: no token left within float32's own noise of the target, and no more near tokens than were
        recorded."""
        sure = torch.from_numpy(near == 0)
        rows = np.flatnonzero((near > 0) & (near <= near_ids.shape[1]))
        if len(rows) == 0:
            return sure
        counts = near[rows]
        pair_rows = np.repeat(rows, counts)
        pair_ids = near_ids[rows][np.arange(near_ids.shape[1])[None, :] < counts[:, None]]
        pair_rows_t, pair_ids_t = torch.from_numpy(pair_rows), torch.from_numpy(pair_ids)
        above = torch.empty(len(pair_rows), dtype=torch.bool)
        unclear = torch.empty(len(pair_rows), dtype=torch.bool)
        for start in range(0, len(pair_rows), PAIR_CHUNK):  # (pairs, hidden) gathered a chunk at a time
            r, v = pair_rows_t[start:start + PAIR_CHUNK], pair_ids_t[start:start + PAIR_CHUNK]
            gap = (z[r] * self.weight[v]).sum(1) + self.bias[v] - exact_target[r]
            above[start:start + PAIR_CHUNK] = gap > noise[r]
            unclear[start:start + PAIR_CHUNK] = gap.abs() <= noise[r]
        segment = torch.from_numpy(np.repeat(np.arange(len(rows)), counts))
        rank[torch.from_numpy(rows)] += torch.zeros(len(rows), dtype=torch.int64).index_add_(
            0, segment, above.long())
        settled = torch.zeros(len(rows), dtype=torch.int64).index_add_(0, segment, unclear.long()) == 0
        sure[torch.from_numpy(rows)] = settled
        return sure


@contextlib.contextmanager
def _full_precision_reductions():
    """CUDA's bf16 products accumulate in float32 throughout (the bound's assumption), whatever the process set."""
    if not torch.cuda.is_available():
        yield
        return
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


_BF16_COPIES: dict[int, tuple] = {}  # id(weight) -> (weakref to the weight, its version, the bfloat16 copy)


def _bf16_copy(weight: torch.Tensor) -> torch.Tensor:
    """A bfloat16 copy of a (shared, never mutated) weight, made once per weight object and version, and kept
    while the process runs (at most 4 copies: the models in use). Keyed by the object itself (a weak reference),
    not its address: a freed model's memory is reused by the next one."""
    entry = _BF16_COPIES.get(id(weight))
    if entry is not None and entry[0]() is weight and entry[1] == weight._version:
        return entry[2]
    while len(_BF16_COPIES) >= 4:
        _BF16_COPIES.pop(next(iter(_BF16_COPIES)))
    copy = weight.detach().to(torch.bfloat16).contiguous()
    _BF16_COPIES[id(weight)] = (weakref.ref(weight), weight._version, copy)
    return copy
