"""Chapter 11 exercise checks: the fixed versions pass, the bugs of the clinic are rejected (heads
split without a transpose or transposed first, the scale after the softmax or by d_k, a
discarded masked_fill, a mask filled with 0, an inverted mask, no softmax or one over the queries,
the doubled positional exponent, a float64 table, the blog's greedy loop, its partial fixes, a
loop without the source mask or one that keeps <bos>, wrong names for the mystery
patients, and batch-independence tests that reverse the batch only, watch one row, the first
two rows or the last position, compare exactly or too loosely)."""

from __future__ import annotations

import math

import pytest
import torch

from companion import clinic
from companion.clinic import registry
from companion.exercises import ch11
from companion.positional import sinusoidal_table

# --------------------------------------------------------------------------------------------
# split_heads
# --------------------------------------------------------------------------------------------


def split_permute(x, num_heads):
    batch, seq, d_model = x.shape
    return x.reshape(batch, seq, num_heads, d_model // num_heads).permute(0, 2, 1, 3)


def split_view_only(x, num_heads):  # bug 4
    batch, seq, d_model = x.shape
    return x.view(batch, num_heads, seq, d_model // num_heads)


def split_transpose_wrong_axes(x, num_heads):  # features cut the other way round
    batch, seq, d_model = x.shape
    return x.view(batch, seq, d_model // num_heads, num_heads).permute(0, 3, 1, 2)


def split_contiguous_copy(x, num_heads):  # the same bug through reshape
    batch, seq, d_model = x.shape
    return x.reshape(batch, num_heads, seq, d_model // num_heads).contiguous()


def split_transpose_first(x, num_heads):  # the transpose before the view: tokens still mixed
    batch, seq, d_model = x.shape
    return x.transpose(1, 2).reshape(batch, num_heads, seq, d_model // num_heads)


def test_split_heads_accepts_correct():
    for fn in (ch11.reference_split_heads, split_permute):
        assert ch11.check_split_heads(fn, verbose=False), fn.__name__


@pytest.mark.parametrize(
    "wrong",
    [split_view_only, split_transpose_wrong_axes, split_contiguous_copy, split_transpose_first],
)
def test_split_heads_rejects_wrong(wrong):
    assert not ch11.check_split_heads(wrong, verbose=False)


def test_split_heads_report_says_whether_equivariance_survives(capsys):
    assert not ch11.check_split_heads(split_view_only)  # bug 4: tokens mixed
    assert "is not permutation-equivariant" in capsys.readouterr().out
    assert not ch11.check_split_heads(split_transpose_wrong_axes)  # one token per head, wrong cut
    assert "is still permutation-equivariant" in capsys.readouterr().out


def test_split_heads_reference_is_the_clinic_split():
    attention = clinic.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    assert torch.equal(attention.split_heads(x), ch11.reference_split_heads(x, 4))


# --------------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------------


def attention_parts(q, k, v, mask, *, scale="sqrt", keep_mask=True, softmax=True, after=False):
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1)
    if not after:
        scores = scores / (math.sqrt(d_k) if scale == "sqrt" else d_k)
    if mask is not None:
        if keep_mask:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1) if softmax else scores.masked_fill(scores.isinf(), 0)
    if after:
        weights = weights / math.sqrt(d_k)
    return weights @ v


def test_attention_accepts_correct():
    assert ch11.check_attention(ch11.reference_attention, verbose=False)
    assert ch11.check_attention(attention_parts, verbose=False)


def test_attention_refuses_the_fused_call(capsys):
    """One call to F.scaled_dot_product_attention scales and masks inside: it would pass without
    fixing either bug, so the check refuses it and says why."""

    def fused(q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    assert not ch11.check_attention(fused)
    assert "scaled_dot_product_attention" in capsys.readouterr().out


@pytest.mark.parametrize(
    "options",
    [
        {"after": True},  # bug 7a
        {"scale": "d_k"},  # bug 7b
        {"keep_mask": False},  # bug 12
        {"softmax": False},  # bug 13
        {"keep_mask": False, "after": True},  # the notebook's stub
    ],
    ids=["after-softmax", "by-d_k", "discarded-mask", "no-softmax", "stub"],
)
def test_attention_rejects_wrong(options):
    assert not ch11.check_attention(
        lambda q, k, v, mask: attention_parts(q, k, v, mask, **options), verbose=False
    )


def test_attention_rejects_a_mask_filled_with_zero():
    def zero_filled(q, k, v, mask):  # masked scores set to 0, not -inf: the keys keep weight
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, 0.0)
        return torch.softmax(scores, dim=-1) @ v

    assert not ch11.check_attention(zero_filled, verbose=False)


def test_attention_rejects_the_softmax_over_the_queries():
    def over_queries(q, k, v, mask):  # dim=-2: each key's weights sum to 1, not each query's
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-2).nan_to_num() @ v

    assert not ch11.check_attention(over_queries, verbose=False)


def test_attention_rejects_inverted_mask():
    def inverted(q, k, v, mask):  # bug 6b: the blocked keys passed as the allowed ones
        return ch11.reference_attention(q, k, v, None if mask is None else ~mask)

    assert not ch11.check_attention(inverted, verbose=False)


# --------------------------------------------------------------------------------------------
# positional table
# --------------------------------------------------------------------------------------------


def table_loop(max_len, d_model, *, double=False, next_cos=False):
    table = torch.zeros(max_len, d_model)
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            exponent = (2 * i if double else i) / d_model
            table[pos, i] = math.sin(pos / 10000**exponent)
            cos_exponent = (2 * (i + 1) if double else (i + 1 if next_cos else i)) / d_model
            table[pos, i + 1] = math.cos(pos / 10000**cos_exponent)
    return table


def test_positional_table_accepts_correct():
    assert ch11.check_positional_table(ch11.reference_positional_table, verbose=False)
    assert ch11.check_positional_table(table_loop, verbose=False)


@pytest.mark.parametrize(
    "borrowed",
    [
        lambda max_len, d_model: sinusoidal_table(max_len, d_model),  # companion.positional
        lambda max_len, d_model: clinic.PositionalEncoding.build_table(max_len, d_model),
        lambda max_len, d_model: ch11.reference_positional_table(max_len, d_model),
    ],
    ids=["package", "clinic", "reference"],
)
def test_positional_table_refuses_a_borrowed_table(borrowed, capsys):
    assert not ch11.check_positional_table(borrowed)
    assert "build the table yourself" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong",
    [
        clinic.DoubledExponentPositions.build_table,  # bug 8, both halves
        lambda max_len, d_model: table_loop(max_len, d_model, next_cos=True),  # half fixed
        lambda max_len, d_model: table_loop(max_len, d_model, double=True),
        lambda max_len, d_model: table_loop(max_len, d_model).flip(1),  # cos first
    ],
    ids=["bug-8", "cosine-next-index", "doubled", "cos-sin"],
)
def test_positional_table_rejects_wrong(wrong):
    assert not ch11.check_positional_table(wrong, verbose=False)


def test_positional_table_rejects_float64(capsys):
    def table_float64(max_len, d_model):  # the right values, the wrong dtype
        return table_loop(max_len, d_model).double()

    assert not ch11.check_positional_table(table_float64)
    assert "float64" in capsys.readouterr().out


def test_reference_table_is_the_package_table():
    assert torch.allclose(ch11.reference_positional_table(40, 16), sinusoidal_table(40, 16))


# --------------------------------------------------------------------------------------------
# greedy decoding
# --------------------------------------------------------------------------------------------


def greedy_batched_last_token(model, src, max_len):  # .item() and the length fixed, history not
    src_mask = model.make_src_mask(src)
    memory = model.encode(src, src_mask)
    token = torch.full((src.shape[0], 1), clinic.BOS_ID)
    out = []
    for _ in range(max_len):
        next_token = model.decode(token, memory, src_mask)[:, -1].argmax(dim=-1)
        out.append(next_token)
        token = next_token[:, None]
    return torch.stack(out, dim=1)


def greedy_by_hand(model, src, max_len):  # correct: the growing sequence, the whole batch
    src_mask = model.make_src_mask(src)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.shape[0], 1), clinic.BOS_ID)
    for _ in range(max_len):
        next_token = model.decode(ys, memory, src_mask)[:, -1].argmax(dim=-1)
        ys = torch.cat([ys, next_token[:, None]], dim=1)
    return ys[:, 1:]


