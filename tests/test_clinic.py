"""The bug clinic (chapter 11): the correct clinic model matches the package's model, and every
planted bug shows its symptom, is caught by its test, and disappears with the fix. Each test
would fail if a "bug" were accidentally correct."""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion import clinic
from companion.decode import greedy_decode as package_greedy_decode
from companion.positional import sinusoidal_table
from companion.utils import count_parameters

D, HEADS, LAYERS, D_FF, V = 32, 4, 2, 64, clinic.VOCAB_SIZE
LOWER = torch.tril(torch.ones(13, 13, dtype=torch.bool))


@pytest.fixture(scope="module")
def batch():
    return clinic.toy_batch(4, torch.Generator().manual_seed(0))  # (4, 13) each


@pytest.fixture(scope="module")
def healthy():
    return clinic.build()


@pytest.fixture(scope="module")
def overfit():
    """A correct model and the one-batch loss curve it reaches (the batch of overfit_one_batch)."""
    model = clinic.build()
    return model, clinic.overfit_one_batch(model)


def one_batch():
    return clinic.toy_batch(16, torch.Generator().manual_seed(0))


def greedy_share(model, decode, src, tgt_out, one_by_one=False):
    with torch.no_grad():
        if one_by_one:
            out = torch.cat(
                [decode(model, src[b : b + 1], tgt_out.shape[1]) for b in range(len(src))]
            )
        else:
            out = decode(model, src, tgt_out.shape[1])
    return (out == tgt_out).float().mean().item()


# --------------------------------------------------------------------------------------------
# the correct model and the toolkit
# --------------------------------------------------------------------------------------------


def test_toy_batch_is_the_reverse_task():
    src, tgt_in, tgt_out = clinic.toy_batch(8, torch.Generator().manual_seed(3))
    assert src.shape == tgt_in.shape == tgt_out.shape == (8, clinic.SEQ_LEN + 1)
    assert torch.equal(tgt_out[:, :-1], src[:, :-1].flip(1))
    assert (src[:, -1] == clinic.EOS_ID).all() and (tgt_in[:, 0] == clinic.BOS_ID).all()
    assert ((src[:, :-1] >= 4) & (src[:, :-1] < V)).all()


def test_healthy_model_matches_the_package(healthy, batch):
    src, tgt_in, _ = batch
    assert clinic.parity(healthy, src, tgt_in) < 1e-5
    assert count_parameters(healthy) == count_parameters(clinic.reference_model(healthy))
    mha, ffn, norm = 4 * D * D + 4 * D, 2 * D * D_FF + D_FF + D, 2 * D
    expected = 2 * V * D + LAYERS * (mha + ffn + 2 * norm) + LAYERS * (2 * mha + ffn + 3 * norm)
    assert count_parameters(healthy) == expected + V * D + V


def test_healthy_model_passes_every_test(healthy, batch, overfit):
    src, tgt_in, tgt_out = batch
    assert torch.equal(clinic.causal_leak(healthy, src[:1], tgt_in[:1]), LOWER)
    attention = healthy.encoder.layers[0].self_attention
    x = torch.randn(2, 7, D)
    assert clinic.is_permutation_equivariant(lambda t: attention(t, t, t), x)
    probe = clinic.build()
    clinic.sequence_loss(probe(src, tgt_in), tgt_out).backward()
    assert all(p.grad is not None and p.grad.any() for p in probe.parameters())
    assert overfit[1][-1] < 0.05


def test_healthy_decoding_matches_the_package(overfit):
    model, _ = overfit
    src, _, tgt_out = one_batch()
    assert greedy_share(model, clinic.greedy_decode, src, tgt_out) > 0.95
    with torch.no_grad():
        ours = clinic.greedy_decode(model, src, 13)
        theirs = package_greedy_decode(
            clinic.reference_model(model), src, max_len=13, use_cache=False
        )
    assert torch.equal(ours[:, : theirs.shape[1]], theirs)


def test_toolkit_detects_what_it_claims():
    assert not clinic.is_permutation_equivariant(lambda t: t.cumsum(1), torch.randn(1, 6, 4))
    leaky = clinic.build(6)
    src, tgt_in, _ = clinic.toy_batch(1, torch.Generator().manual_seed(1))
    assert clinic.causal_leak(leaky, src, tgt_in).triu(1).any()


