"""Parity with ``torch.nn`` in float32 *and* float64, for outputs and for gradients (of the
inputs and of every parameter), for attention, both layers, both stacks and the whole model
(issue 11). The code paths covered, as README states:

* evaluation mode, and training mode with dropout 0 (dropout > 0 draws other random numbers
  than torch, so only its statistics can agree);
* our two attention paths (``need_weights=False``: the fused kernel; ``True``: the explicit
  formula);
* torch's "fast path" (the fused inference kernels of ``nn.MultiheadAttention`` and
  ``nn.TransformerEncoderLayer``, taken in evaluation mode without gradients) on and off.

Gradients are compared parameter by parameter: torch's gradients are written into a copy of
torch's module as if they were weights, then loaded into one of ours with
:func:`companion.interop.load_from_torch`, which maps every tensor (e.g. torch's packed
``in_proj_weight`` onto our three projections) exactly as it maps weights.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import randomize_
from torch import nn

from companion.attention import MultiHeadAttention
from companion.interop import load_from_torch, to_torch, to_torch_attn_mask
from companion.layers import DecoderLayer, EncoderLayer
from companion.masking import causal_mask
from companion.model import Decoder, Encoder, Transformer, TransformerConfig
from companion.train import compile_model

D, HEADS, D_FF, BATCH, SRC, TGT = 8, 2, 12, 3, 5, 4
#: output and gradient tolerance per dtype (float32: the README's 1e-5)
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
DTYPES = [torch.float32, torch.float64]


def as_ours(theirs: nn.Module, template: nn.Module, *, grads: bool) -> nn.Module:
    """A copy of ``template`` (one of our modules, not yet run) holding ``theirs``' weights,
    or its gradients (``grads=True``)."""
    source = copy.deepcopy(theirs)
    if grads:
        with torch.no_grad():
            for parameter, original in zip(source.parameters(), theirs.parameters()):
                grad = original.grad
                parameter.copy_(torch.zeros_like(parameter) if grad is None else grad)
    target = copy.deepcopy(template)
    load_from_torch(target, source)
    return target


def assert_grads_match(
    ours: nn.Module, theirs: nn.Module, template: nn.Module, dtype: torch.dtype
) -> None:
    expected = dict(as_ours(theirs, template, grads=True).named_parameters())
    for name, parameter in ours.named_parameters():
        got = torch.zeros_like(parameter) if parameter.grad is None else parameter.grad
        torch.testing.assert_close(got, expected[name], rtol=0, atol=TOL[dtype], msg=name)


def build(kind: str, norm_first: bool, dtype: torch.dtype, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    config = TransformerConfig(
        d_model=D, num_heads=HEADS, num_layers=2, d_ff=D_FF, dropout=0.0, norm_first=norm_first
    )
    options = {"dropout": 0.0, "norm_first": norm_first}
    module = {
        "attention": lambda: MultiHeadAttention(D, HEADS),
        "encoder layer": lambda: EncoderLayer(D, HEADS, D_FF, **options),
        "decoder layer": lambda: DecoderLayer(D, HEADS, D_FF, **options),
        "encoder": lambda: Encoder(config),
        "decoder": lambda: Decoder(config),
    }[kind]()
    return randomize_(module, torch.Generator().manual_seed(seed)).to(dtype)


def inputs(kind: str, dtype: torch.dtype, seed: int):
    """(tensors that get gradients, our call, torch's call) for one module kind."""
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(BATCH, TGT, D, generator=gen, dtype=dtype, requires_grad=True)
    memory = torch.randn(BATCH, SRC, D, generator=gen, dtype=dtype, requires_grad=True)
    padding = torch.ones(BATCH, SRC, dtype=torch.bool)
    padding[1, 3:] = False  # one padded source: no row is fully masked
    ours_mask, torch_padding = padding[:, None, None, :], ~padding
    causal = to_torch_attn_mask(causal_mask(TGT))
    if kind == "attention":
        return (
            (x, memory),
            lambda m, w: m(x, memory, memory, ours_mask, need_weights=w)[0],
            lambda t: t(x, memory, memory, key_padding_mask=torch_padding, need_weights=False)[0],
        )
    if kind in ("encoder layer", "encoder"):
        keys = padding[:, :TGT]
        x_mask = keys[:, None, None, :]
        kw = {"src_key_padding_mask": ~keys}
        return (x,), lambda m, w: m(x, x_mask, need_weights=w), lambda t: t(x, **kw)
    kw = {"tgt_mask": causal, "memory_key_padding_mask": torch_padding, "tgt_is_causal": True}
    return (
        (x, memory),
        lambda m, w: m(x, memory, None, ours_mask, need_weights=w),  # masks: target, memory
        lambda t: t(x, memory, **kw),
    )


KINDS = ["attention", "encoder layer", "decoder layer", "encoder", "decoder"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["eval", "train (dropout 0)"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_outputs_and_gradients_match_torch(kind, norm_first, dtype, mode, need_weights):
    if kind == "attention" and norm_first:
        pytest.skip("attention has no norm_first")
    seed = 7
    ours = build(kind, norm_first, dtype, seed).train(mode != "eval")
    template = copy.deepcopy(ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # enable_nested_tensor / norm_first notices
        theirs = to_torch(ours).to(dtype).train(mode != "eval")
    tensors, call_ours, call_theirs = inputs(kind, dtype, seed)
    weights = torch.randn(BATCH, TGT, D, generator=torch.Generator().manual_seed(3), dtype=dtype)

    got = call_ours(ours, need_weights)
    (got * weights).sum().backward()
    ours_input_grads = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    expected = call_theirs(theirs)
    (expected * weights).sum().backward()

    torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])
    for mine, reference in zip(ours_input_grads, [t.grad for t in tensors]):
        torch.testing.assert_close(mine, reference, rtol=0, atol=TOL[dtype])
    assert_grads_match(ours, theirs, template, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("kind", ["attention", "encoder layer", "encoder"])
def test_eval_outputs_match_torch_fast_path_on_and_off(kind, dtype, fast_path):
    """Without gradients in evaluation mode torch takes its fused inference path (when
    enabled): the outputs agree with it as with the plain path."""
    ours = build(kind, False, dtype, 11).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = to_torch(ours).to(dtype).eval()
    tensors, call_ours, call_theirs = inputs(kind, dtype, 11)
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(fast_path)
    try:
        with torch.no_grad():
            got, expected = call_ours(ours, False), call_theirs(theirs)
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)
    if kind != "attention":  # torch's fast path leaves padded positions' outputs undefined
        real = torch.ones(BATCH, TGT, dtype=torch.bool)
        real[1, 3:] = False
        got, expected = got[real], expected[real]
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])