def greedy_source_length(model, src, max_len):  # history and batch fixed, the length not
    return greedy_by_hand(model, src, src.shape[1])


def greedy_no_source_mask(model, src, max_len):  # right loop, but the pads are attended to
    memory = model.encode(src)
    ys = torch.full((src.shape[0], 1), clinic.BOS_ID)
    for _ in range(max_len):
        next_token = model.decode(ys, memory)[:, -1].argmax(dim=-1)
        ys = torch.cat([ys, next_token[:, None]], dim=1)
    return ys[:, 1:]


def greedy_one_by_one(model, src, max_len):  # correct, one sentence at a time
    return torch.cat([greedy_by_hand(model, src[b : b + 1], max_len) for b in range(len(src))])


def greedy_keeps_bos(model, src, max_len):  # the right tokens, <bos> prepended: one too many
    ys = greedy_by_hand(model, src, max_len)
    return torch.cat([torch.full((src.shape[0], 1), clinic.BOS_ID), ys], dim=1)


def test_greedy_accepts_correct():
    assert ch11.check_greedy_decode(ch11.reference_greedy_decode, verbose=False)
    assert ch11.check_greedy_decode(greedy_by_hand, verbose=False)
    assert ch11.check_greedy_decode(greedy_one_by_one, verbose=False)