def test_traced_training_takes_the_same_steps():
    """A StepTrace callback records, it does not steer: the same losses and the same weights as
    the untraced run, one gradient and one update norm per step, a checkpoint every `every`."""
    plain_model, traced_model = clinic.build(6), clinic.build(6)
    trace = clinic.StepTrace(traced_model, every=2, measure=clinic.teacher_forced_accuracy)
    plain = clinic.train_toy(plain_model, 5)
    traced = clinic.train_toy(traced_model, 5, callback=trace)
    assert traced == plain
    for a, b in zip(plain_model.parameters(), traced_model.parameters()):
        assert torch.equal(a, b)
    assert len(trace.grad) == len(trace.update) == 5 and list(trace.checkpoints) == [2, 4]
    assert all(g > 0 for g in trace.grad) and all(u > 0 for u in trace.update)
    assert all(0 <= a <= 1 for a in trace.checkpoints.values())
    assert not traced_model.training  # train_toy ends in evaluation mode
    with pytest.raises(TypeError):
        clinic.train_toy(clinic.build(), 1, callback="trace")


def test_first_mismatch_names_where_parity_fails(batch):
    src, tgt_in, _ = batch
    healthy = clinic.build()
    assert clinic.first_mismatch(healthy, clinic.reference_model(healthy), src, tgt_in) is None
    broken = clinic.build(4)  # the head split without a transpose
    start = clinic.first_mismatch(broken, clinic.reference_model(broken), src, tgt_in)
    assert start == "encoder.layers.0.self_attention"


class _DetachedInputPositions(clinic.PositionalEncoding):
    """Positions added to a detached input: the same values, no gradient for the embeddings."""

    def forward(self, x):
        return super().forward(x.detach())


def test_gradient_parity_sees_what_forward_parity_cannot(batch):
    src, tgt_in, tgt_out = batch
    healthy = clinic.build()
    gap, _ = clinic.gradient_parity(healthy, src, tgt_in, tgt_out)
    assert gap < 1e-5, f"expected matching gradients on the healthy model, got {gap:.1e}"
    assert all(p.grad is None for p in healthy.parameters()), "expected the gradients cleared after"
    torch.manual_seed(0)
    detached = clinic.Transformer(parts=clinic.Parts(positions=_DetachedInputPositions))
    shared = clinic.build(10)  # one attention module for self- and cross-attention
    for suspect in (detached, shared):
        assert clinic.parity(suspect, src, tgt_in) < 1e-5  # forward parity passes
    gap, where = clinic.gradient_parity(detached, src, tgt_in, tgt_out)
    assert gap > 1e-2 and where.endswith("embedding.embedding.weight"), (gap, where)
    gap, where = clinic.gradient_parity(shared, src, tgt_in, tgt_out)
    assert gap > 1e-2 and ".self_attention." in where, (gap, where)


def test_as_logits_fn_restores_the_training_mode(batch):
    src, tgt_in, _ = batch
    model = clinic.build().train()
    clinic.as_logits_fn(model)(src, tgt_in)
    assert model.training
    clinic.as_logits_fn(model.eval())(src, tgt_in)
    assert not model.training


def test_registry_lists_the_eighteen_bugs():
    bugs = list(clinic.BUGS.values())
    assert [b.number for b in bugs] == list(range(1, 19))
    assert [b.ward for b in bugs] == [1] * 10 + [2] * 8
    assert all(b.buggy is not b.fixed and b.symptom and b.caught_by for b in bugs)


def test_registry_numbers_match_the_docstrings_and_the_chapter():
    """Each bug's docstring opens with its registry number (a variant letter allowed), as the
    chapter numbers it: bug 11 is the padding_idx encoder of section 11.5, 12-18 the appendix."""
    for bug in clinic.BUGS.values():
        opening = (inspect.getdoc(bug.buggy) or "").split(":")[0]
        assert re.fullmatch(rf"Bug {bug.number}[a-c]?", opening), (bug.number, opening)
    by_number = {b.number: b.buggy for b in clinic.BUGS.values()}
    assert by_number[11] is clinic.PaddingIdxEncoder
    assert by_number[12] is clinic.discarded_mask_attention


def test_build_rejects_unknown_bugs():
    with pytest.raises(ValueError, match="bug must be None, a ward-1 bug number"):
        clinic.build(11)
    with pytest.raises(ValueError, match="bug must be None, a ward-1 bug number"):
        clinic.build(True)
    with pytest.raises(ValueError, match="a name of BUG_NAMES"):
        clinic.build("last-token loop")  # bug 9 is in the decoding loop: no model


def test_build_by_name_is_build_by_number():
    """The chapter's names plant the same bug as the numbers, with the same weights."""
    assert sorted(clinic.BUG_NAMES.values()) == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    for name, number in clinic.BUG_NAMES.items():
        by_name, by_number = clinic.build(name), clinic.build(number)
        assert type(by_name) is type(by_number), name
        assert [type(m) for m in by_name.modules()] == [type(m) for m in by_number.modules()], name
        for (key, a), (_, b) in zip(by_name.state_dict().items(), by_number.state_dict().items()):
            assert torch.equal(a, b), (name, key)
    with pytest.raises(ValueError, match="d_model must be a multiple"):
        clinic.Transformer(d_model=30, num_heads=4)


