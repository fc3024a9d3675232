"""Sparse masks for long sequences: sliding window, global tokens, BigBird, union of masks.

The small cases are written out by hand (T = may attend), so an off-by-one in the window, a
transposed global pattern or a band aligned top-left instead of bottom-right fails them."""

from __future__ import annotations

import pytest
import torch

from companion.masking import (
    bigbird_mask,
    causal_mask,
    combine_masks,
    global_tokens_mask,
    sliding_window_mask,
    sliding_window_mask_at,
    union_masks,
)

T, F = True, False


# --- sliding_window_mask ------------------------------------------------------------------------


def test_sliding_window_symmetric_by_hand():
    # window=2: |i - j| < 2, i.e. the diagonal and one key on each side. Catches `<=` for `<`
    # (a band of 5) and a window that does not count the diagonal.
    assert sliding_window_mask(5, window=2).tolist() == [
        [T, T, F, F, F],
        [T, T, T, F, F],
        [F, T, T, T, F],
        [F, F, T, T, T],
        [F, F, F, T, T],
    ]


def test_sliding_window_causal_by_hand():
    # window=3, causal: the key itself and the two before it. Catches a band that keeps
    # future keys or reaches one key too far back.
    assert sliding_window_mask(5, window=3, causal=True).tolist() == [
        [T, F, F, F, F],
        [T, T, F, F, F],
        [T, T, T, F, F],
        [F, T, T, T, F],
        [F, F, T, T, T],
    ]


def test_sliding_window_keys_per_row_count_the_diagonal():
    n, window = 12, 4
    symmetric = sliding_window_mask(n, window=window).sum(-1)
    causal = sliding_window_mask(n, window=window, causal=True).sum(-1)
    # interior rows: 2·window - 1 keys (symmetric), window keys (causal); rows near the start
    # see fewer (i + 1 keys while i < window).
    assert symmetric[window - 1 : n - window + 1].tolist() == [2 * window - 1] * (
        n - 2 * window + 2
    )
    assert causal.tolist() == [min(i + 1, window) for i in range(n)]
    assert torch.equal(sliding_window_mask(n, window=1), torch.eye(n, dtype=torch.bool))


def test_sliding_window_wider_than_the_sequence_is_full_or_causal():
    assert sliding_window_mask(6, window=6).all()
    assert torch.equal(sliding_window_mask(6, window=6, causal=True), causal_mask(6))
    assert torch.equal(sliding_window_mask(6, window=100, causal=True), causal_mask(6))
    # one less and the first key of the last row drops out
    assert not sliding_window_mask(6, window=5, causal=True)[5, 0]


def test_sliding_window_with_more_keys_is_bottom_right_aligned():
    # 2 queries at positions 3 and 4 of 5 keys (a KV cache), window 2, causal.
    # Catches a band aligned top-left (queries at positions 0 and 1).
    mask = sliding_window_mask(2, 5, window=2, causal=True)
    assert mask.tolist() == [[F, F, T, T, F], [F, F, F, T, T]]
    assert torch.equal(mask, sliding_window_mask(5, window=2, causal=True)[-2:])
    assert torch.equal(sliding_window_mask(3, 7, window=2), sliding_window_mask(7, window=2)[-3:])


def test_sliding_window_composes_with_causal_mask():
    # the symmetric band AND the causal mask is the causal band
    for window in (1, 2, 5, 9):
        both = combine_masks(sliding_window_mask(9, window=window), causal_mask(9))
        assert torch.equal(both, sliding_window_mask(9, window=window, causal=True))


def test_sliding_window_mask_at_any_positions():
    # queries at positions 10 and 12, keys at 8..13, window 3, causal
    queries, keys = torch.tensor([10, 12]), torch.arange(8, 14)
    mask = sliding_window_mask_at(queries, keys, window=3, causal=True)
    assert mask.tolist() == [[T, T, T, F, F, F], [F, F, T, T, T, F]]
    symmetric = sliding_window_mask_at(queries, keys, window=2)
    assert symmetric.tolist() == [[F, T, T, T, F, F], [F, F, F, T, T, T]]


# --- global tokens and unions -------------------------------------------------------------------


def test_global_tokens_mask_by_hand():
    # token 0 and token 3 are global: their rows and their columns are all True.
    # Catches only rows (global tokens see all, nobody sees them) or only columns.
    assert global_tokens_mask(5, [0, 3]).tolist() == [
        [T, T, T, T, T],
        [T, F, F, T, F],
        [T, F, F, T, F],
        [T, T, T, T, T],
        [T, F, F, T, F],
    ]
    assert torch.equal(global_tokens_mask(5, torch.tensor([3, 0])), global_tokens_mask(5, (0, 3)))
    assert not global_tokens_mask(4, []).any()


def test_longformer_pattern_is_band_or_global():
    longformer = union_masks(sliding_window_mask(6, window=2), global_tokens_mask(6, [0]))
    assert longformer.tolist() == [
        [T, T, T, T, T, T],
        [T, T, T, F, F, F],
        [T, T, T, T, F, F],
        [T, F, T, T, T, F],
        [T, F, F, T, T, T],
        [T, F, F, F, T, T],
    ]
    # causal Longformer: AND with the causal mask keeps the global column, drops the row's
    # future keys
    causal = combine_masks(longformer, causal_mask(6))
    assert causal[0].tolist() == [T, F, F, F, F, F]
    assert causal[:, 0].all()