def greedy_borrowed(model, src, max_len):  # the healthy loop of the clinic, called
    return clinic.greedy_decode(model, src, max_len)


def greedy_borrowed_reference(model, src, max_len):  # the check's own reference, called
    return ch11.reference_greedy_decode(model, src, max_len)


@pytest.mark.parametrize(
    "borrowed", [clinic.greedy_decode, greedy_borrowed, greedy_borrowed_reference]
)
def test_greedy_refuses_the_healthy_loop(borrowed, capsys):
    assert not ch11.check_greedy_decode(borrowed)
    out = capsys.readouterr().out
    assert "greedy_decode" in out and "write the decoding loop" in out, out


def test_refusing_calls_refuses_single_functions_and_keeps_the_module_form():
    from companion.exercises._checker import refusing_calls

    def uses_math(x):
        return math.sqrt(x)

    assert refusing_calls(uses_math, "take the root", ())(x=4.0) == 2.0  # nothing refused
    guarded = refusing_calls(greedy_borrowed, "decode", (), functions=(clinic.greedy_decode,))
    case = ch11._greedy_cases()[0]
    with pytest.raises(RuntimeError, match="greedy_decode"):
        guarded(**case)
    by_hand = refusing_calls(greedy_by_hand, "decode", (), functions=(clinic.greedy_decode,))
    assert by_hand(**case).shape == (case["src"].shape[0], case["max_len"])  # model calls pass
    with pytest.raises(RuntimeError, match="math.sqrt"):  # builtins are watched too (c_call)
        refusing_calls(uses_math, "take the root", (), functions=(math.sqrt,))(x=4.0)
    with pytest.raises(TypeError, match="functions must hold Python or builtin functions"):
        refusing_calls(greedy_by_hand, "decode", (), functions=(42,))(**case)


@pytest.mark.parametrize(
    "wrong",
    [
        clinic.last_token_greedy_decode,
        greedy_batched_last_token,
        greedy_source_length,
        greedy_no_source_mask,
        greedy_keeps_bos,
    ],
    ids=["bug-9", "last-token-batched", "source-length", "no-source-mask", "keeps-bos"],
)
def test_greedy_rejects_wrong(wrong):
    assert not ch11.check_greedy_decode(wrong, verbose=False)