# --------------------------------------------------------------------------------------------
# ward 1
# --------------------------------------------------------------------------------------------


def test_bug_1_swapped_decoder_call_leaks(healthy, batch):
    src, tgt_in, _ = batch
    buggy = clinic.build(1)
    leak = clinic.causal_leak(buggy, src[:1], tgt_in[:1])
    assert leak[~LOWER].all()  # every output sees every later token
    assert clinic.parity(buggy, src, tgt_in) > 0.1
    with pytest.raises(RuntimeError):
        buggy(src[:, 5:], tgt_in)
    assert healthy(src[:, 5:], tgt_in).shape == (4, 13, V)  # the fix


def test_bug_2_value_residual(healthy, batch):
    src, tgt_in, _ = batch
    buggy = clinic.build(2)
    assert clinic.parity(buggy, src, tgt_in) > 0.1
    with pytest.raises(RuntimeError):
        buggy(src[:, 5:], tgt_in)


def test_bug_3_shared_head_projection(healthy, batch):
    buggy = clinic.build(3)
    d_k = D // HEADS
    lost = 3 * LAYERS * (3 * (D * D + D) - 3 * (d_k * d_k + d_k))
    assert count_parameters(healthy) - count_parameters(buggy) == lost
    with pytest.raises(RuntimeError, match="size mismatch"):
        clinic.reference_model(buggy)


def test_bug_4_view_without_transpose(healthy, batch):
    src, tgt_in, _ = batch
    good = healthy.encoder.layers[0].self_attention
    bad = clinic.ViewWithoutTranspose(D, HEADS)
    bad.load_state_dict(good.state_dict())
    x = torch.randn(2, 7, D)
    assert bad(x, x, x).shape == good(x, x, x).shape
    assert not clinic.is_permutation_equivariant(lambda t: bad(t, t, t), x)
    assert clinic.parity(clinic.build(4), src, tgt_in) > 0.1


def test_bug_5_double_softmax_stalls(overfit, batch):
    src, tgt_in, _ = batch
    buggy = clinic.build(5)
    with torch.no_grad():
        rows = buggy(src, tgt_in).sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows))
    floor = math.log(1 + (V - 1) / math.e)
    one_hot_probs = F.one_hot(torch.tensor([4]), V).float()
    assert F.cross_entropy(one_hot_probs, torch.tensor([4])).item() == pytest.approx(
        floor, rel=1e-5
    )
    stalled = clinic.overfit_one_batch(buggy)
    assert stalled[-1] > floor and overfit[1][-1] < 0.05


def test_bug_6_mask_bugs(healthy, batch):
    src, tgt_in, _ = batch
    torch.manual_seed(0)
    truthy = clinic.Transformer(parts=clinic.Parts(attention=clinic.TruthinessMask))
    with pytest.raises(RuntimeError, match="ambiguous"):
        truthy(src, tgt_in)
    torch.manual_seed(0)
    with torch.no_grad():
        assert torch.isnan(clinic.InvertedCausalMask()(src, tgt_in)).any()
    torch.manual_seed(0)
    gap = clinic.parity(clinic.InvertedCausalMask(), src, tgt_in)
    assert gap == float("inf")  # NaN in the logits: inf, so `gap < tol` fails
    leak = clinic.causal_leak(clinic.build(6), src[:1], tgt_in[:1])
    assert leak.diagonal(1).all() and leak.diagonal(2).all()  # one step per layer
    assert not leak.triu(3).any()
    assert not clinic.causal_leak(healthy, src[:1], tgt_in[:1]).triu(1).any()


def test_bug_6_off_by_one_learns_the_wrong_thing(overfit):
    src, tgt_in, tgt_out = one_batch()
    leaky = clinic.build(6)
    losses = clinic.overfit_one_batch(leaky)
    assert losses[-1] < 0.05  # teacher forcing: the answer is in the input
    assert greedy_share(leaky, clinic.greedy_decode, src, tgt_out) < 0.5
    assert greedy_share(overfit[0], clinic.greedy_decode, src, tgt_out) > 0.95


