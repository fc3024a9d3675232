"""companion.viz draws what it is given, labelled."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch

from companion.viz import attention_grid, attention_heatmap, set_style


def test_heatmap_labels_and_values():
    set_style()
    weights = torch.softmax(torch.randn(3, 4), -1)
    ax = attention_heatmap(weights, ["a", "b", "c"], ["w", "x", "y", "z"], title="t")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert len(ax.texts) == 12  # annotated: small matrix
    plt.close("all")


def test_heatmap_rejects_bad_input():
    with pytest.raises(
        ValueError, match=r"weights must be 2-D \(q_len, k_len\), got shape \(2, 3, 4\)"
    ):
        attention_heatmap(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="key_labels must have 4 entries to match weights, got 2"):
        attention_heatmap(torch.rand(3, 4), key_labels=["a", "b"])


def test_grid_shape():
    fig = attention_grid(torch.rand(2, 3, 5, 5))
    assert len(fig.axes) == 6
    assert len(attention_grid(torch.rand(4, 5, 5)).axes) == 4
    with pytest.raises(ValueError, match="rows, cols, q_len, k_len"):
        attention_grid(torch.rand(5, 5))
    plt.close("all")


def test_scramble_diagram_rows_are_one_token_only_for_the_right_split():
    from companion.viz import head_split_scramble_diagram

    d_model, heads, n = 12, 3, 5
    ax = head_split_scramble_diagram(d_model, heads, n)
    colours = [tuple(p.get_facecolor()) for p in ax.patches]  # Q, then right, then wrong
    assert len(colours) == 3 * n * d_model, len(colours)
    d_k, block = d_model // heads, n * d_model

    def row_tokens(stage):  # per head, the colour of each of its n rows (rows are uniform)
        part = colours[stage * block : (stage + 1) * block]
        rows = [part[j : j + d_k] for j in range(0, block, d_k)]
        assert all(len(set(row)) == 1 for row in rows), "a row of d_k features is one token"
        return [[row[0] for row in rows[r * n : (r + 1) * n]] for r in range(heads)]

    token_colour = [colours[i * d_model] for i in range(n)]  # Q's rows
    assert all(head == token_colour for head in row_tokens(1)), "right split: row i is token i"
    wrong = row_tokens(2)
    assert wrong[0] == [token_colour[t] for t in (0, 0, 0, 1, 1)], "wrong split: head 0's rows"
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="num_heads"):
        head_split_scramble_diagram(10, 3, 5)