def test_greedy_cases_have_padded_sources():
    padded = [case["src"] for case in ch11._greedy_cases() if (case["src"] == clinic.PAD_ID).any()]
    assert len(padded) >= 3


# --------------------------------------------------------------------------------------------
# mystery patients
# --------------------------------------------------------------------------------------------

NAMES = {seed: registry._condition_of(clinic.mystery(seed)) for seed in ch11.MYSTERY_SEEDS}
RIGHT = dict(NAMES)


def test_mystery_menu_is_every_condition_in_a_neutral_order():
    assert set(ch11.MYSTERY_MENU) == set(clinic.CONDITIONS)
    assert list(ch11.MYSTERY_MENU) == sorted(ch11.MYSTERY_MENU, key=str.casefold)


def test_mystery_accepts_the_names_in_any_case_and_spacing(capsys):
    assert NAMES == {
        0: "model.eval() forgotten",
        5: "padding mask on the query axis",
        7: "padding mask forgotten",
        9: "layers in a plain list",
    }
    assert ch11.check_mystery(RIGHT)
    assert "✅" in capsys.readouterr().out
    shouted = {seed: "  " + name.upper().replace(" ", "   ") + " " for seed, name in NAMES.items()}
    assert ch11.check_mystery(shouted, verbose=False)


def test_mystery_seeds_hold_different_bugs_that_fail_the_same_first_test():
    assert len(set(NAMES.values())) == len(NAMES)
    first_failures = {
        seed: next(f.test for f in clinic.examine(clinic.mystery(seed)) if not f) for seed in (0, 9)
    }
    assert first_failures[0] == first_failures[9]  # the exercise's trap
    assert NAMES[0] != NAMES[9]


def test_mystery_rejects_the_first_failure_taken_for_the_bug(capsys):
    swapped = {**RIGHT, 9: RIGHT[0]}  # the list bug named after its first failing test
    assert not ch11.check_mystery(swapped)
    out = capsys.readouterr().out
    assert "patient 9" in out and "not 'model.eval() forgotten'" in out


def row(patient):
    return [finding.passed for finding in clinic.examine(patient)]


def test_two_mystery_patients_share_a_row_of_the_table():
    """Patients 5 and 7 fail the same diagnostics (padding invariance alone), and so do the
    two padding-mask conditions admitted by name: the chapter's table cannot tell them apart."""
    assert row(clinic.mystery(5)) == row(clinic.mystery(7))
    assert [
        name for name in clinic.CONDITIONS if row(clinic.admit(name)) == row(clinic.mystery(7))
    ] == [
        "padding mask on the query axis",
        "padding mask forgotten",
    ]
    src = torch.tensor([[5, 6, 7, clinic.PAD_ID]])
    assert clinic.mystery(7).model.encoder_mask(src) is None  # the second look tells them apart
    assert clinic.mystery(5).model.encoder_mask(src).shape == (1, 1, 4, 1)


def test_mystery_rejects_the_first_row_of_the_table_that_matches(capsys):
    """Naming patient 7 from the table alone (the first condition whose row matches) fails,
    with the hint to look at the mask; so does the other way round."""
    assert not ch11.check_mystery({**RIGHT, 7: "padding mask on the query axis"})
    out = capsys.readouterr().out
    assert "patient 7" in out and "encoder_mask" in out
    assert not ch11.check_mystery({**RIGHT, 5: "padding mask forgotten"})
    assert "patient 5" in capsys.readouterr().out


def test_mystery_hint_does_not_answer_by_elimination(capsys):
    """A padding-mask name given for a patient with another bug gets the same hint as one given
    for the other padding-mask patient: the hint names the diagnostic, not the answer."""
    hints = []
    for seed, answer in (
        (7, "padding mask on the query axis"),
        (0, "padding mask on the query axis"),
    ):
        assert not ch11.check_mystery({**RIGHT, seed: answer})
        hints.append(capsys.readouterr().out.split(f"patient {seed}: ")[1])
    assert hints[0] == hints[1] and "encoder_mask" in hints[0]
    assert "padding mask forgotten" not in hints[0]


