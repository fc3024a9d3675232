"""Position information: sinusoidal encoding, learned embeddings, rotary embeddings (RoPE), ALiBi.

Attention by itself ignores order (permuting the tokens permutes the outputs), so the model
needs to be told where each token is:

Notation as in chapter 4: ``i`` a position, ``m`` a pair index (dimensions ``2m``, ``2m+1``),
``Δ`` an offset.

* :func:`sinusoidal_frequencies` - the angular frequencies ``ω_m = 10000^(-2m/d)`` that the
  sinusoidal table and RoPE share.
* :func:`sinusoidal_table` / :class:`SinusoidalPositionalEncoding` - the fixed encoding of
  "Attention Is All You Need" (section 3.5), *added* to the token embeddings:
  ``PE[i, 2m] = sin(i / 10000^(2m/d_model))``, ``PE[i, 2m+1] = cos(i / 10000^(2m/d_model))``,
  i.e. wavelengths ``λ_m = 2π · 10000^(2m/d_model)`` from ``2π`` to almost ``10000 · 2π``.
  Moving ``Δ`` positions rotates every (sin, cos) pair by a fixed angle, so
  ``PE[i + Δ] = PE[i] @ M_Δ`` with a block-diagonal rotation ``M_Δ`` that does not depend on
  ``i`` (:func:`sinusoidal_shift_matrix`).
* :class:`LearnedPositionalEmbedding` - one trained vector per position, added likewise.
* :class:`RotaryEmbedding` - RoPE (Su et al., 2021): rotate each query and key pair of
  dimensions by an angle proportional to its position, so a query-key score depends only on
  the *offset* between them. :class:`companion.attention.MultiHeadAttention` applies it to
  its queries and keys with ``positional="rope"``.
* :func:`rope_rotate_half` / :func:`rope_layout_permutation` - RoPE's other layout (GPT-NeoX,
  Hugging Face), pairs ``(x_m, x_{m + head_dim/2})`` instead of ``(x_{2m}, x_{2m+1})``, and
  the reordering of the query/key features that converts a checkpoint between the two.
* :func:`alibi_slopes` / :func:`alibi_bias` - ALiBi (Press et al., 2022): no position vector
  at all, but a penalty ``-slope_h · distance`` added to the attention scores of head ``h``
  (``positional="alibi"`` in :class:`companion.attention.MultiHeadAttention`).
* :class:`NoPositionalEncoding` - adds nothing (dropout only), for models whose attention
  handles positions (RoPE, ALiBi) or that have no position information at all (NoPE).

Sequences longer than the table: the sinusoidal and rotary tables are **grown on demand**
(the formula is defined for every position; ``max_len`` is only the initial size). A learned
embedding has nothing to grow from, so a position ``>= max_len`` raises ``ValueError``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from companion._validation import (
    check_bool,
    check_finite,
    check_floating,
    check_integer,
    check_min_ndim,
    check_ndim,
    check_positive_int,
    check_probability,
    check_size,
    checked,
    checks_enabled,
    shape_str,
)
from companion.dropout import Dropout

__all__ = [
    "sinusoidal_frequencies",
    "sinusoidal_table",
    "sinusoidal_shift_matrix",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "rope_rotate_half",
    "rope_layout_permutation",
    "NoPositionalEncoding",
    "alibi_slopes",
    "alibi_bias",
]


def _check_even(name: str, value: int) -> int:
    if value % 2 != 0:
        raise ValueError(f"{name} must be even (dimensions come in sin/cos pairs), got {value}")
    return value


def _check_base(base: object) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base must be a float, got {type(base).__name__} ({base!r})")
    if not 0.0 < float(base) < float("inf"):
        raise ValueError(f"base must be a positive finite number, got {base}")
    return float(base)


def sinusoidal_frequencies(dim: int, *, base: float = 10000.0) -> Tensor:
    """The angular frequencies ``ω_m = base^(-2m/dim)``, ``m = 0 .. dim/2 - 1``, in float64.

    Pair ``m`` of dimensions ``(2m, 2m+1)`` turns by ``ω_m`` radians per position: ``ω_0 = 1``
    (wavelength ``2π``) down to almost ``1 / base`` (wavelength almost ``2π · base``). The
    sinusoidal table uses them with ``dim = d_model``, RoPE with ``dim = head_dim``.

    Args:
        dim: size of the vectors; must be even (dimensions come in pairs).
        base: ``10000`` in the paper.

    Returns:
        Tensor of shape ``(dim/2,)``, dtype float64.
    """
    _check_even("dim", check_positive_int("dim", dim))
    base = _check_base(base)
    two_m = torch.arange(0, dim, 2, dtype=torch.float64)  # (dim/2,) the even indices 2m
    return base ** (-two_m / dim)  # (dim/2,)


def sinusoidal_table(
    max_len: int, d_model: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The sinusoidal position encodings of "Attention Is All You Need".

    ``PE[i, 2m] = sin(i · ω_m)`` and ``PE[i, 2m+1] = cos(i · ω_m)`` for position ``i`` and pair
    ``m``, with ``ω_m = 1 / base^(2m/d_model)``: sine on even, cosine on odd dimensions,
    wavelengths ``λ_m = 2π / ω_m = 2π · base^(2m/d_model)`` (:func:`sinusoidal_frequencies`). Computed in
    float64, then cast to ``dtype``.

    Args:
        max_len: number of positions ``0 .. max_len - 1``.
        d_model: size of an encoding vector; must be even.
        base: ``10000`` in the paper.
        dtype: floating dtype of the result.

    Returns:
        Tensor of shape ``(max_len, d_model)``.
    """
    check_positive_int("max_len", max_len)
    _check_even("d_model", check_positive_int("d_model", d_model))
    positions = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    angles = positions * sinusoidal_frequencies(d_model, base=base)  # (max_len, d_model/2)
    table = torch.empty(max_len, d_model, dtype=torch.float64)  # (max_len, d_model)
    table[:, 0::2] = torch.sin(angles)  # even dimensions
    table[:, 1::2] = torch.cos(angles)  # odd dimensions
    return table.to(dtype)  # (max_len, d_model)


