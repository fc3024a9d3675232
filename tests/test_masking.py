"""Masks: shapes, the True = may-attend convention, conversions to/from torch's conventions."""

import pytest
import torch
from torch import nn

from companion.interop import (
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)
from companion.masking import (
    causal_mask,
    combine_masks,
    from_additive_mask,
    padding_mask,
    to_additive_mask,
)


def test_padding_mask_shape_and_values():
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 9]])
    mask = padding_mask(tokens, pad_id=0)
    assert mask.shape == (2, 1, 1, 4)
    assert mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [True, False, True, True]]


def test_causal_mask_square_is_lower_triangular():
    mask = causal_mask(4)
    assert mask.shape == (4, 4)
    assert torch.equal(mask, torch.ones(4, 4, dtype=torch.bool).tril())
    assert mask[0].tolist() == [True, False, False, False]


def test_causal_mask_with_more_keys_is_bottom_right_aligned():
    # 2 new queries at positions 3 and 4 of a 5-token sequence (a KV cache of 3 earlier keys).
    mask = causal_mask(2, 5)
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    # the last query row of a longer causal mask is the same
    assert torch.equal(mask, causal_mask(5)[-2:])


def test_causal_mask_matches_torch_square_subsequent_mask():
    additive = nn.Transformer.generate_square_subsequent_mask(6)
    assert torch.equal(from_additive_mask(additive), causal_mask(6))


def test_combine_masks_broadcasts_padding_and_causal():
    tokens = torch.tensor([[1, 2, 0], [3, 0, 0]])
    combined = combine_masks(padding_mask(tokens, 0), causal_mask(3))
    assert combined.shape == (2, 1, 3, 3)
    assert combined[1, 0].tolist() == [
        [True, False, False],
        [True, False, False],
        [True, False, False],
    ]
    assert combine_masks(None, None) is None
    single = causal_mask(3)
    assert combine_masks(None, single) is single


def test_additive_round_trip():
    mask = torch.rand(2, 3, 4) > 0.3
    additive = to_additive_mask(mask)
    assert additive.dtype == torch.float32
    assert set(additive.unique().tolist()) <= {0.0, float("-inf")}
    assert torch.equal(from_additive_mask(additive), mask)


def test_from_additive_mask_accepts_large_negative_values():
    additive = torch.tensor([[0.0, -1e9], [torch.finfo(torch.float32).min, 0.0]])
    assert from_additive_mask(additive).tolist() == [[True, False], [False, True]]


def test_key_padding_round_trip():
    tokens = torch.tensor([[4, 4, 0], [4, 0, 0]])
    ours = padding_mask(tokens, 0)
    theirs = to_torch_key_padding_mask(ours)
    assert torch.equal(theirs, tokens == 0)  # torch: True = padding
    assert torch.equal(from_torch_key_padding_mask(theirs), ours)
    assert torch.equal(to_torch_key_padding_mask(ours[:, 0, 0]), theirs)  # (batch, k_len) form
    float_kpm = torch.zeros(2, 3).masked_fill(tokens == 0, float("-inf"))
    assert torch.equal(from_torch_key_padding_mask(float_kpm), ours)


def test_attn_mask_round_trip_2d_and_per_head():
    mask = torch.rand(3, 5) > 0.5
    assert torch.equal(to_torch_attn_mask(mask), ~mask)
    assert torch.equal(from_torch_attn_mask(~mask), mask)
    per_head = torch.rand(2, 4, 3, 5) > 0.5
    theirs = to_torch_attn_mask(per_head, num_heads=4)
    assert theirs.shape == (8, 3, 5)
    assert torch.equal(from_torch_attn_mask(theirs, num_heads=4), per_head)
    # a mask shared by the heads is repeated for each head
    shared = torch.rand(2, 1, 3, 5) > 0.5
    expanded = from_torch_attn_mask(to_torch_attn_mask(shared, num_heads=4), num_heads=4)
    assert torch.equal(expanded, shared.expand(2, 4, 3, 5))


@pytest.mark.parametrize("bad", [float("nan"), -0.5, 3.0])
def test_from_additive_mask_rejects_values_that_are_not_a_mask(bad):
    with pytest.raises(ValueError, match="mask"):
        from_additive_mask(torch.tensor([0.0, bad]))


# --------------------------------------------------------------------------------------------
# prefix_lm_mask (chapter 10)
# --------------------------------------------------------------------------------------------


def test_prefix_lm_mask_by_hand():
    from companion.masking import prefix_lm_mask

    t, f = True, False
    assert prefix_lm_mask(5, 2).tolist() == [
        [t, t, f, f, f],  # the prefix sees all of the prefix, the future too
        [t, t, f, f, f],
        [t, t, t, f, f],  # after it: the whole prefix and the positions up to its own
        [t, t, t, t, f],
        [t, t, t, t, t],
    ]
    assert prefix_lm_mask(5, 2).dtype == torch.bool


def test_prefix_lm_mask_ends_are_causal_and_bidirectional():
    from companion.masking import prefix_lm_mask

    assert torch.equal(prefix_lm_mask(6, 0), causal_mask(6))
    assert torch.equal(prefix_lm_mask(6, 1), causal_mask(6))
    assert bool(prefix_lm_mask(6, 6).all())
    assert prefix_lm_mask(1, 0).tolist() == [[True]]


@pytest.mark.parametrize(
    ("length", "prefix_len", "error", "match"),
    [
        (4, 5, ValueError, r"prefix_len must be <= length \(4\), got 5"),
        (4, -1, ValueError, "prefix_len must be >= 0, got -1"),
        (0, 0, ValueError, "length must be >= 1, got 0"),
        (4, 1.5, TypeError, "prefix_len must be an int"),
    ],
)
def test_prefix_lm_mask_rejects_bad_sizes(length, prefix_len, error, match):
    from companion.masking import prefix_lm_mask

    with pytest.raises(error, match=match):
        prefix_lm_mask(length, prefix_len)