@pytest.mark.parametrize(
    "seed,answer",
    [
        (9, "model.eval() forgotten"),  # eval for the list: the trap
        (0, "layers in a plain list"),  # the list for eval
        (5, "padding counted in the loss"),  # another padding bug
        (5, "batch_first confusion"),
        (5, "softmax over the wrong dimension"),
        (9, ("model.eval() forgotten", "layers in a plain list")),  # a hedge
        (9, ["layers in a plain list", "model.eval() forgotten"]),  # a hedge, the right one first
        (9, ("layers in a plain list",)),  # the right name, but in a tuple
        (0, 3),
    ],
    ids=[
        "eval-for-list",
        "list-for-eval",
        "loss-padding",
        "batch-first",
        "softmax",
        "hedge-tuple",
        "hedge-list",
        "tuple-of-one",
        "int",
    ],  # fmt: skip
)
def test_mystery_rejects_wrong_names_and_hedges(seed, answer, capsys):
    assert not ch11.check_mystery({**RIGHT, seed: answer}), answer
    out = capsys.readouterr().out
    assert f"patient {seed}" in out
    if isinstance(answer, (tuple, list)) and len(answer) > 1:
        assert "name one condition" in out
    if isinstance(answer, tuple) and len(answer) == 1:
        assert "as a str" in out and "name one condition" not in out


@pytest.mark.parametrize(
    "seed,answer",
    [
        (5, "padding mask on the key axis"),  # the fix stated as the bug
        (5, "query mask missing"),
        (5, "do not mask the keys"),
        (9, "use a plain list instead of nn.ModuleList"),  # the bug stated as the fix
        (9, "the layers are a list"),  # a description, not a name of the menu
        (0, "remove model.eval()"),
        (0, "dropout"),  # a symptom
        (0, "healthy"),
    ],
)
def test_mystery_rejects_free_text_with_the_menu(seed, answer, capsys):
    assert not ch11.check_mystery({**RIGHT, seed: answer}), answer
    out = capsys.readouterr().out
    assert "not on the menu" in out
    assert all(name in out for name in ch11.MYSTERY_MENU)


def test_mystery_rejects_a_missing_seed(capsys):
    answers = dict(RIGHT)
    del answers[ch11.MYSTERY_SEEDS[-1]]
    assert not ch11.check_mystery(answers)
    assert "no answer" in capsys.readouterr().out


def test_mystery_rejects_string_keys_with_a_type_hint(capsys):
    answers = {str(seed): name for seed, name in RIGHT.items()}  # {"0": ...}: the right names
    assert not ch11.check_mystery(answers)
    out = capsys.readouterr().out
    assert "keys must be the seeds as int" in out and "'0' (str)" in out
    assert "not attempted" not in out


def test_mystery_stub_and_bad_input(capsys):
    assert not ch11.check_mystery({seed: "" for seed in ch11.MYSTERY_SEEDS})
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(TypeError, match="answers must be a dict"):
        ch11.check_mystery("model.eval() forgotten")


# --------------------------------------------------------------------------------------------
# the module
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "check,reference",
    [
        (ch11.check_split_heads, ch11.reference_split_heads),
        (ch11.check_attention, ch11.reference_attention),
        (ch11.check_positional_table, ch11.reference_positional_table),
        (ch11.check_greedy_decode, ch11.reference_greedy_decode),
    ],
)
def test_reference_passes_its_own_check(check, reference, capsys):
    assert check(reference)
    assert "✅" in capsys.readouterr().out


def test_stubs_are_reported_not_raised(capsys):
    def stub(**kwargs):
        raise NotImplementedError

    for check in (ch11.check_split_heads, ch11.check_attention,
                  ch11.check_positional_table, ch11.check_greedy_decode):  # fmt: skip
        assert not check(stub)
    assert capsys.readouterr().out.count("not attempted yet") == 4