WHOLE_MODEL_CASES = [
    *[(dtype, norm_first, mode, False) for dtype in DTYPES for norm_first in (False, True)
      for mode in ("eval", "train (dropout 0)")],
    # compiled as `companion.train --compile` trains the course's Pre-LN configurations
    # (companion.train.compile_model); one case, as compiling costs ~40 s on a 2-core CPU
    (torch.float32, True, "train (dropout 0)", True),
]  # fmt: skip


@pytest.mark.parametrize(("dtype", "norm_first", "mode", "compiled"), WHOLE_MODEL_CASES, ids=str)
def test_whole_model_outputs_and_gradients_match_torch(dtype, norm_first, mode, compiled):
    """The whole Transformer: our embeddings, positions and generator around torch's
    ``nn.Transformer`` give the same logits and the same gradient for every parameter;
    compiled with ``torch.compile(fullgraph=True)`` too."""
    torch.manual_seed(5)
    config = TransformerConfig(
        11, 13, d_model=D, num_heads=HEADS, num_layers=2, d_ff=D_FF, dropout=0.0,
        norm_first=norm_first, src_pad_id=0, tgt_pad_id=0,
    )  # fmt: skip
    ours = randomize_(Transformer(config), torch.Generator().manual_seed(5)).to(dtype)
    ours.train(mode != "eval")
    twin = copy.deepcopy(ours)  # supplies embeddings, positions and generator to torch's side
    template = copy.deepcopy(ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = to_torch(ours).to(dtype).train(mode != "eval")
    gen = torch.Generator().manual_seed(6)
    src = torch.randint(1, 11, (BATCH, SRC), generator=gen)
    tgt = torch.randint(1, 13, (BATCH, TGT), generator=gen)
    src[1, 3:] = 0  # padding at the end: no query is left without a key
    tgt[2, 2:] = 0
    weights = torch.randn(BATCH, TGT, 13, generator=gen, dtype=dtype)

    if compiled:
        torch._dynamo.reset()
    logits = (compile_model(ours) if compiled else ours)(src, tgt)  # (batch, tgt_len, vocab)
    (logits * weights).sum().backward()
    src_x = twin.src_positions(twin.src_embedding(src))  # (batch, src_len, d_model)
    tgt_x = twin.tgt_positions(twin.tgt_embedding(tgt))  # (batch, tgt_len, d_model)
    out = theirs(
        src_x, tgt_x,
        tgt_mask=to_torch_attn_mask(causal_mask(TGT)),
        src_key_padding_mask=src == 0,
        tgt_key_padding_mask=tgt == 0,
        memory_key_padding_mask=src == 0,
        tgt_is_causal=True,
    )  # fmt: skip
    expected = twin.generator(out)  # (batch, tgt_len, tgt_vocab)
    (expected * weights).sum().backward()

    torch.testing.assert_close(logits, expected, rtol=0, atol=TOL[dtype])
    stack_grads = dict(as_ours(theirs, template, grads=True).named_parameters())
    for name, parameter in ours.named_parameters():
        stacked = name.startswith(("encoder.", "decoder."))
        reference = stack_grads[name] if stacked else dict(twin.named_parameters())[name].grad
        torch.testing.assert_close(parameter.grad, reference, rtol=0, atol=TOL[dtype], msg=name)
