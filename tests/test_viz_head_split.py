"""companion.viz.head_split_diagram: the blocks of the head split, coloured by head."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgb

from companion.viz import head_split_diagram


def _squares_by_colour(ax) -> dict[tuple[float, float, float], int]:
    counts: dict[tuple[float, float, float], int] = {}
    for patch in ax.patches:
        colour = tuple(round(c, 4) for c in to_rgb(patch.get_facecolor()))
        counts[colour] = counts.get(colour, 0) + 1
    return counts


@pytest.mark.parametrize(("d_model", "num_heads", "seq_len"), [(12, 3, 5), (8, 4, 2), (6, 1, 3)])
def test_one_square_per_number_and_one_colour_per_head(d_model, num_heads, seq_len):
    ax = head_split_diagram(d_model, num_heads, seq_len)
    head_dim = d_model // num_heads
    counts = _squares_by_colour(ax)
    grey = tuple(round(c, 4) for c in to_rgb("0.72"))
    # Q, the per-head Q, the per-head outputs and the concatenation: 4 · n · d_k squares per
    # head colour; the output: n · d_model grey squares
    assert counts.pop(grey) == seq_len * d_model
    assert sorted(counts.values()) == [4 * seq_len * head_dim] * num_heads
    texts = " ".join(t.get_text() for t in ax.texts)
    for shape in ("(h, n, d_k)", "(h, n, d_v)", f"({seq_len}, {d_model})"):
        assert shape in texts
    assert all(f"head {r}" in texts for r in range(num_heads))
    # the four steps between the five stages are labelled
    # without a batch axis the split swaps axes 0 and 1: the labels say "swap", and name
    # transpose(1, 2) only together with the batch axis it assumes
    assert "(transpose(1, 2)\nwith a batch axis)" in texts
    for step in ("swap n and h", "attention per head", "swap h and n back", "W_O"):
        assert step in texts, step
    plt.close("all")


def test_draws_on_given_axes():
    _, ax = plt.subplots()
    assert head_split_diagram(ax=ax) is ax
    plt.close("all")


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads: got d_model=10"):
        head_split_diagram(10, 3)
    with pytest.raises(TypeError, match=r"num_heads must be an int, got float \(2.0\)"):
        head_split_diagram(12, 2.0)
    with pytest.raises(ValueError, match="seq_len must be >= 1, got 0"):
        head_split_diagram(12, 3, 0)