def test_only_the_checks_are_exported():
    assert all(name.startswith("check_") for name in ch11.__all__)
    assert len(ch11.__all__) == 6


# --------------------------------------------------------------------------------------------
# batch_independent (exercise 6): each classic shortcut misses one of the cases
# --------------------------------------------------------------------------------------------


def batch_every_row_alone(logits_fn, ids):  # a correct answer written differently
    batched = logits_fn(ids)
    alone = torch.cat([logits_fn(ids[b : b + 1]) for b in range(ids.shape[0])])
    return bool(torch.allclose(batched, alone, atol=1e-4, rtol=0))


def batch_reversed_only(logits_fn, ids):  # blind to a mix that is symmetric in the rows
    return bool(torch.allclose(logits_fn(ids.flip(0)).flip(0), logits_fn(ids), atol=1e-4, rtol=0))


def batch_first_row_alone(logits_fn, ids):  # the first sentence only
    return bool(torch.allclose(logits_fn(ids[:1])[0], logits_fn(ids)[0], atol=1e-4, rtol=0))


def batch_others_replaced(logits_fn, ids):  # each row watched while the others are redrawn
    batched = logits_fn(ids)
    for b in range(ids.shape[0]):
        changed = (ids + 1) % 12
        changed[b] = ids[b]  # every sentence but b redrawn: blind to a code of the row index
        if not torch.allclose(logits_fn(changed)[b], batched[b], atol=1e-4, rtol=0):
            return False
    return True


def batch_exact(logits_fn, ids):  # torch.equal: float rounding taken for a leak
    batched = logits_fn(ids)
    return all(torch.equal(logits_fn(ids[b : b + 1])[0], batched[b]) for b in range(ids.shape[0]))


def batch_loose(logits_fn, ids):  # a tolerance of 0.1 misses a small leak
    batched = logits_fn(ids)
    return all(
        torch.allclose(logits_fn(ids[b : b + 1])[0], batched[b], atol=0.1, rtol=0)
        for b in range(ids.shape[0])
    )


def batch_last_alone(logits_fn, ids):  # the last sentence only
    return bool(torch.allclose(logits_fn(ids[-1:])[0], logits_fn(ids)[-1], atol=1e-4, rtol=0))


def batch_first_two_alone(logits_fn, ids):  # the first two sentences only
    batched = logits_fn(ids)
    return all(
        torch.allclose(logits_fn(ids[b : b + 1])[0], batched[b], atol=1e-4, rtol=0)
        for b in range(min(2, ids.shape[0]))
    )


def batch_first_alone_and_reversed(logits_fn, ids):  # blind to rows that read each other
    batched = logits_fn(ids)
    return batch_first_row_alone(logits_fn, ids) and bool(
        torch.allclose(logits_fn(ids.flip(0)).flip(0), batched, atol=1e-4, rtol=0)
    )


def batch_last_position(logits_fn, ids):  # every sentence alone, the last position only
    batched = logits_fn(ids)
    return all(
        torch.allclose(logits_fn(ids[b : b + 1])[0, -1], batched[b, -1], atol=1e-4, rtol=0)
        for b in range(ids.shape[0])
    )


def batch_all_but_last(logits_fn, ids):  # range(batch - 1): the last sentence never alone
    batched = logits_fn(ids)
    return all(
        torch.allclose(logits_fn(ids[b : b + 1])[0], batched[b], atol=1e-4, rtol=0)
        for b in range(ids.shape[0] - 1)
    )


def batch_mean_difference(logits_fn, ids):  # the mean |difference|: one moved logit averages away
    batched = logits_fn(ids)
    return all(
        (logits_fn(ids[b : b + 1])[0] - batched[b]).abs().mean() <= 1e-4
        for b in range(ids.shape[0])
    )