def test_bug_7_scale(batch):
    src, tgt_in, _ = batch
    q, k, v = (torch.randn(1, HEADS, 13, D // HEADS) * 2 for _ in range(3))
    good = clinic.MultiHeadAttention(D, HEADS).attend(q, k, v)[1]
    after = clinic.ScaleAfterSoftmax(D, HEADS).attend(q, k, v)[1]
    by_dk = clinic.ScaleByDk(D, HEADS).attend(q, k, v)[1]
    assert torch.allclose(good.sum(-1), torch.ones(1, HEADS, 13))
    assert torch.allclose(after.sum(-1), torch.full((1, HEADS, 13), (D // HEADS) ** -0.5))
    assert by_dk.amax(-1).mean() < good.amax(-1).mean()
    assert clinic.parity(clinic.build(7), src, tgt_in) > 0.1
    torch.manual_seed(0)
    scaled_by_dk = clinic.Transformer(parts=clinic.Parts(attention=clinic.ScaleByDk))
    assert clinic.parity(scaled_by_dk, src, tgt_in) > 1e-3


def test_bug_8_positional_table(batch):
    src, tgt_in, _ = batch
    right = sinusoidal_table(64, D)
    assert torch.allclose(clinic.PositionalEncoding.build_table(64, D), right, atol=1e-6)
    wrong = clinic.DoubledExponentPositions.build_table(64, D)
    assert (wrong - right).abs().max() > 1
    assert clinic.parity(clinic.build(8), src, tgt_in) > 0.1
    x = torch.randn(2, 13, D)
    assert torch.equal(clinic.DoubledExponentPositions(D)(x), clinic.SlicedPositions(D)(x))


def test_bug_9_last_token_loop(overfit):
    model, _ = overfit
    src, _, tgt_out = one_batch()
    right = greedy_share(model, clinic.greedy_decode, src, tgt_out)
    wrong = greedy_share(model, clinic.last_token_greedy_decode, src, tgt_out, one_by_one=True)
    assert right > 0.95 and wrong < 0.5
    with pytest.raises(RuntimeError):
        clinic.last_token_greedy_decode(model, src[:2], 13)
    assert clinic.last_token_greedy_decode(model, src[:1], 5).shape == (1, 13)
    assert clinic.greedy_decode(model, src[:2], 5).shape == (2, 5)  # the fix


def test_bug_10_shared_attention(healthy, batch):
    src, tgt_in, _ = batch
    buggy = clinic.build(10)
    assert clinic.parity(buggy, src, tgt_in) < 1e-5  # parity cannot see it
    assert count_parameters(healthy) - count_parameters(buggy) == LAYERS * (4 * D * D + 4 * D)


# --------------------------------------------------------------------------------------------
# ward 2
# --------------------------------------------------------------------------------------------


def attention_dependence(attend, n=6):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, n, 8, generator=g) for _ in range(3))
    base = attend(q, k, v)
    seen = torch.zeros(n, n, dtype=torch.bool)
    for j in range(n):
        k2, v2 = k.clone(), v.clone()
        k2[0, j] += 1
        v2[0, j] += 1
        out = attend(q, k2, v2)
        seen[:, j] = ((out - base).abs().amax(-1)[0] > 1e-6) | out.isnan().any(-1)[0]
    return seen


def test_bug_11_discarded_mask():
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    assert attention_dependence(clinic.discarded_mask_attention).all()
    assert torch.equal(attention_dependence(clinic.past_blocking_attention)[:-1], ~causal[:-1])
    assert torch.isnan(
        clinic.past_blocking_attention(*(torch.randn(1, 6, 8) for _ in range(3)))[0, -1]
    ).all()
    assert torch.equal(attention_dependence(clinic.causal_attention), causal)


def test_bug_12_no_softmax():
    q, k = torch.randn(1, 6, 8), torch.randn(1, 6, 8)
    constant = torch.full((1, 6, 8), 3.0)
    assert not torch.allclose(clinic.no_softmax_attention(q, k, constant), constant)
    assert torch.allclose(clinic.causal_attention(q, k, constant), constant)


def test_bug_13_layer_norm_in_forward():
    torch.manual_seed(0)
    inline, registered = clinic.InlineNormBlock(D), clinic.RegisteredNormBlock(D)
    registered.linear.load_state_dict(inline.linear.state_dict())
    assert set(inline.state_dict()) == {"linear.weight", "linear.bias"}
    assert {"norm.weight", "norm.bias"} <= set(registered.state_dict())
    assert count_parameters(registered) - count_parameters(inline) == 2 * D
    x = torch.randn(1, 6, D)
    x2 = x.clone()
    x2[0, 0] += 1
    with torch.no_grad():
        assert not torch.allclose(inline(x)[0, 5], inline(x2)[0, 5])
        assert torch.allclose(registered(x)[0, 5], registered(x2)[0, 5])


@pytest.mark.parametrize(
    "cls,learns", [(clinic.DetachedPositions, False), (clinic.LearnedPositions, True)]
)
def test_bug_14_detached_positions(cls, learns):
    torch.manual_seed(0)
    positions = cls(16, 8)
    before = positions.pos_embedding.detach().clone()
    optimizer = torch.optim.SGD(positions.parameters(), lr=0.1)
    positions(torch.randn(2, 10, 8, requires_grad=True)).pow(2).sum().backward()
    optimizer.step()
    moved = (positions.pos_embedding.detach() - before).abs().max().item()
    assert (positions.pos_embedding.grad is not None) == learns
    assert (moved > 0) == learns


def test_bug_15_padding_idx_is_no_mask():
    sentence = torch.tensor([[5, 9, 4, 7, 6]])
    padded = torch.cat([sentence, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    as_unk = padded.masked_fill(padded == clinic.PAD_ID, clinic.UNK_ID)
    torch.manual_seed(0)
    unmasked = clinic.PaddingIdxEncoder(V, 16, 2)
    masked = clinic.MaskedPaddingEncoder(V, 16, 2)
    masked.load_state_dict(unmasked.state_dict())

    def change(encoder, ids):
        with torch.no_grad():
            return (encoder(ids)[:, :5] - encoder(sentence)).abs().max().item()

    assert change(unmasked, padded) > 1e-3
    assert change(masked, as_unk) > 1e-3
    assert change(masked, padded) < 1e-6


def test_bug_16_wiring(healthy, batch):
    src, tgt_in, _ = batch
    with torch.no_grad():
        reference = healthy(src, tgt_in)
        assert torch.allclose(clinic.stacked(healthy, src, tgt_in), reference, atol=1e-6)
        assert (clinic.interleaved_stacks(healthy, src, tgt_in) - reference).abs().max() > 0.1
    torch.manual_seed(0)
    swapped = clinic.Transformer(parts=clinic.Parts(decoder_layer=clinic.CrossInputsSwapped))
    assert clinic.parity(swapped, src, tgt_in) > 0.1
    with pytest.raises(RuntimeError):
        swapped(src[:, 5:], tgt_in)
    padded = src.clone()
    padded[:, -4:] = clinic.PAD_ID
    real = (padded != clinic.PAD_ID)[:, None, None, :]
    right = clinic.cross_padding_mask(tgt_in, padded)
    assert torch.equal(right, real.expand_as(right))
    assert (clinic.cross_padding_mask(padded, tgt_in) & ~real).any()
    with pytest.raises(RuntimeError):
        clinic.cross_padding_mask(padded[:, :9], tgt_in) & real[..., :9]


def test_bug_17_dropout_after_norm():
    sub = nn.Linear(D, D)
    nn.init.zeros_(sub.weight)
    nn.init.zeros_(sub.bias)
    x = torch.randn(4, 13, D)
    torch.manual_seed(0)
    after = clinic.DropoutAfterNorm(sub, D, 0.1).train()
    before = clinic.DropoutBeforeAdd(sub, D, 0.1).train()
    expected = F.layer_norm(x, (D,))
    assert 0.05 < (after(x) == 0).float().mean().item() < 0.15
    assert torch.allclose(before(x), expected, atol=1e-6)
    after.eval()
    assert torch.allclose(after(x), expected, atol=1e-6)  # eval mode hides it


def test_bug_18_one_based_vocabulary():
    ids = torch.arange(1, 11)[None, :]
    one_based = clinic.OneBasedEmbedding(10, 4)
    with pytest.raises(IndexError):
        one_based(ids)
    one_based(ids[:, :-1]).sum().backward()
    assert not one_based.embedding.weight.grad[0].any()
    zero_based = clinic.ZeroBasedEmbedding(10, 4)
    zero_based(ids).sum().backward()
    assert zero_based.embedding.weight.grad.abs().sum(-1).gt(0).all()


def test_nan_positions_shows_where_the_inverted_mask_starts_nan(batch):
    """tril == 0 leaves decoder layer 1's last query no key: NaN there only, then everywhere."""
    src, tgt_in, _ = batch
    torch.manual_seed(0)
    inverted = clinic.InvertedCausalMask()
    nan_at = clinic.nan_positions(inverted, src, tgt_in)
    assert list(nan_at) == ["decoder layer 1", "decoder layer 2", "logits"]
    assert nan_at["decoder layer 1"] == [12]
    assert nan_at["decoder layer 2"] == nan_at["logits"] == list(range(13))
    assert clinic.nan_positions(clinic.build(), src, tgt_in) == dict.fromkeys(nan_at, [])