def test_union_masks_is_or_and_broadcasts():
    row = torch.tensor([[T, F, F]])  # (1, 3)
    column = torch.tensor([[F], [T]])  # (2, 1)
    assert union_masks(row, column).tolist() == [[T, F, F], [T, T, T]]
    assert union_masks(None, row) is row
    assert union_masks(None, None) is None
    with pytest.raises(ValueError, match=r"broadcast against each other.*\(2, 3\), \(4,\)"):
        union_masks(torch.ones(2, 3, dtype=torch.bool), torch.ones(4, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"masks\[1\] must be a boolean tensor"):
        union_masks(row, row.float())


# --- BigBird -----------------------------------------------------------------------------------


def test_bigbird_contains_local_and_global_and_exactly_num_random_more():
    length, window, global_positions, num_random = 32, 2, [0, 17], 4
    mask = bigbird_mask(
        length,
        window=window,
        global_positions=global_positions,
        num_random=num_random,
        generator=torch.Generator().manual_seed(0),
    )
    base = union_masks(
        sliding_window_mask(length, window=window), global_tokens_mask(length, global_positions)
    )
    assert (mask >= base).all()  # nothing of local + global is lost
    extra = (mask & ~base).sum(-1)  # random keys per row
    # exactly num_random new keys in each non-global row: catches drawing with replacement
    # (fewer when two draws coincide) and drawing among keys already allowed
    for row in range(length):
        expected = 0 if row in global_positions else num_random
        assert int(extra[row]) == expected, row
    density = mask.float().mean().item()
    expected_density = (base.sum() + (length - 2) * num_random).item() / length**2
    assert density == pytest.approx(expected_density, abs=1e-12)


def test_bigbird_is_reproducible_with_a_generator():
    def draw(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return bigbird_mask(40, window=3, global_positions=[0], num_random=3, generator=generator)

    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))


def test_bigbird_random_keys_are_spread_over_the_free_keys():
    # Row 10 of a 20-token sequence (window 2, no global tokens) has 17 keys outside its band;
    # over 340 draws of 3, each should come up about 340·3/17 = 60 times. Catches a draw that
    # always picks the same keys (e.g. the first free ones).
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(20)
    for _ in range(340):
        counts += bigbird_mask(20, window=2, num_random=3, generator=generator)[10].float()
    band = sliding_window_mask(20, window=2)[10]
    assert torch.equal(counts[band], torch.full((3,), 340.0))
    free = counts[~band]
    assert free.sum() == 340 * 3
    assert free.min() > 30 and free.max() < 95, free.tolist()


def test_bigbird_edge_cases():
    assert torch.equal(
        bigbird_mask(8, window=2, global_positions=[3], num_random=0),
        union_masks(sliding_window_mask(8, window=2), global_tokens_mask(8, [3])),
    )
    assert bigbird_mask(6, window=1, num_random=6).all()  # more than is free: every key
    decoder = combine_masks(bigbird_mask(10, window=2, num_random=3), causal_mask(10))
    assert not (decoder & ~causal_mask(10)).any()


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: sliding_window_mask(4, window=0), ValueError, r"window must be >= 1, got 0"),
        (lambda: sliding_window_mask(4, window=1.5), TypeError, r"window must be an int"),
        (lambda: sliding_window_mask(4, window=2, causal=1), TypeError, r"causal must be a bool"),
        (lambda: sliding_window_mask(0, window=2), ValueError, r"q_len must be >= 1"),
        (lambda: sliding_window_mask(5, 3, window=2), ValueError, r"k_len must be >= q_len"),
        (
            lambda: sliding_window_mask_at(torch.arange(3.0), torch.arange(3), window=2),
            TypeError,
            r"query_positions must be an integer tensor",
        ),
        (
            lambda: sliding_window_mask_at(torch.arange(3), torch.zeros(2, 2).long(), window=2),
            ValueError,
            r"key_positions must have shape \(k_len,\)",
        ),
        (
            lambda: global_tokens_mask(5, [0, 5]),
            ValueError,
            r"global_positions\[1\] must be a position in \[0, 4\] \(length=5\), got 5",
        ),
        (lambda: global_tokens_mask(5, [-1]), ValueError, r"global_positions\[0\].*got -1"),
        (lambda: global_tokens_mask(5, [True]), TypeError, r"global_positions\[0\] must be an int"),
        (lambda: global_tokens_mask(5, 2), TypeError, r"global_positions must be a sequence"),
        (
            lambda: global_tokens_mask(5, torch.tensor([0.0])),
            TypeError,
            r"global_positions must be an integer tensor",
        ),
        (lambda: global_tokens_mask(0, []), ValueError, r"length must be >= 1, got 0"),
        (
            lambda: bigbird_mask(5, window=1, num_random=6),
            ValueError,
            r"num_random must be <= length \(5\), got 6",
        ),
        (lambda: bigbird_mask(5, window=1, num_random=-1), ValueError, r"num_random must be >= 0"),
        (lambda: bigbird_mask(5, window=0, num_random=1), ValueError, r"window must be >= 1"),
        (
            lambda: bigbird_mask(5, window=1, num_random=1, generator=0),
            TypeError,
            r"generator must be a torch.Generator or None, got int",
        ),
    ],
)
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
