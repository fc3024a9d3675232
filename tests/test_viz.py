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