def batch_fixed_permutation_and_first_alone(logits_fn, ids):  # randperm(seed 0) + row 0 alone
    order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(0))
    batched = logits_fn(ids)
    return bool(
        torch.allclose(logits_fn(ids[order]), batched[order], atol=1e-4, rtol=0)
    ) and batch_first_row_alone(logits_fn, ids)


def batch_rolled_and_last_alone(logits_fn, ids):  # the batch rolled by one + the last row alone
    batched = logits_fn(ids)
    rolled = logits_fn(ids.roll(1, 0)).roll(-1, 0)
    return bool(torch.allclose(rolled, batched, atol=1e-4, rtol=0)) and batch_last_alone(
        logits_fn, ids
    )


def batch_rolled_and_first_alone(logits_fn, ids):  # the batch rolled by one + row 0 alone
    batched = logits_fn(ids)
    rolled = logits_fn(ids.roll(1, 0)).roll(-1, 0)
    return bool(torch.allclose(rolled, batched, atol=1e-4, rtol=0)) and batch_first_row_alone(
        logits_fn, ids
    )


def batch_halves(logits_fn, ids):  # two halves of the batch against the whole
    half = ids.shape[0] // 2
    halves = torch.cat([logits_fn(ids[:half]), logits_fn(ids[half:])])
    return bool(torch.allclose(halves, logits_fn(ids), atol=1e-4, rtol=0))


def batch_all_but_first(logits_fn, ids):  # range(1, batch): the first sentence never alone
    batched = logits_fn(ids)
    return all(
        torch.allclose(logits_fn(ids[b : b + 1])[0], batched[b], atol=1e-4, rtol=0)
        for b in range(1, ids.shape[0])
    )


def batch_copies_of_itself(logits_fn, ids):  # each sentence in a batch of its copies
    batched = logits_fn(ids)
    return all(
        torch.allclose(logits_fn(ids[b : b + 1].expand_as(ids))[0], batched[b], atol=1e-4, rtol=0)
        for b in range(ids.shape[0])
    )


#: each incomplete test, and the mixing of the case made to defeat it
INCOMPLETE = {
    "fixed permutation and first alone": (
        batch_fixed_permutation_and_first_alone,
        "row 1 reads row 0",
    ),
    "rolled and first alone": (batch_rolled_and_first_alone, "padded rows read the batch mean"),
    "rolled and last alone": (batch_rolled_and_last_alone, "padded rows read the batch mean"),
    "two halves": (batch_halves, "neighbouring rows read each other"),
    "all but the first row": (batch_all_but_first, "row 0 reads row 2"),
    "all but the last row": (batch_all_but_last, "the last row reads row 0"),
    "mean difference": (batch_mean_difference, "one logit"),
    "last alone": (batch_last_alone, "row 0 reads row 1"),
    "first two alone": (batch_first_two_alone, "row 2 reads row 3"),
    "first alone and reversed": (batch_first_alone_and_reversed, "rows 1 and 3 read each other"),
    "last position": (batch_last_position, "batch mean at position 0"),
    "copies of itself": (batch_copies_of_itself, "batch size"),
}


@pytest.mark.parametrize("name", list(INCOMPLETE))
def test_batch_independent_rejects_incomplete_tests(name, capsys):
    incomplete, how = INCOMPLETE[name]
    assert not ch11.check_batch_independent(incomplete, verbose=False)
    (case,) = [case for case in ch11._batch_cases() if case["logits_fn"].how == how]
    assert not ch11.reference_batch_independent(**case)  # the case mixes the batch ...
    assert incomplete(**case)  # ... and this test, on its own, misses it


def test_batch_independent_accepts_correct(capsys):
    assert ch11.check_batch_independent(ch11.reference_batch_independent)
    assert ch11.check_batch_independent(batch_every_row_alone)