def sinusoidal_shift_matrix(
    shift: int, d_model: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The matrix ``M_Δ`` with ``PE[i + Δ] = PE[i] @ M_Δ`` for every position ``i``, codes
    being row vectors as everywhere in the course (chapter 4's ``M_Δ``).

    For each pair ``(sin(i ω_m), cos(i ω_m))`` the angle-addition formulas give the 2 × 2 block
    ``[[cos(Δ ω_m), -sin(Δ ω_m)], [sin(Δ ω_m), cos(Δ ω_m)]]``: a rotation by ``Δ ω_m`` that
    depends on the offset ``Δ`` only. ``M_Δ`` is block-diagonal with one such block per pair
    ``m``; ``M_{-Δ} = M_Δᵀ`` moves back, and ``M_Δ M_Δ' = M_{Δ + Δ'}``. RoPE's rotation of
    a row at position ``i`` (:class:`RotaryEmbedding`) is ``M_{-i}`` over the head width: the
    paper writes the sine first, so the same angle turns the other way.

    Args:
        shift: the offset ``Δ`` (may be negative).
        d_model: size of an encoding vector; must be even.

    Returns:
        Tensor of shape ``(d_model, d_model)``.
    """
    if isinstance(shift, bool) or not isinstance(shift, int):
        raise TypeError(f"shift must be an int, got {type(shift).__name__} ({shift!r})")
    _check_even("d_model", check_positive_int("d_model", d_model))
    angles = shift * sinusoidal_frequencies(d_model, base=base)  # (d_model/2,)
    cos, sin = torch.cos(angles), torch.sin(angles)  # (d_model/2,) each
    # row (sin, cos) of position i times [[cos, -sin], [sin, cos]] = row of position i + Δ
    blocks = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
    # blocks: (d_model/2, 2, 2), one rotation per frequency
    return torch.block_diag(*blocks).to(dtype)  # (d_model, d_model)


def _check_offset(offset: object) -> int:
    return check_positive_int("offset", offset, minimum=0)


def _check_vectors(name: str, x: object, size: int) -> Tensor:
    """Check a float ``(..., seq_len, size)`` tensor without NaN or infinity."""
    layout = f"(..., seq_len, {size})"
    tensor = check_floating(name, x)
    check_min_ndim(name, tensor, 2, layout)
    check_size(name, tensor, -1, size, layout)
    return check_finite(name, tensor)


def _check_positions_input(x: object, d_model: int, offset: object) -> None:
    """Check the input of a position encoding: float ``(..., seq_len, d_model)``, an offset."""
    _check_vectors("x", x, d_model)
    _check_offset(offset)


class SinusoidalPositionalEncoding(nn.Module):
    """Add the fixed sinusoidal encodings (:func:`sinusoidal_table`) to a sequence, then dropout.

    The table is a non-trainable buffer of ``max_len`` rows; a longer sequence grows it (to
    at least twice its size), so any length works. It is always computed in float64 and cast
    once to the buffer's dtype (the default dtype at construction, then the module's after
    ``.to(dtype)``/``.double()``): a float64 module has exact float64 encodings at every length.

    Args:
        d_model: size of the vectors; must be even.
        max_len: initial number of rows of the table.
        dropout: dropout probability applied to the sum (training mode only).
        base: ``10000`` in the paper.
    """

    def __init__(
        self, d_model: int, max_len: int = 5000, dropout: float = 0.0, base: float = 10000.0
    ) -> None:
        super().__init__()
        self.d_model = _check_even("d_model", check_positive_int("d_model", d_model))
        self.base = float(base)
        self.dropout = Dropout(check_probability("dropout", dropout))
        max_len = check_positive_int("max_len", max_len)
        table = sinusoidal_table(max_len, d_model, base=base, dtype=torch.get_default_dtype())
        self.register_buffer("table", table, persistent=False)  # (max_len, d_model)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        """``.to()``, ``.double()``, ``.cuda()``, ...: convert, then recompute the table from
        the formula in float64 and cast it once, so a float64 module gets float64 values (not a
        float32 table widened)."""
        super()._apply(fn, recurse)
        exact = sinusoidal_table(self.max_len, self.d_model, base=self.base, dtype=torch.float64)
        self.table = exact.to(self.table.device, self.table.dtype)  # (max_len, d_model)
        return self

    @property
    def max_len(self) -> int:
        """Current number of rows of the table."""
        return self.table.shape[0]

    def encodings(self, seq_len: int, offset: int = 0) -> Tensor:
        """Rows ``offset .. offset + seq_len - 1`` of the table, shape ``(seq_len, d_model)``."""
        if checks_enabled():  # not when called from forward
            check_positive_int("seq_len", seq_len)
            _check_offset(offset)
        needed = offset + seq_len
        if needed > self.max_len:  # grow: the formula holds for every position
            new_len = max(needed, 2 * self.max_len)
            grown = sinusoidal_table(new_len, self.d_model, base=self.base, dtype=torch.float64)
            self.table = grown.to(self.table.device, self.table.dtype)  # (new_len, d_model)
        return self.table[offset:needed]  # (seq_len, d_model)

    @checked("check_inputs")
    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x (..., seq_len, d_model)`` → ``dropout(x + PE[offset : offset + seq_len])``, same shape.

        ``offset`` is the position of the first element (non-zero when continuing a sequence).
        """
        encodings = self.encodings(x.shape[-2], offset).to(x.dtype)  # (seq_len, d_model)
        return self.dropout(x + encodings)  # (..., seq_len, d_model)

    def check_inputs(self, x: Tensor, offset: int = 0) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        _check_positions_input(x, self.d_model, offset)


