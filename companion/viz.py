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

from companion._validation import check_divisible, check_positive_int, shape_str

__all__ = ["set_style", "attention_heatmap", "attention_grid", "head_split_diagram", "CMAP"]

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


def _check_head_split(d_model: int, num_heads: int, seq_len: int) -> None:
    """The arguments both head-split diagrams take: positive, ``num_heads`` dividing ``d_model``."""
    check_positive_int("d_model", d_model)
    check_positive_int("num_heads", num_heads)
    check_positive_int("seq_len", seq_len)
    check_divisible("d_model", d_model, "num_heads", num_heads)


def head_split_diagram(
    d_model: int = 12, num_heads: int = 3, seq_len: int = 5, ax: Axes | None = None
) -> Axes:
    """Draw multi-head attention's reshapes as blocks: split, attend per head, concatenate, W_O.

    Left to right: the projected queries ``(seq_len, d_model)`` with head ``r``'s ``d_k``
    columns in colour ``r``; after ``view`` and a swap of the token and head axes
    (``transpose(1, 2)`` when the batch axis is in front) one ``(seq_len, d_k)`` matrix
    per head; each head's attention output ``(seq_len, d_v)``; their concatenation
    ``(seq_len, h·d_v)``, the same colours in the same columns; ``W_O``'s output
    ``(seq_len, d_model)``, where every column mixes every head (grey). The batch axis is
    left out. One square is one number.

    Args:
        d_model: width of a token vector; ``num_heads`` must divide it.
        num_heads: number of heads ``h``.
        seq_len: number of tokens ``n`` (rows).
        ax: axes to draw on; a new figure is created when omitted.
    """
    _check_head_split(d_model, num_heads, seq_len)
    head_dim = d_model // num_heads
    colours = sns.color_palette("Set2", num_heads)
    gap, arrow_gap = 1.3, 5.6  # between the stacked heads; between two stages
    stack_height = num_heads * seq_len + (num_heads - 1) * gap
    middle = stack_height / 2  # every stage is centred on this height

    def grid(x0: float, y0: float, cols: int, colour_of) -> None:  # cols × seq_len squares
        for c in range(cols):
            for i in range(seq_len):
                ax.add_patch(
                    plt.Rectangle(
                        (x0 + c, y0 + seq_len - 1 - i),
                        1,
                        1,
                        facecolor=colour_of(c),
                        edgecolor="white",
                        linewidth=0.8,
                    )
                )

    def head_colour(c: int):
        return colours[c // head_dim]

    def arrow(x0: float, text: str) -> None:
        ax.annotate(
            "",
            xy=(x0 + arrow_gap - 0.4, middle),
            xytext=(x0 + 0.4, middle),
            arrowprops={"arrowstyle": "-|>", "color": "0.3", "linewidth": 1.4},
        )
        ax.text(x0 + arrow_gap / 2, middle + 0.5, text, ha="center", va="bottom", fontsize=8.5)

    def caption(x0: float, cols: int, text: str, y: float) -> None:  # under a stage
        ax.text(x0 + cols / 2, y, text, ha="center", va="top", fontsize=9)

    if ax is None:
        width = 2 * d_model + 2 * head_dim + d_model + 4 * arrow_gap
        _, ax = plt.subplots(figsize=(0.32 * width + 1, 0.32 * stack_height + 1.6))
    ax.set_axis_off()
    ax.set_aspect("equal")
    x = 0.0
    low = middle - seq_len / 2  # bottom of a one-matrix stage
    # 1. projected queries, head r's columns in colour r
    grid(x, low, d_model, head_colour)
    caption(x, d_model, f"Q = X W_Q\n(n, d_model) = ({seq_len}, {d_model})", low - 0.6)
    for r in range(num_heads):
        ax.text(
            x + (r + 0.5) * head_dim,
            low + seq_len + 0.3,
            f"head {r}",
            ha="center",
            va="bottom",
            fontsize=8,
            color=colours[r],
            fontweight="bold",
        )
    for i in range(seq_len):
        ax.text(x - 0.3, low + seq_len - 0.5 - i, f"token {i}", ha="right", va="center", fontsize=7)
    x += d_model
    arrow(x, "view (n, h, d_k)\n+ swap n and h\n(transpose(1, 2)\nwith a batch axis)")
    x += arrow_gap
    # 2. one (n, d_k) matrix per head, stacked: the new head axis
    for stage_title, stage_label in (
        ("Q per head", "(h, n, d_k)"),
        ("per-head outputs", "(h, n, d_v)"),
    ):
        for r in range(num_heads):
            y0 = stack_height - (r + 1) * seq_len - r * gap
            grid(x, y0, head_dim, lambda c, r=r: colours[r])
            ax.text(
                x + head_dim / 2,
                y0 + seq_len + 0.15,
                f"head {r}",
                ha="center",
                va="bottom",
                fontsize=7.5,
                color=colours[r],
                fontweight="bold",
            )
        caption(x, head_dim, f"{stage_title}\n{stage_label}", -0.6)
        x += head_dim
        if stage_title == "Q per head":
            arrow(x, "attention per head\n(K, V split alike;\nits own softmax)")
            x += arrow_gap
    arrow(x, "swap h and n back\n+ reshape")
    x += arrow_gap
    # 3. the concatenation: the same colours in the same columns
    grid(x, low, d_model, head_colour)
    caption(x, d_model, f"Concat(head_0, …)\n(n, h·d_v) = ({seq_len}, {d_model})", low - 0.6)
    x += d_model
    arrow(x, "· W_O\n(mixes heads)")
    x += arrow_gap
    # 4. the output: every column mixes every head
    grid(x, low, d_model, lambda c: "0.72")
    caption(x, d_model, f"output\n(n, d_model) = ({seq_len}, {d_model})", low - 0.6)
    x += d_model
    ax.set_xlim(-3.0, x + 0.5)
    ax.set_ylim(-3.2, stack_height + 1.2)
    return ax


def head_split_scramble_diagram(
    d_model: int = 12, num_heads: int = 3, seq_len: int = 5, ax: Axes | None = None
) -> Axes:
    """Draw the right split next to the classic wrong one, each square coloured by its token.

    Left to right: the projected queries ``(seq_len, d_model)``, row ``i`` in token ``i``'s
    colour; the heads after ``view`` and a swap of the token and head axes, where each row of
    every head is one token; the heads after ``reshape(num_heads, seq_len, d_k)`` without the
    swap, which reads memory in order, so a "head"'s rows come from the wrong tokens (with
    ``d_model = 12``, ``h = 3``, ``n = 5``: head 0's rows are tokens 0, 0, 0, 1, 1). The batch axis is left out. One square is one number.

    Args:
        d_model: width of a token vector; ``num_heads`` must divide it.
        num_heads: number of heads ``h``.
        seq_len: number of tokens ``n`` (rows).
        ax: axes to draw on; a new figure is created when omitted.
    """
    _check_head_split(d_model, num_heads, seq_len)
    head_dim = d_model // num_heads
    colours = (
        sns.color_palette("tab10", seq_len) if seq_len <= 10 else sns.color_palette("husl", seq_len)
    )
    gap, stage_gap = 1.3, 4.0
    stack_height = num_heads * seq_len + (num_heads - 1) * gap
    low = stack_height / 2 - seq_len / 2  # bottom of the one-matrix stage
    if ax is None:
        width = d_model + 2 * head_dim + 2 * stage_gap
        _, ax = plt.subplots(figsize=(0.36 * width + 1.6, 0.3 * stack_height + 1.4))
    ax.set_axis_off()
    ax.set_aspect("equal")

    def square(x0: float, y0: float, token: int) -> None:
        ax.add_patch(
            plt.Rectangle(
                (x0, y0), 1, 1, facecolor=colours[token], edgecolor="white", linewidth=0.8
            )
        )

    for i in range(seq_len):  # 1. the projected queries, one colour per token
        for c in range(d_model):
            square(c, low + seq_len - 1 - i, i)
        ax.text(-0.3, low + seq_len - 0.5 - i, f"token {i}", ha="right", va="center", fontsize=7)
    ax.text(
        d_model / 2,
        low - 0.6,
        f"Q (n, d_model) = ({seq_len}, {d_model})",
        ha="center",
        va="top",
        fontsize=9,
    )
    flat = torch.arange(seq_len * d_model)  # memory order of Q: token i, feature c at i·d + c
    right = flat.view(seq_len, num_heads, head_dim).transpose(0, 1)  # (h, n, d_k)
    wrong = flat.reshape(num_heads, seq_len, head_dim)  # (h, n, d_k): right shape, wrong numbers
    titles = (
        "view + swap n and h:\nrow i is token i",
        "reshape (h, n, d_k)\nwithout the swap:\nrows from the wrong tokens",
    )
    x = d_model + stage_gap
    for stack, title in zip((right, wrong), titles):
        for r in range(num_heads):
            y0 = stack_height - (r + 1) * seq_len - r * gap
            for i in range(seq_len):
                for c in range(head_dim):
                    square(x + c, y0 + seq_len - 1 - i, int(stack[r, i, c]) // d_model)
            ax.text(
                x + head_dim / 2,
                y0 + seq_len + 0.15,
                f"head {r}",
                ha="center",
                va="bottom",
                fontsize=7.5,
            )
        ax.text(x + head_dim / 2, -0.6, title, ha="center", va="top", fontsize=8.5)
        x += head_dim + stage_gap
    ax.set_xlim(-3.0, x - stage_gap + 0.5)
    ax.set_ylim(-3.4, stack_height + 1.2)
    return ax
