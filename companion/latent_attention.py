r"""Multi-head latent attention (MLA, DeepSeek-V2, 2024): a small key/value cache.

Decoding one token at a time, multi-head attention keeps every earlier token's keys and values:
``2·heads·head_dim`` numbers per token and layer (:class:`companion.cache.KeyValueCache`).
Grouped-query attention shares them among ``g`` groups of heads (``2·g·head_dim``). MLA keeps
one short vector per token instead, a latent ``c`` of ``d_latent`` numbers, and rebuilds every
head's key and value from it::

    c   = x W_down            (d_model → d_latent)   the only thing the cache keeps
    k_h = c W_up_k[h]         (d_latent → head_dim)  every head's key ...
    v_h = c W_up_v[h]         (d_latent → head_dim)  ... and value, from the same c
    q_h = x W_q[h]            (d_model → head_dim)
    output = concat_h(attention(q_h, k_h, v_h)) W_o

Seen from outside it is multi-head attention whose key and value matrices
``W_k = W_down W_up_k`` and ``W_v = W_down W_up_v`` have rank at most ``d_latent``.

**Absorbed form.** A score ``q_h · k_h = q_h · (c W_up_k[h]) = (q_h W_up_k[h]ᵀ) · c``: the
up-projection can move to the query side, and the queries then meet the cached latents
directly, never the keys. Likewise ``weights @ (c W_up_v[h]) = (weights @ c) W_up_v[h]``: the
value up-projection moves after the weighted sum, next to ``W_o``. A decoding step then reads
``d_latent`` numbers per cached token (shared by every head) and builds no key or value, where
the naive form rebuilds ``2·heads·head_dim`` numbers for every cached token at every step.
:meth:`MultiHeadLatentAttention.absorbed_weights` gives the
folded matrices a deployment multiplies once (``W_q[h] W_up_k[h]ᵀ`` and ``W_up_v[h] W_o[h]``).

**What is left out of DeepSeek-V2, on purpose.**

* *Query compression*: DeepSeek-V2 also sends the queries through a low-rank latent of their
  own, which saves activation memory in training but leaves the cache as it is. Here
  ``q = x W_q``.
* *Decoupled RoPE* is described, not built. Rotary embeddings rotate a key by an angle that
  depends on its position ``j`` and a query by one for ``i``, so a score becomes
  ``q_h R_(j-i) W_up_k[h]ᵀ · c``: the matrix between query and latent now changes with the
  distance ``j - i``, and ``W_up_k`` no longer folds once into the query side. DeepSeek-V2
  therefore gives each query a few extra dimensions that carry RoPE, and each token one extra
  rotated key part shared by all heads; the score is the sum of the two parts and the cache
  holds ``d_latent`` plus that small rotated part. Positions here come from outside (added to
  ``x``, as the book's model does), which keeps the module to the latent idea alone.

Mask convention as in :mod:`companion.attention`: a boolean mask is ``True`` where a query
**may attend**; a query whose keys are all blocked gets zero weights and a zero output.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from companion import kernels
from companion._validation import (
    check_bool,
    check_bool_mask,
    check_divisible,
    check_finite,
    check_floating,
    check_ndim,
    check_positive_int,
    check_probability,
    check_same_device,
    check_same_dtype,
    check_size,
    checked,
    shape_str,
)
from companion.attention import scaled_dot_product_attention
from companion.cache import LatentCache
from companion.masking import causal_mask

__all__ = ["MultiHeadLatentAttention", "AbsorbedWeights", "latent_attention_parameters"]


def latent_attention_parameters(d_model: int, d_latent: int, *, bias: bool = False) -> int:
    """Number of parameters of :class:`MultiHeadLatentAttention` (independent of the heads).

    ``W_q`` and ``W_o`` hold ``d_model²`` each, ``W_down``, ``W_up_k`` and ``W_up_v``
    ``d_model·d_latent`` each: ``2·d_model² + 3·d_model·d_latent``, plus
    ``2·d_model + d_latent`` biases (query, latent, output) with ``bias=True``. Multi-head
    attention has ``4·d_model²`` (+ ``4·d_model``): MLA has fewer while
    ``d_latent < 2·d_model/3``.
    """
    check_positive_int("d_model", d_model)
    check_positive_int("d_latent", d_latent)
    check_bool("bias", bias)
    weights = 2 * d_model * d_model + 3 * d_model * d_latent
    return weights + (2 * d_model + d_latent if bias else 0)


class AbsorbedWeights(NamedTuple):
    """The up-projections folded into the query and output sides, per head.

    With ``c (batch, k_len, d_latent)`` the latents and ``x (batch, q_len, d_model)`` the
    input, head ``h`` computes::

        query_h = x @ query[h] + query_bias[h]                   # (batch, q_len, d_latent)
        scores_h = query_h @ cᵀ / √head_dim                      # (batch, q_len, k_len)
        output = Σ_h (softmax(scores_h) @ c) @ output[h] + b_o   # (batch, q_len, d_model)

    Attributes:
        query: ``(heads, d_model, d_latent)``, ``W_q[h] W_up_k[h]ᵀ``.
        query_bias: ``(heads, d_latent)``, the query bias carried along, or ``None``.
        output: ``(heads, d_latent, d_model)``, ``W_up_v[h] W_o[h]`` (``W_o[h]`` the rows of
            ``W_o`` that head ``h``'s output meets); ``b_o`` stays ``out_proj.bias``.
    """

    query: Tensor
    query_bias: Tensor | None
    output: Tensor


class MultiHeadLatentAttention(nn.Module):
    r"""Self-attention whose keys and values come from one low-rank latent per token.

    See the module docstring for the formulas. Two paths give the same output (up to rounding):

    * ``absorbed=False`` - the naive one: rebuild every head's keys and values from all the
      latents, then attend as multi-head attention does;
    * ``absorbed=True`` - the inference one: queries are turned into latent coordinates
      (``q_h W_up_k[h]ᵀ``), attend over the latents themselves, and the weighted latent goes
      through ``W_up_v[h]`` and ``W_o``. No key or value of a cached token is ever built.
      The factors are applied one after the other; :meth:`absorbed_weights` gives their
      products.

    Compared with :class:`companion.attention.MultiHeadAttention` (``d_model=256``, 8 heads,
    ``d_latent=64``): the cache holds 64 numbers per token and layer instead of
    ``2·256 = 512``; the parameters are ``2·d_model² + 3·d_model·d_latent`` = 180,224 instead
    of ``4·d_model²`` = 262,144 (:func:`latent_attention_parameters`). The price is
    expressiveness: ``W_k`` and ``W_v`` have rank ``d_latent`` at most. With ``d_latent =
    d_model`` and invertible up-projections the two modules represent the same functions.

    Args:
        d_model: size of the input and output vectors; divisible by ``num_heads``.
        num_heads: number of heads; ``head_dim = d_model / num_heads``.
        d_latent: size of the latent kept per token.
        dropout: dropout probability on the attention weights (training mode only).
        bias: whether ``query_proj``, ``latent_proj`` and ``out_proj`` have biases. The
            up-projections never have one: a key bias would add the same number to all the
            scores of a query, which softmax ignores, and a value bias the same vector to
            every output, which ``out_proj``'s bias can hold.

    Parameters: ``query_proj`` (``W_q``, ``d_model → d_model``), ``latent_proj``
    (``W_down``, ``d_model → d_latent``), ``key_up`` and ``value_up`` (``W_up_k``, ``W_up_v``,
    ``d_latent → d_model``, head ``h`` owning outputs ``h·head_dim`` to ``(h+1)·head_dim - 1``)
    and ``out_proj`` (``W_o``), all ``nn.Linear``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_latent: int,
        *,
        dropout: float = 0.0,
        bias: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("d_latent", d_latent)
        check_divisible("d_model", d_model, "num_heads", num_heads)
        self.d_model, self.num_heads, self.d_latent = d_model, num_heads, d_latent
        self.head_dim = d_model // num_heads
        self.dropout = check_probability("dropout", dropout)
        self.bias = check_bool("bias", bias)
        self.query_proj = nn.Linear(d_model, d_model, bias=bias)
        self.latent_proj = nn.Linear(d_model, d_latent, bias=bias)
        self.key_up = nn.Linear(d_latent, d_model, bias=False)
        self.value_up = nn.Linear(d_latent, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, d_latent={self.d_latent}, "
            f"dropout={self.dropout}"
        )

    @property
    def num_parameters(self) -> int:
        """:func:`latent_attention_parameters` for this module's sizes."""
        return latent_attention_parameters(self.d_model, self.d_latent, bias=self.bias)

    # ------------------------------------------------------------------ forward

    @checked("check_inputs")
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        cache: LatentCache | None = None,
        absorbed: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Self-attention of ``x`` over itself and the cached positions.

        Args:
            x: the new positions, ``(batch, q_len, d_model)``.
            mask: optional boolean mask, ``True`` = may attend, broadcastable to
                ``(batch, heads, q_len, k_len)``, e.g. padding ``(batch, 1, 1, k_len)``;
                ``k_len`` counts the cached positions too.
            is_causal: also apply :func:`companion.masking.causal_mask` ``(q_len, k_len)``
                (the new positions are the last ``q_len`` of ``k_len``).
            cache: a :class:`LatentCache`; the latents of ``x`` are appended to it (in place)
                and attention runs over all of them.
            absorbed: use the absorbed form (attend over the latents, never build keys or
                values); same output.

        Returns:
            ``(output, weights)``: ``(batch, q_len, d_model)`` and the attention weights
            ``(batch, heads, q_len, k_len)`` (before dropout). A query with no key to attend
            to gets zero weights and a zero output.
        """
        latents = self.latents(x, cache)  # (batch, k_len, d_latent)
        mask = _with_causal(mask, is_causal, x.shape[1], latents.shape[1], x.device)
        q = _split_heads(self.query_proj(x), self.num_heads)  # (batch, heads, q_len, head_dim)
        attend = self.attend_absorbed if absorbed else self.attend_naive
        per_head, weights = attend(q, latents, mask)  # (batch, heads, q_len, head_dim), weights
        output = self.out_proj(_merge_heads(per_head))  # (batch, q_len, d_model)
        if mask is not None:  # a query that may attend nowhere: zeros, not out_proj's bias
            output = output.masked_fill(
                ~kernels.rows_with_a_key(mask), 0.0
            )  # (batch, q_len, d_model)
        return output, weights

    def latents(self, x: Tensor, cache: LatentCache | None = None) -> Tensor:
        """The latents of ``x (batch, q_len, d_model)`` after the cached ones (no input checks):
        ``(batch, cached_len + q_len, d_latent)``; stored back into ``cache``."""
        latents = self.latent_proj(x)  # (batch, q_len, d_latent)
        if cache is not None:
            if cache.latents is not None:
                latents = torch.cat([cache.latents, latents], dim=1)  # (batch, k_len, d_latent)
            cache.latents = latents
        return latents

    def attend_naive(
        self, q: Tensor, latents: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Rebuild the keys and values, then attend (no input checks).

        Args:
            q: ``(batch, heads, q_len, head_dim)``.
            latents: ``(batch, k_len, d_latent)``.
            mask: boolean, broadcastable to ``(batch, heads, q_len, k_len)``, or ``None``.

        Returns:
            ``(batch, heads, q_len, head_dim)`` and the weights ``(batch, heads, q_len, k_len)``.
        """
        k = _split_heads(self.key_up(latents), self.num_heads)  # (batch, heads, k_len, head_dim)
        v = _split_heads(self.value_up(latents), self.num_heads)  # (batch, heads, k_len, head_dim)
        return scaled_dot_product_attention(q, k, v, mask, self._dropout_p())

    def attend_absorbed(
        self, q: Tensor, latents: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Attend over the latents themselves (no input checks); same arguments and results as
        :meth:`attend_naive`.

        Every head's queries become rows of one matrix that meets the one shared latent
        sequence, as the single key/value head of multi-query attention does.
        """
        batch, heads, q_len, _ = q.shape
        k_len, d_latent = latents.shape[1], self.d_latent
        key_up = self.key_up.weight.view(heads, self.head_dim, d_latent)  # W_up_k per head
        q_latent = q @ key_up  # (batch, heads, q_len, d_latent): q_h W_up_k[h]ᵀ
        rows = q_latent.reshape(batch, heads * q_len, d_latent)  # (batch, heads·q_len, d_latent)
        if mask is not None:
            mask = mask.expand(batch, heads, q_len, k_len).reshape(batch, heads * q_len, k_len)
        mixed, weights = scaled_dot_product_attention(
            rows, latents, latents, mask, self._dropout_p(), scale=self.head_dim**-0.5
        )  # (batch, heads·q_len, d_latent), (batch, heads·q_len, k_len)
        mixed = mixed.view(batch, heads, q_len, d_latent)  # weighted latents per head
        value_up = self.value_up.weight.view(heads, self.head_dim, d_latent)  # W_up_v per head
        per_head = mixed @ value_up.transpose(1, 2)  # (batch, heads, q_len, head_dim)
        return per_head, weights.view(batch, heads, q_len, k_len)

    def absorbed_weights(self) -> AbsorbedWeights:
        """The up-projections folded into the query and output sides (see
        :class:`AbsorbedWeights` for how they are used): ``query (heads, d_model, d_latent)``,
        ``query_bias (heads, d_latent)`` or ``None``, ``output (heads, d_latent, d_model)``.
        Differentiable; wrap in ``torch.no_grad()`` to precompute them for inference."""
        heads, head_dim, d_model = self.num_heads, self.head_dim, self.d_model
        key_up = self.key_up.weight.view(heads, head_dim, -1)  # (heads, head_dim, d_latent)
        value_up = self.value_up.weight.view(heads, head_dim, -1)  # (heads, head_dim, d_latent)
        query_rows = self.query_proj.weight.view(heads, head_dim, d_model)  # (heads, hd, d_model)
        query = query_rows.transpose(1, 2) @ key_up  # (heads, d_model, d_latent)
        query_bias = None
        if self.query_proj.bias is not None:
            bias_rows = self.query_proj.bias.view(heads, 1, head_dim)  # (heads, 1, head_dim)
            query_bias = (bias_rows @ key_up).squeeze(1)  # (heads, d_latent)
        out_rows = self.out_proj.weight.t().reshape(heads, head_dim, -1)  # (heads, hd, d_model)
        output = value_up.transpose(1, 2) @ out_rows  # (heads, d_latent, d_model)
        return AbsorbedWeights(query, query_bias, output)

    def _dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    # ------------------------------------------------------------------ checks

    def check_inputs(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        cache: LatentCache | None = None,
        absorbed: bool = False,
    ) -> None:
        """Raise a clear error for anything :meth:`forward` cannot take (same arguments)."""
        layout = f"(batch, q_len, {self.d_model})"
        dtype = self.out_proj.weight.dtype
        check_floating("x", x)
        check_ndim("x", x, 3, layout)
        check_size("x", x, 2, self.d_model, layout)
        if not torch.is_autocast_enabled(x.device.type):  # autocast mixes dtypes
            check_same_dtype("x", x, dtype, "the module's parameters")
        check_finite("x", x)
        check_bool("is_causal", is_causal)
        check_bool("absorbed", absorbed)
        batch, q_len, _ = x.shape
        k_len = q_len + (0 if cache is None else self._cached_length(cache, batch, dtype))
        if mask is not None:
            score_shape = (batch, self.num_heads, q_len, k_len)
            check_bool_mask("mask", mask, score_shape, "(batch, heads, q_len, k_len)")

    def _cached_length(self, cache: object, batch: int, dtype: torch.dtype) -> int:
        """Check ``cache`` for a call with ``batch`` rows; the number of cached positions."""
        if not isinstance(cache, LatentCache):
            raise TypeError(
                "cache must be a companion.cache.LatentCache (MLA caches latents, not keys "
                f"and values), got {type(cache).__name__}"
            )
        if cache.latents is None:
            return 0
        latents, layout = cache.latents, f"({batch}, cached_len, {self.d_latent})"
        check_floating("cache.latents", latents)
        if latents.dim() != 3 or latents.shape[0] != batch or latents.shape[2] != self.d_latent:
            raise ValueError(
                f"cache.latents must have shape {layout} for this call, "
                f"got {shape_str(latents.shape)}"
            )
        check_same_device("cache.latents", latents, self.out_proj.weight)
        if not torch.is_autocast_enabled(latents.device.type):  # autocast mixes dtypes
            check_same_dtype("cache.latents", latents, dtype, "the module's parameters")
        return latents.shape[1]


def _with_causal(
    mask: Tensor | None, is_causal: bool, q_len: int, k_len: int, device: torch.device
) -> Tensor | None:
    """``mask`` combined with the causal mask ``(q_len, k_len)`` when ``is_causal``; a single
    query (a decoding step, the newest position) may see every key."""
    if not is_causal or q_len <= 1:
        return mask
    causal = causal_mask(q_len, k_len, device=device)  # (q_len, k_len)
    return causal if mask is None else mask & causal  # broadcastable to the scores


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """``(batch, len, heads·head_dim)`` → ``(batch, heads, len, head_dim)`` (a view)."""
    batch, length, width = x.shape
    return x.view(batch, length, heads, width // heads).transpose(1, 2)  # (batch, heads, len, hd)


def _merge_heads(x: Tensor) -> Tensor:
    """``(batch, heads, len, head_dim)`` → ``(batch, len, heads·head_dim)``."""
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)  # (batch, len, d_model)
