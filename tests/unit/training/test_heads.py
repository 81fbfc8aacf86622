"""Layer-pooling heads: parameter counts, gradients, layer indices, weight sums and the known public bugs."""

import pytest
import torch

from analysis.training.heads import GRUHead, build_head, group_features, head_names, trainable_parameters

L, H, B, T = 4, 8, 3, 5


def states_and_mask(seed=0, requires_grad=False):
    torch.manual_seed(seed)
    states = torch.randn(L + 1, B, T, H, requires_grad=requires_grad)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 3:] = 0  # a padded example
    return states, mask


def pooler():
    return torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.Tanh())


class LastTokenPooler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(H, H)

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))


@pytest.mark.parametrize("groups, share, expected", [
    (1, True, 5_792_302), (1, False, 5_792_302), (2, True, 3_147_502), (2, False, 5_973_502),
    (3, True, 2_345_902), (3, False, 6_154_702), (4, True, 2_005_102), (4, False, 6_335_902),
    (6, True, 1_784_302), (6, False, 6_698_302),
])
def test_grubert_parameter_counts(groups, share, expected):
    head = build_head(f"gru-{'share' if share else 'cat'}-{groups}", 12, 768, 2)
    assert trainable_parameters(head) == expected


def test_every_gru_of_gru_cat_is_registered():
    head = build_head("gru-cat-3", 12, 768, 2)
    registered = {id(p) for p in head.parameters()}
    assert len(head.embedders) == 3
    for gru in head.embedders:  # a plain Python list would hide these from .parameters() and the optimiser
        assert all(id(p) in registered for p in gru.parameters())


@pytest.mark.parametrize("name", head_names(L))
def test_every_parameter_receives_a_gradient(name):
    states, mask = states_and_mask(requires_grad=True)
    head = build_head(name, L, H, 3, dropout=0.0, pooler=LastTokenPooler())
    out = head(states, mask)
    assert out.logits.shape == (B, 3)
    out.logits.square().sum().backward()
    for pname, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: {pname} gets no gradient"


def test_group_features_are_layer_major_not_scrambled():
    states = torch.arange(L + 1).float().view(L + 1, 1, 1, 1).expand(L + 1, B, T, H).clone()
    states += torch.arange(T).float().view(1, 1, T, 1) * 100  # token position in the hundreds
    x = group_features(states, [1, 2, 3])
    assert x.shape == (B, T, 3 * H)
    for j, layer in enumerate([1, 2, 3]):
        expected = layer + torch.arange(T).float().view(1, T, 1) * 100
        assert torch.equal(x[:, :, j * H:(j + 1) * H], expected.expand(B, T, H))


def test_gru_groups_are_consecutive_and_skip_the_embeddings():
    assert GRUHead(12, H, 2, groups=3, share=True).groups == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert GRUHead(12, H, 2, groups=6, share=False).groups[0] == [1, 2]


@pytest.mark.parametrize("name, uses", [
    ("cls", {L}), ("layer-0", {0}), ("layer-2", {2}), ("last4-mean", {1, 2, 3, 4}), ("first4-max", {1, 2, 3, 4}),
    ("all-concat", {1, 2, 3, 4}), ("lstm", {1, 2, 3, 4}), ("attention", {1, 2, 3, 4}),
    ("scalar-mix", {0, 1, 2, 3, 4}), ("gru-share-2", {1, 2, 3, 4}), ("gru-cat-4", {1, 2, 3, 4}),
])
def test_heads_read_exactly_the_documented_layers(name, uses):
    head = build_head(name, L, H, 3, dropout=0.0).eval()
    states, mask = states_and_mask()
    base = head(states, mask).logits
    for layer in range(L + 1):
        changed = states.clone()
        changed[layer, :, 0] += 5.0  # the [CLS] position
        changed[layer, :, 1] -= 3.0  # and a token (GRU heads read every token)
        moved = not torch.allclose(head(changed, mask).logits, base)
        assert moved == (layer in uses), f"{name}: layer {layer} {'is' if moved else 'is not'} used"


@pytest.mark.parametrize("name", ["attention", "scalar-mix"])
def test_layer_weights_sum_to_one(name):
    head = build_head(name, L, H, 3)
    out = head(*states_and_mask())
    assert out.layer_weights.shape == (B, len(out.layers))
    torch.testing.assert_close(out.layer_weights.sum(1), torch.ones(B))
    assert out.layers == (list(range(1, L + 1)) if name == "attention" else list(range(L + 1)))


def test_attention_pooling_is_the_papers_formula():
    head = build_head("attention", L, H, 3, dropout=0.0)
    states, mask = states_and_mask()
    out = head(states, mask)
    h = states[1:, :, 0].transpose(0, 1)  # (B, L, H): [CLS] of layers 1..L
    for b in range(B):
        weights = torch.softmax(head.q @ h[b].T, dim=-1)  # (1, L)
        o = head.w_h(weights @ h[b])  # W_h^T softmax(q h^T) h
        torch.testing.assert_close(out.logits[b], head.classifier(o)[0])
        torch.testing.assert_close(out.layer_weights[b], weights[0])


def test_padding_does_not_change_gru_outputs():
    head = build_head("gru-share-2", L, H, 3, dropout=0.0).eval()
    states, mask = states_and_mask()
    noisy = states.clone()
    noisy[:, 1, 3:] = 1e3  # garbage in the padded positions of example 1
    torch.testing.assert_close(head(states, mask).logits, head(noisy, mask).logits)


@pytest.mark.parametrize("name, message", [("gru-share-5", "must be one of"), ("layer-9", "does not exist"),
                                           ("gru-cat-2-linear", "linear variant"), ("nope", "unknown head"),
                                           ("pooler", "no pooler")])
def test_bad_head_names(name, message):
    with pytest.raises(ValueError, match=message):
        build_head(name, L, H, 2)