class LearnedPositionalEmbedding(nn.Module):
    """Add one trained vector per position (as in BERT and GPT), then dropout.

    Positions ``>= max_len`` have no vector and raise ``ValueError``.

    Args:
        max_len: number of positions with a vector.
        d_model: size of the vectors.
        dropout: dropout probability applied to the sum (training mode only).
    """

    def __init__(self, max_len: int, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.max_len = check_positive_int("max_len", max_len)
        self.d_model = check_positive_int("d_model", d_model)
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = Dropout(check_probability("dropout", dropout))

    @checked("check_inputs")
    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x (..., seq_len, d_model)`` → ``dropout(x + P[offset : offset + seq_len])``, same shape."""
        seq_len = x.shape[-2]
        if offset + seq_len > self.max_len:
            raise ValueError(
                f"x has seq_len={seq_len} at offset={offset}, so it needs positions up to "
                f"{offset + seq_len - 1}, but the learned embedding has max_len={self.max_len} "
                f"(positions 0..{self.max_len - 1}); use a larger max_len"
            )
        positions = torch.arange(offset, offset + seq_len, device=x.device)  # (seq_len,)
        return self.dropout(x + self.embedding(positions))  # (..., seq_len, d_model)

    def check_inputs(self, x: Tensor, offset: int = 0) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        _check_positions_input(x, self.d_model, offset)


class RotaryEmbedding(nn.Module):
    r"""Rotary position embedding (RoPE, Su et al. 2021) for queries and keys.

    Dimensions ``(2m, 2m+1)`` of a query or key at position ``i`` are rotated by the angle
    ``i · ω_m`` with ``ω_m = base^(-2m/head_dim)`` (the frequencies of the sinusoidal
    encoding; RoFormer writes them ``θ_m``). Rotations compose, so the score of a query at
    ``i`` and a key at ``j`` is ``⟨R_i q, R_j k⟩ = ⟨q, R_{j-i} k⟩``: it depends on the offset
    ``Δ = j - i`` only. Apply it to
    the per-head queries and keys *inside* attention, not to the embeddings.

    The cos/sin tables are buffers of ``max_len`` rows, grown on demand for longer inputs.

    Args:
        head_dim: size of a query/key vector of one head; must be even.
        max_len: initial number of positions in the tables.
        base: ``10000`` as in the paper.
    """

    def __init__(self, head_dim: int, max_len: int = 2048, base: float = 10000.0) -> None:
        super().__init__()
        self.head_dim = _check_even("head_dim", check_positive_int("head_dim", head_dim))
        self.base = float(base)
        cos, sin = self._tables(check_positive_int("max_len", max_len), torch.get_default_dtype())
        self.register_buffer("cos", cos, persistent=False)  # (max_len, head_dim/2)
        self.register_buffer("sin", sin, persistent=False)  # (max_len, head_dim/2)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        """``.to()``, ``.double()``, ...: convert, then recompute the tables in float64 and cast
        them once (a float64 module gets float64 values, not float32 tables widened)."""
        super()._apply(fn, recurse)
        cos, sin = self._tables(self.max_len, self.cos.dtype)  # (max_len, head_dim/2) each
        self.cos, self.sin = cos.to(self.cos.device), sin.to(self.sin.device)
        return self

    def _tables(self, max_len: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        positions = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
        frequencies = sinusoidal_frequencies(self.head_dim, base=self.base)  # (head_dim/2,)
        angles = positions * frequencies  # (max_len, head_dim/2)
        return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)  # (max_len, head_dim/2)

    @property
    def max_len(self) -> int:
        """Current number of positions in the tables."""
        return self.cos.shape[0]

    def _ensure(self, needed: int) -> None:
        if needed > self.max_len:
            new_len = max(needed, 2 * self.max_len)
            cos, sin = self._tables(new_len, self.cos.dtype)  # (new_len, head_dim/2) each
            self.cos, self.sin = cos.to(self.cos.device), sin.to(self.sin.device)

    def rotate(self, x: Tensor, positions: Tensor | None = None, offset: int = 0) -> Tensor:
        """Rotate ``x`` by its positions.

        Args:
            x: queries or keys, shape ``(..., seq_len, head_dim)``, e.g.
                ``(batch, heads, seq_len, head_dim)``.
            positions: integer positions, shape ``(seq_len,)``, or ``(batch, seq_len)`` when
                ``x`` is ``(batch, heads, seq_len, head_dim)``; default
                ``offset, offset + 1, ..., offset + seq_len - 1``.
            offset: position of the first element when ``positions`` is not given.

        Returns:
            Tensor of the same shape as ``x``.

        Without ``positions`` the rows ``offset .. offset + seq_len - 1`` of the tables are a
        slice found from plain ints, with no look at tensor values (no host synchronisation):
        the path :class:`companion.attention.MultiHeadAttention` takes. Called from inside a
        checked module, the arguments are not checked again.
        """
        seq_len = x.shape[-2]
        if positions is None:
            if checks_enabled():
                _check_vectors("x", x, self.head_dim)
                _check_offset(offset)
            self._ensure(offset + seq_len)
            cos = self.cos[offset : offset + seq_len].to(x.dtype)  # (seq_len, head_dim/2)
            sin = self.sin[offset : offset + seq_len].to(x.dtype)  # (seq_len, head_dim/2)
        else:
            _check_vectors("x", x, self.head_dim)
            self._check_positions(positions, x)
            self._ensure(int(positions.max()) + 1)
            # cos, sin: (seq_len, head_dim/2), or (batch, seq_len, head_dim/2) for 2-D positions
            cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)
            if positions.dim() == 2:  # one row of positions per batch element: broadcast
                cos, sin = cos[:, None], sin[:, None]  # (batch, 1, seq_len, head_dim/2)
        x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., seq_len, head_dim/2) each
        rotated_even = x_even * cos - x_odd * sin  # (..., seq_len, head_dim/2)
        rotated_odd = x_even * sin + x_odd * cos  # (..., seq_len, head_dim/2)
        pairs = torch.stack([rotated_even, rotated_odd], dim=-1)  # (..., seq_len, head_dim/2, 2)
        return pairs.flatten(-2)  # (..., seq_len, head_dim)

    def _check_positions(self, positions: Tensor, x: Tensor) -> None:
        check_integer("positions", positions)
        seq_len = x.shape[-2]
        check_ndim("positions", positions, (1, 2), f"({seq_len},) or (batch, {seq_len})")
        if positions.shape[-1] != seq_len:
            raise ValueError(
                f"positions must have one entry per position of x (seq_len={seq_len}), "
                f"got shape {shape_str(positions.shape)} for x of shape {shape_str(x.shape)}"
            )
        if positions.dim() == 2 and (x.dim() != 4 or x.shape[0] != positions.shape[0]):
            raise ValueError(
                "positions of shape (batch, seq_len) need x of shape "
                f"({positions.shape[0]}, heads, {seq_len}, {self.head_dim}), "
                f"got x of shape {shape_str(x.shape)}"
            )
        if positions.numel() > 0 and int(positions.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(positions.min())}")

    def apply(  # type: ignore[override]
        self, q: Tensor, k: Tensor | None = None, positions: Tensor | None = None, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Rotate queries and keys of the same positions (self-attention).

        (Called with a function instead of tensors, this is ``nn.Module.apply(fn)``, so that
        ``model.apply(init_weights)`` still works on a model containing this module.)

        Args:
            q: queries ``(..., seq_len, head_dim)``.
            k: keys ``(..., seq_len, head_dim)``; same length as ``q`` (for keys at other
                positions, e.g. a KV cache, call :meth:`rotate` on each separately).
            positions, offset: as in :meth:`rotate`.

        Returns:
            ``(q_rotated, k_rotated)`` with the shapes of ``q`` and ``k``.
        """
        if callable(q) and not isinstance(q, Tensor):  # nn.Module.apply(fn)
            return super().apply(q)  # type: ignore[return-value]
        _check_vectors("q", q, self.head_dim)
        _check_vectors("k", k, self.head_dim)
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(
                f"q and k must have the same seq_len to share positions, got q "
                f"{shape_str(q.shape)} and k {shape_str(k.shape)}; call rotate() on each "
                "with its own positions instead"
            )
        return self.rotate(q, positions, offset), self.rotate(k, positions, offset)

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Same as :meth:`apply`."""
        return self.apply(q, k, positions, offset)


def rope_rotate_half(x: Tensor, *, offset: int = 0, base: float = 10000.0) -> Tensor:
    """RoPE in the *rotate-half* layout of GPT-NeoX and Hugging Face Transformers.

    :class:`RotaryEmbedding` pairs the features ``(2m, 2m+1)`` of a head vector (the
    *interleaved* layout of RoFormer and Meta's original LLaMA code). This function pairs
    feature ``m`` with feature ``m + head_dim/2``: with ``x = [x1 | x2]`` cut into halves, the
    vector at position ``i`` becomes ``x · cos + [-x2 | x1] · sin`` (the ``rotate_half`` trick),
    i.e. ``(x1_m, x2_m) -> (x1_m cos(i ω_m) - x2_m sin(i ω_m), x2_m cos(i ω_m) + x1_m sin(i ω_m))``
    with the same frequencies ``ω_m = base^(-2m/head_dim)``. The two layouts differ by a
    reordering of the features only (:func:`rope_layout_permutation`).

    Args:
        x: queries or keys, float, shape ``(..., seq_len, head_dim)`` with ``head_dim`` even,
            e.g. ``(batch, heads, seq_len, head_dim)``.
        offset: position of the first row (positions ``offset .. offset + seq_len - 1``).
        base: ``10000`` as in the paper.

    Returns:
        Tensor of the same shape and dtype as ``x``.
    """
    check_floating("x", x)
    check_min_ndim("x", x, 2, "(..., seq_len, head_dim)")
    head_dim = x.shape[-1]
    if head_dim == 0 or head_dim % 2 != 0:
        raise ValueError(
            "x must have shape (..., seq_len, head_dim) with head_dim even and non-zero "
            f"(features come in pairs), got shape {shape_str(x.shape)}"
        )
    check_finite("x", x)
    _check_offset(offset)
    base = _check_base(base)
    seq_len = x.shape[-2]
    positions = torch.arange(offset, offset + seq_len, dtype=torch.float64)[:, None]  # (seq_len, 1)
    angles = positions * sinusoidal_frequencies(head_dim, base=base)  # (seq_len, head_dim/2)
    cos = torch.cos(angles).to(x.device, x.dtype)  # (seq_len, head_dim/2)
    sin = torch.sin(angles).to(x.device, x.dtype)  # (seq_len, head_dim/2)
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]  # (..., seq_len, head_dim/2) each
    rotated_1 = x1 * cos - x2 * sin  # (..., seq_len, head_dim/2)
    rotated_2 = x2 * cos + x1 * sin  # (..., seq_len, head_dim/2)
    return torch.cat([rotated_1, rotated_2], dim=-1)  # (..., seq_len, head_dim)


def rope_layout_permutation(head_dim: int, *, num_heads: int = 1) -> Tensor:
    """The reordering of features that takes RoPE's interleaved layout to the rotate-half one.

    Pair ``m`` of a head vector is the features ``(2m, 2m+1)`` in the interleaved layout
    (:class:`RotaryEmbedding`) and ``(m, m + head_dim/2)`` in the rotate-half layout
    (:func:`rope_rotate_half`); both turn it by ``i · ω_m`` at position ``i``. Within each head the order
    returned is ``0, 2, 4, ..., head_dim - 2, 1, 3, ..., head_dim - 1``, so for a head
    vector ``x`` and ``perm = rope_layout_permutation(head_dim)``

        ``rope_rotate_half(x[..., perm]) == RotaryEmbedding(head_dim).rotate(x)[..., perm]``.

    A score is a dot product of a rotated query and a rotated key, and reordering both alike
    leaves it unchanged. So a checkpoint trained with interleaved RoPE runs with rotate-half
    RoPE once the rows (output features) of its query and key projections are reordered,
    ``weight[perm]`` and ``bias[perm]`` with ``perm = rope_layout_permutation(head_dim,
    num_heads=...)``; values and the output projection stay as they are. The other direction,
    rotate-half to interleaved, is ``torch.argsort(perm)``.

    Args:
        head_dim: features per head; even.
        num_heads: number of heads stacked head after head along the features: ``num_heads``
            for ``W_Q``, the number of key/value heads for ``W_K`` under grouped-query attention.

    Returns:
        int64 tensor of shape ``(num_heads * head_dim,)``; entry ``h * head_dim + r`` is the
        interleaved feature that lands at feature ``r`` of head ``h`` in the rotate-half layout.
    """
    _check_even("head_dim", check_positive_int("head_dim", head_dim))
    check_positive_int("num_heads", num_heads)
    within = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])  # (head_dim,)
    head_starts = torch.arange(num_heads)[:, None] * head_dim  # (num_heads, 1)
    return (head_starts + within).flatten()  # (num_heads * head_dim,)


class NoPositionalEncoding(nn.Module):
    """Add no position information, ``x`` → ``dropout(x)``, in the place of a position encoding.

    For a model whose attention takes care of positions itself (RoPE rotates the queries and
    keys, ALiBi biases the scores) and for a model with no position information at all
    ("NoPE"). Without positions an encoder cannot tell the order of its tokens: permuting the
    input permutes its output the same way (it is permutation-equivariant). A causal decoder
    still can, because each position sees a different number of tokens.

    Args:
        d_model: size of the vectors (checked on input).
        dropout: dropout probability (training mode only), the one the other encodings apply
            after their sum.
    """

    def __init__(self, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.dropout = Dropout(check_probability("dropout", dropout))

    @checked("check_inputs")
    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x (..., seq_len, d_model)`` → ``dropout(x)``, same shape; ``offset`` is ignored
        (accepted so that every position module is called the same way)."""
        return self.dropout(x)  # (..., seq_len, d_model)

    def check_inputs(self, x: Tensor, offset: int = 0) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        _check_positions_input(x, self.d_model, offset)


def _geometric_slopes(num_heads: int) -> Tensor:
    """``2^(-8·1/n), 2^(-8·2/n), ..., 2^(-8)`` for ``n = num_heads``, float64 ``(n,)``."""
    steps = torch.arange(1, num_heads + 1, dtype=torch.float64)  # (n,) 1 .. n
    return 2.0 ** (-8.0 * steps / num_heads)  # (n,)


def alibi_slopes(num_heads: int, *, dtype: torch.dtype | None = None) -> Tensor:
    """The slope of every head in ALiBi (Press et al., 2022, "Train Short, Test Long").

    Head ``r`` adds ``-slope_r · distance`` to its scores, so each head forgets distant keys at
    its own rate: steep slopes give local heads, gentle slopes heads that look far back.

    * ``num_heads = n`` a power of two: the geometric sequence whose first term and ratio are
      both ``2^(-8/n)``, i.e. ``2^(-8/n), 2^(-16/n), ..., 2^(-8)`` (8 heads:
      ``1/2, 1/4, ..., 1/256``);
    * any other ``n``: the paper's rule. Take the ``p`` slopes of the largest power of two
      ``p < n``, then, for the ``n - p`` heads left, the 1st, 3rd, 5th, ... slopes of ``2p``
      heads (``2^(-4/p), 2^(-12/p), ...``), the terms of ``2p``'s sequence that ``p``'s lacks.
      The first of them, ``2^(-4/p)``, is steeper than every slope of ``p``; each later one
      lies between two of them. E.g. 6 heads: ``2^-2, 2^-4, 2^-6, 2^-8``, then ``2^-1``
      (steeper than all four) and ``2^-3`` (between ``2^-2`` and ``2^-4``).

    Up to 8 heads every slope is a power of two, exact in any floating dtype.

    Args:
        num_heads: number of attention heads.
        dtype: floating dtype of the result; default ``torch.get_default_dtype()``.

    Returns:
        Tensor of shape ``(num_heads,)``.
    """
    check_positive_int("num_heads", num_heads)
    power = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    slopes = _geometric_slopes(power)  # (power,)
    if power < num_heads:
        between = _geometric_slopes(2 * power)[0::2]  # (power,) the odd-numbered slopes of 2p
        slopes = torch.cat([slopes, between[: num_heads - power]])  # (num_heads,)
    return slopes.to(torch.get_default_dtype() if dtype is None else dtype)  # (num_heads,)


def alibi_bias(
    slopes: Tensor, q_len: int, k_len: int, *, offset: int = 0, causal: bool = True
) -> Tensor:
    """The ALiBi bias added to the attention scores (before the softmax).

    Query ``i`` sits at position ``offset + i``, key ``j`` at position ``j``; head ``h`` gets

    * ``causal=True`` (the paper, a decoder): ``-slope_h · ((offset + i) - j)``, a penalty
      growing linearly with how far back the key is. Keys after the query get a positive
      value: they are meant to be masked by the causal mask;
    * ``causal=False`` (bidirectional, e.g. an encoder): ``-slope_h · |offset + i - j|``,
      the same penalty for keys on either side.

    The two agree on every key a causal query may see (``j <= offset + i``). Only distances
    matter, so adding a constant to every position changes nothing; a query continuing a
    sequence (the KV cache) takes ``offset = k_len - q_len``, its keys being the earlier
    positions plus its own.

    Args:
        slopes: one slope per head, shape ``(heads,)`` (:func:`alibi_slopes`).
        q_len: number of queries.
        k_len: number of keys.
        offset: position of the first query.
        causal: which of the two forms above.

    Returns:
        Tensor of shape ``(heads, q_len, k_len)`` with the dtype and device of ``slopes``.
    """
    if checks_enabled():  # not when called from inside a checked module
        check_floating("slopes", slopes)
        check_ndim("slopes", slopes, 1, "(heads,)")
        check_finite("slopes", slopes)
        check_positive_int("q_len", q_len, minimum=0)
        check_positive_int("k_len", k_len, minimum=0)
        _check_offset(offset)
        check_bool("causal", causal)
    options = {"dtype": slopes.dtype, "device": slopes.device}
    query_positions = torch.arange(offset, offset + q_len, **options)  # (q_len,)
    key_positions = torch.arange(k_len, **options)  # (k_len,)
    distance = query_positions[:, None] - key_positions[None, :]  # (q_len, k_len) i - j
    if not causal:
        distance = distance.abs()  # (q_len, k_len) |i - j|
    return -slopes[:, None, None] * distance  # (heads, q_len, k_len)
