"""Figures shared by every chapter: one style, labelled attention heatmaps, grids of heads.

All functions return the matplotlib objects they draw on, so a notebook can add titles or
annotations, and none of them calls ``plt.show()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from companion._validation import shape_str

__all__ = ["set_style", "attention_heatmap", "attention_grid", "CMAP"]

#: Colour map used for every attention figure in the book (sequential, 0 = white).
CMAP = "Blues"


def set_style() -> None:
    """Apply the book's figure style (seaborn 'whitegrid', readable font sizes)."""
    sns.set_theme(style="whitegrid", context="notebook")
    plt.rcParams.update({"figure.dpi": 100, "savefig.bbox": "tight", "axes.titleweight": "bold"})


def _as_2d(weights: torch.Tensor | np.ndarray, name: str = "weights") -> np.ndarray:
    array = (
        weights.detach().cpu().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights)
    )
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (q_len, k_len), got shape {shape_str(array.shape)}")
    return array


def attention_heatmap(
    weights: torch.Tensor | np.ndarray,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    vmax: float | None = 1.0,
    cbar: bool = True,
) -> Axes:
    """Draw one attention matrix: rows are queries, columns are keys.

    Args:
        weights: shape ``(q_len, k_len)``; row ``i`` is how much query ``i`` looks at each key.
        query_labels: ``q_len`` row labels (e.g. the tokens); default indices.
        key_labels: ``k_len`` column labels; default indices.
        ax: axes to draw on; a new figure is created when omitted.
        title: axes title.
        annotate: write the value in each cell; default when the matrix is at most 10 × 10.
        vmax: top of the colour scale (1.0 for attention weights; ``None`` to auto-scale).
        cbar: draw a colour bar.
    """
    array = _as_2d(weights)
    q_len, k_len = array.shape
    for labels, size, which in (
        (query_labels, q_len, "query_labels"),
        (key_labels, k_len, "key_labels"),
    ):
        if labels is not None and len(labels) != size:
            raise ValueError(
                f"{which} must have {size} entries to match weights, got {len(labels)}"
            )
    if ax is None:
        _, ax = plt.subplots(figsize=(0.55 * k_len + 2.5, 0.45 * q_len + 1.5))
    if annotate is None:
        annotate = q_len <= 10 and k_len <= 10
    sns.heatmap(
        array,
        ax=ax,
        cmap=CMAP,
        vmin=0.0,
        vmax=vmax,
        annot=annotate,
        fmt=".2f",
        cbar=cbar,
        square=q_len <= 30 and k_len <= 30,
        xticklabels=list(key_labels) if key_labels is not None else "auto",
        yticklabels=list(query_labels) if query_labels is not None else "auto",
        annot_kws={"fontsize": 8},
    )
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.tick_params(axis="x", labelrotation=90)
    ax.tick_params(axis="y", labelrotation=0)
    if title:
        ax.set_title(title)
    return ax


def attention_grid(
    weights: torch.Tensor | np.ndarray,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    row_name: str = "layer",
    col_name: str = "head",
    cell_size: float = 2.2,
) -> Figure:
    """Draw a grid of attention matrices, e.g. layers × heads.

    Args:
        weights: shape ``(rows, cols, q_len, k_len)`` (e.g. ``(layers, heads, q, k)``) or
            ``(cols, q_len, k_len)`` for a single row of heads.
        query_labels, key_labels: tick labels shared by every cell.
        row_name, col_name: used in the cell titles ("layer 0 · head 3").
        cell_size: inches per cell.
    """
    array = (
        weights.detach().cpu().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights)
    )
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4:
        raise ValueError(
            "weights must be (rows, cols, q_len, k_len) or (cols, q_len, k_len), "
            f"got shape {shape_str(array.shape)}"
        )
    rows, cols = array.shape[:2]
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(cell_size * cols + 1, cell_size * rows + 0.5),
        squeeze=False,
        constrained_layout=True,
    )
    for r in range(rows):
        for c in range(cols):
            ax = axes[r, c]
            attention_heatmap(
                array[r, c],
                query_labels,
                key_labels,
                ax=ax,
                annotate=False,
                cbar=False,
                title=f"{row_name} {r} · {col_name} {c}" if rows > 1 else f"{col_name} {c}",
            )
            if c > 0:
                ax.set_ylabel("")
                ax.set_yticks([])
            if r < rows - 1:
                ax.set_xlabel("")
                ax.set_xticks([])
            ax.title.set_fontsize(9)
    return fig