@pytest.mark.parametrize(
    "wrong",
    [
        batch_reversed_only,
        batch_first_row_alone,
        batch_others_replaced,
        batch_exact,
        batch_loose,
        lambda logits_fn, ids: True,
        lambda logits_fn, ids: False,
    ],
    ids=[
        "reversed only",
        "first row alone",
        "others replaced",
        "exact",
        "loose",
        "always",
        "never",
    ],
)
def test_batch_independent_rejects_wrong(wrong, capsys):
    assert not ch11.check_batch_independent(wrong, verbose=False)


def test_batch_cases_hold_each_kind_of_mixing():
    kinds = [case["logits_fn"].how for case in ch11._batch_cases()]
    assert {
        "healthy",
        "rounding",
        "batch mean",
        "reads the first row",
        "batch-axis positions",
    } <= set(kinds)
    others = {
        "batch mean at position 0",
        "one logit",
        "padded rows read the batch mean",
        "batch size",
    }
    assert set(ch11._BatchModel.READS) | others <= set(kinds)
    verdicts = [ch11.reference_batch_independent(**case) for case in ch11._batch_cases()]
    assert verdicts.count(True) == 3 and verdicts.count(False) == 15, verdicts
    assert "batch mean" not in repr(ch11._batch_cases()[1]["logits_fn"])  # the repr hides the kind


# --------------------------------------------------------------------------------------------
# the chapter's own toolkit: clinic.batch_independence answers exercise 6
# --------------------------------------------------------------------------------------------


def batch_with_the_toolkit(logits_fn, ids):  # the diagnostic of section 11.2, wrapped
    return bool(clinic.batch_independence(logits_fn, ids))


def test_the_batch_check_refuses_the_toolkit(capsys):
    assert not ch11.check_batch_independent(batch_with_the_toolkit)
    assert "clinic.toolkit (batch_independence)" in capsys.readouterr().out


@pytest.mark.parametrize("case", ch11._batch_cases(), ids=lambda case: case["logits_fn"].how)
def test_the_toolkit_agrees_with_the_reference_on_every_case(case):
    finding = clinic.batch_independence(**{"fn": case["logits_fn"], "inputs": case["ids"]})
    assert bool(finding) == ch11.reference_batch_independent(**case), finding


@pytest.mark.parametrize("how", sorted(ch11._BatchModel.READS))
def test_the_toolkit_catches_the_rows_that_read_others(how):
    (case,) = [case for case in ch11._batch_cases() if case["logits_fn"].how == how]
    finding = clinic.batch_independence(case["logits_fn"], case["ids"])
    assert not finding and finding.details["largest"] > 1e-4, finding


def test_split_heads_and_attention_refuse_the_clinics_correct_code():
    """Exercises 1 and 3 ask for the code by hand: delegating to the clinic's healthy model (or
    to companion.attention) is refused with a message; the references still pass."""
    from companion import clinic

    def borrowed_split(x, num_heads):
        return clinic.MultiHeadAttention(x.shape[-1], num_heads).split_heads(x)

    def borrowed_attention(q, k, v, mask):
        layer = clinic.MultiHeadAttention(q.shape[1] * q.shape[-1], q.shape[1])
        return layer.attend(q, k, v, mask)[0]

    for check, answer in (
        (ch11.check_split_heads, borrowed_split),
        (ch11.check_attention, borrowed_attention),
    ):
        result = check(answer, verbose=False)
        assert not result and "yourself" in result.message, result.message
    assert ch11.check_split_heads(ch11.reference_split_heads, verbose=False)
    assert ch11.check_attention(ch11.reference_attention, verbose=False)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (batch_exact, "rounding, not a leak"),
        (batch_others_replaced, "depends on the row index"),
        (batch_reversed_only, "reads the batch mean"),
        (batch_loose, "a loose tolerance misses"),
        (lambda logits_fn, ids: False, "is batch-independent"),
    ],
    ids=["exact", "others replaced", "reversed only", "loose", "never"],
)
def test_batch_independent_failure_names_what_the_model_does(wrong, hint):
    result = ch11.check_batch_independent(wrong, verbose=False)
    assert not result, result.message
    assert "hint: " in result.message and hint in result.message, result.message
