"""Exercises of chapter 11, "Bug clinic": fix a bug, name a bug, predict what a bug does.

Exercises 1 and 3 hand the reader a buggy piece of the clinic's Transformer
(:mod:`companion.clinic`); the reader writes the fixed one. Their ``check_*`` functions run it on
cases drawn from a seeded generator next to the reference solution kept in this module; the
report of a wrong split into heads says whether an attention module with it is still
permutation-equivariant (the chapter's test for bug 4). Exercise 6 is a diagnosis: four mystery patients of
:mod:`companion.clinic`, examined and named from a menu (:data:`MYSTERY_MENU`). Exercises 2 and
4 are predictions, checked against a measurement: how far a shifted causal mask leaks with
``N`` layers, and which findings of ``clinic.examine`` three new patients fail. The checks
call your function with keyword arguments, so keep the parameter names of the stub in the
notebook.

==============================================  ===================================
exercise                                        check
==============================================  ===================================
the heads split without a transpose (bug 4)     :func:`check_split_heads`
predict how far a shifted mask leaks            :func:`check_leak_reach`
predict which findings three patients fail      :func:`check_predictions`
the greedy loop (bug 9)                         :func:`check_greedy_decode`
four mystery patients: the bug's name         :func:`check_mystery`
a batch-independence test of your own          :func:`check_batch_independent`
==============================================  ===================================

The reference solutions (``reference_split_heads``, ...) are module-level functions too; they
are not exported.
"""

from __future__ import annotations

import functools
import numbers
import re
import sys
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

import companion.attention as _attention
import companion.decode as _decode
from companion import clinic
from companion.clinic import patient, registry, toolkit
from companion.exercises._checker import (
    Case,
    CheckResult,
    refusing_calls,
    report,
    run_check,
    seeded_generator,
)

__all__ = [
    "check_split_heads",
    "check_leak_reach",
    "check_predictions",
    "check_greedy_decode",
    "check_mystery",
    "check_batch_independent",
]


# --------------------------------------------------------------------------------------------
# The frame of the dict-answer checks (exercises 2, 4 and 6)
# --------------------------------------------------------------------------------------------


def _check_answers(
    name: str,
    answers: object,
    keys: tuple,
    shape: str,
    problem_of: Callable[[object, object], str | None],
    label_of: Callable[[object], str],
    done: str,
    verbose: bool,
    empty: Callable[[object], bool] = lambda answer: answer is None,
    keys_problem: Callable[[Mapping], str | None] = lambda answers: None,
) -> CheckResult:
    """The shared frame of the checks that take a dict of answers (exercises 2, 4 and 6):
    ``TypeError`` unless ``answers`` is a dict ``shape``; "not attempted" when every answer is
    ``empty``; else the first of ``keys`` whose ``problem_of(key, answer)`` is not None fails,
    reported as ``label_of(key)``. ``keys_problem(answers)``, when not None, fails at once."""
    if not isinstance(answers, Mapping):
        raise TypeError(f"answers must be a dict {shape}, got {type(answers).__name__}")
    total = len(keys)
    wrong_keys = keys_problem(answers)
    if wrong_keys is not None:
        result = CheckResult(name, False, 0, f"❌ {name}: {wrong_keys}")
    elif all(empty(answers.get(key)) for key in keys):
        result = CheckResult(name, False, 0, f"⏳ {name}: not attempted yet (no answer given).")
    else:
        result = CheckResult(name, True, total, f"✅ {name}: {done}")
        for count, key in enumerate(keys, start=1):
            problem = problem_of(key, answers.get(key))
            if problem is not None:
                result = CheckResult(name, False, count, f"❌ {name}: {label_of(key)}: {problem}")
                break
    if verbose:
        report(result)
    return result


# --------------------------------------------------------------------------------------------
# Exercise 1: split the heads (bug 4)
# --------------------------------------------------------------------------------------------


def reference_split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``x (batch, seq, d_model)`` → ``(batch, num_heads, seq, d_model / num_heads)``: head
    ``r`` holds features ``r·head_dim … (r+1)·head_dim − 1`` of every token."""
    batch, seq, d_model = x.shape
    x = x.view(batch, seq, num_heads, d_model // num_heads)  # (batch, seq, heads, head_dim)
    return x.transpose(1, 2)  # (batch, heads, seq, head_dim)


def _split_cases() -> list[Case]:
    g = seeded_generator(110)
    shapes = [(2, 5, 8, 2), (1, 4, 16, 4), (3, 4, 8, 4), (2, 2, 12, 2), (1, 6, 6, 3), (2, 1, 8, 4)]
    return [
        {"x": torch.randn(b, s, d, generator=g), "num_heads": h} for b, s, d, h in shapes
    ]  # seq == heads in two cases: a wrong split keeps the shape there


def _equivariance_hint(split_heads: Callable[..., Tensor]) -> Callable[[Case, object], str]:
    """A hint for a wrong split: whether the reader's split, inside a clinic attention module,
    still leaves it permutation-equivariant (bug 4 does not: it mixes tokens across positions;
    features cut in the wrong order do)."""

    class ReaderAttention(clinic.MultiHeadAttention):
        def split_heads(self, x: Tensor) -> Tensor:
            return split_heads(x=x, num_heads=self.num_heads)

    def hint(case: Case, got: object) -> str:
        batch, seq_len, d_model = case["x"].shape
        heads = case["num_heads"]
        expected = (batch, heads, seq_len, d_model // heads)
        # a wrong shape first: equivariance is beside the point
        if tuple(getattr(got, "shape", ())) != expected:
            return "\n   The result must be (batch, num_heads, seq_len, head_dim): check the order of the axes."
        torch.manual_seed(0)
        attention = ReaderAttention(16, 4)
        x = torch.randn(2, 7, 16, generator=seeded_generator(111))  # (batch, seq, d_model)
        try:
            equivariant = clinic.is_permutation_equivariant(lambda t: attention(t, t, t), x)
        except Exception:  # the reader's split cannot run inside the module: no hint
            return ""
        if not equivariant:
            return (
                "\n   An attention module with your split is not permutation-equivariant: "
                "a head mixes features of different tokens."
            )
        return (
            "\n   An attention module with your split is still permutation-equivariant, so "
            "each head holds features of one token at a time, but not features r·head_dim … "
            "(r+1)·head_dim − 1."
        )

    return hint


def check_split_heads(split_heads: Callable[..., Tensor], verbose: bool = True) -> CheckResult:
    """Check ``split_heads(x, num_heads)`` → ``(batch, heads, seq, head_dim)`` against the
    reference on six shapes (two with ``seq == num_heads``, where a wrong split keeps the
    shape); a wrong answer's report says whether an attention module with it is still
    permutation-equivariant (the chapter's test for bug 4). A call into the clinic's model or
    :mod:`companion.attention` (which split heads correctly) fails."""
    guarded = split_heads
    if split_heads is not reference_split_heads:  # the reference passes its own check
        modules = (patient, _attention, sys.modules[__name__])
        guarded = refusing_calls(split_heads, "split the heads", modules)
    return run_check(
        "split_heads",
        guarded,
        reference_split_heads,
        _split_cases(),
        verbose=verbose,
        hint=_equivariance_hint(split_heads),
    )


# --------------------------------------------------------------------------------------------
# Exercise 2: predict how far a shifted causal mask leaks
# --------------------------------------------------------------------------------------------

#: the decoders of the exercise: (layers per stack N, the mask's diagonal k), for a causal mask
#: built as ``torch.tril(ones, diagonal=k)``. Chosen so that the classic wrong rules give a
#: wrong reach in at least one case: k (one layer), N, N + k - 1, k ** N, and every later token.
LEAK_CASES = ((3, 1), (2, 2), (1, 3))


class _ShiftedMask(clinic.Transformer):
    """A small clinic model whose causal mask is ``tril(ones, diagonal=k)``."""

    def __init__(self, num_layers: int, diagonal: int) -> None:
        super().__init__(d_model=16, num_heads=2, num_layers=num_layers, d_ff=32)
        self.diagonal = diagonal

    def causal_mask(self, size: int) -> Tensor:
        return torch.tril(torch.ones(size, size, dtype=torch.bool), diagonal=self.diagonal)


def leak_decoder(num_layers: int, diagonal: int) -> clinic.Transformer:
    """The exercise's decoder: a small clinic model (seed 0, ``d_model`` 16, ``num_layers`` in
    each stack) whose causal mask is ``torch.tril(ones, diagonal=diagonal)``."""
    torch.manual_seed(0)
    return _ShiftedMask(num_layers, diagonal).eval()


def measured_reach(num_layers: int, diagonal: int) -> int:
    """The largest ``j - i`` for which output ``i`` of :func:`leak_decoder` moves when decoder
    input ``j`` changes (:func:`companion.clinic.causal_leak` on one toy sentence of 13 tokens);
    0 for a decoder that does not leak."""
    src, tgt_in, _ = clinic.toy_batch(1, torch.Generator().manual_seed(0))  # (1, 13) each
    moved = clinic.causal_leak(leak_decoder(num_layers, diagonal), src, tgt_in)  # (13, 13)
    i, j = torch.nonzero(moved, as_tuple=True)
    return int((j - i).max().clamp(min=0))


def _reach_hint(num_layers: int, diagonal: int, answer: int) -> str:
    """Why ``answer`` is wrong, without the right reach."""
    if answer == diagonal == num_layers:  # N = k: the slip could be either count alone
        return (
            f"{answer} is both the layer count and how far one layer reads ahead. Layer 2 reads "
            "the outputs of layer 1 at the positions it may see: how far ahead had those already read?"
        )
    if answer == diagonal:
        return (
            f"{answer} is how far one layer reads ahead. Layer 2 reads the outputs of layer 1 "
            "at the positions it may see: how far ahead had those already read?"
        )
    if answer == num_layers:
        return f"{answer} counts the layers only; what does the mask's diagonal add per layer?"
    if answer >= 12:
        return "the mask still blocks most of the future: each layer reads a fixed number ahead"
    return "count, for output i, the furthest input that each layer lets through, layer by layer"


def check_leak_reach(answers: Mapping[tuple[int, int], int], verbose: bool = True) -> CheckResult:
    """Check ``answers``, ``{(num_layers, diagonal): reach}`` for the decoders of
    :data:`LEAK_CASES`: the reach is the largest ``j - i`` for which output ``i`` moves when
    decoder input ``j`` changes, measured with :func:`companion.clinic.causal_leak` on
    :func:`leak_decoder` (:func:`measured_reach`).

    Raises:
        TypeError: ``answers`` is not a dict.
    """

    def problem_of(case: tuple[int, int], answer: object) -> str | None:
        if isinstance(answer, Tensor) and answer.dim() == 0 and not answer.is_floating_point():
            answer = answer.item()  # a 0-dim integer tensor counts as its int
        if isinstance(answer, float) and answer.is_integer():
            answer = int(answer)  # 4.0 counts as 4
        if answer is None:
            return f"no answer yet for N = {case[0]}, k = {case[1]}: give the reach as an int"
        if isinstance(answer, bool) or not isinstance(answer, numbers.Integral):
            return f"the reach must be an int (a number of positions), got {answer!r}"
        if int(answer) != measured_reach(*case):
            return f"not {int(answer)}. {_reach_hint(*case, int(answer))}"
        return None

    return _check_answers(
        "leak_reach", answers, LEAK_CASES, f"{{(num_layers, diagonal): reach}} for {LEAK_CASES}",
        problem_of, lambda case: f"N = {case[0]} layers, tril(..., diagonal={case[1]})",
        f"all {len(LEAK_CASES)} reaches right.", verbose, keys_problem=_leak_keys_problem,
    )  # fmt: skip


def _leak_keys_problem(answers: Mapping) -> str | None:
    """A key that is not one of :data:`LEAK_CASES` (a string such as ``"(3, 1)"``, say)."""
    unknown = [key for key in answers if key not in LEAK_CASES]
    if not unknown:
        return None
    return f"keys must be (N, k) tuples from {LEAK_CASES}, got {unknown[0]!r}"


# --------------------------------------------------------------------------------------------
# Exercise 4: predict which findings fail
# --------------------------------------------------------------------------------------------

#: the names of ``clinic.examine``'s eight results, in its order: each is named after the
#: chapter's test it runs
FINDINGS = (
    "deterministic evaluation",
    "registration",
    "causal leak",
    "batch independence",
    "padding invariance",
    "loss at initialisation",
    "loss ignores padding",
    "labels shifted",
)


def _finding_of(name: str) -> str | None:
    """The name of :data:`FINDINGS` that ``name`` means, in any case and spacing, also with an
    earlier edition's test number in front (``"6b padding invariance"``), else None."""
    said = _normal(re.sub(r"^\s*[1-8][a-d]?\.?\s+", "", name, flags=re.IGNORECASE))
    return next((finding for finding in FINDINGS if said == _normal(finding)), None)


class _InvertedPaddingMask(patient.ReaderTransformer):
    """The reader's model with its padding mask ``True`` on the pads."""

    def padding_mask(self, ids: Tensor) -> Tensor:
        return (ids == self.pad_id)[:, None, None, :]  # (batch, 1, 1, len)  # BUG: == for !=


class _UnscaledEmbedding(patient.ReaderTransformer):
    """The reader's model without the ``√d_model`` scale of the token vectors."""

    def embed_tokens(self, ids: Tensor) -> Tensor:
        return self.drop(self.add_positions(self.embed(ids)))  # BUG: no * math.sqrt(self.d_model)


def masked_mean_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """The pads' losses set to 0, then the mean."""
    losses = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), reduction="none"
    )  # (batch * len,)
    real = (labels.flatten() != clinic.PAD_ID).float()  # (batch * len,)
    return (losses * real).sum() / real.numel()  # BUG: / real.sum()


#: the exercise's patients: name -> (the buggy code, what builds the patient)
PREDICT_PATIENTS: dict[str, tuple[Callable[..., object], Callable[[], clinic.Patient]]] = {}


def _reader_patient(model_class: type, loss: Callable[[Tensor, Tensor], Tensor]) -> clinic.Patient:
    torch.manual_seed(0)
    model = model_class()
    return clinic.Patient(
        model=model, logits=clinic.as_logits_fn(model), loss=loss, shift=clinic.teacher_forcing,
        vocab_size=clinic.READER_VOCAB_SIZE,
    )  # fmt: skip


PREDICT_PATIENTS["padding mask inverted"] = (
    _InvertedPaddingMask.padding_mask,
    lambda: _reader_patient(_InvertedPaddingMask, clinic.sequence_loss),
)
PREDICT_PATIENTS["loss over every position"] = (
    masked_mean_loss,
    lambda: _reader_patient(patient.ReaderTransformer, masked_mean_loss),
)
PREDICT_PATIENTS["embedding not scaled"] = (
    _UnscaledEmbedding.embed_tokens,
    lambda: _reader_patient(_UnscaledEmbedding, clinic.sequence_loss),
)


def predict_patient(name: str) -> clinic.Patient:
    """The patient ``name`` of :data:`PREDICT_PATIENTS`, built at seed 0."""
    if name not in PREDICT_PATIENTS:
        raise ValueError(f"name must be one of {sorted(PREDICT_PATIENTS)}, got {name!r}")
    return PREDICT_PATIENTS[name][1]()


def failed_findings(name: str) -> set[str]:
    """The findings of ``clinic.examine`` that the patient ``name`` fails."""
    return {finding.test for finding in clinic.examine(predict_patient(name)) if not finding}


_PREDICT_HINTS = {
    "padding mask inverted": (
        "with the mask True on the pads, what does a decoder query of a sentence without pads "
        "see? A row with every key blocked gets -1e9 everywhere: what does the softmax of that "
        "row give?"
    ),
    "loss over every position": (
        "the pads' losses are zeroed, but look at what the sum is divided by, and what that "
        "number does when pads are appended."
    ),
    "embedding not scaled": (
        "most of these tests compare two runs of the same model, which a change of the input scale "
        "keeps equal; the first loss is absolute, but a LayerNorm sits between the embedding "
        "and the output."
    ),
}


#: an answer that names every failing test and more: why the extra one passes
_EXTRA_HINTS = {
    "batch independence": (
        "it runs each sentence alone and in its batch; a bug that reads only the sentence's own "
        "tokens and pads acts the same way both times"
    ),
    "loss at initialisation": (
        "it computes its own cross-entropy, pads ignored: it never calls the patient's loss function"
    ),
}
_EXTRA_HINT = "what does that test compare, and does the bug change only one side of it?"


def check_predictions(answers: Mapping[str, object], verbose: bool = True) -> CheckResult:
    """Check ``answers``, ``{patient name: the set of examine's tests it fails}`` for the patients
    of :data:`PREDICT_PATIENTS` (an empty set: it passes all eight). Each is one name of
    :data:`FINDINGS` (``set()`` or ``{}`` for none); the truth is ``clinic.examine`` run
    on the patient (:func:`failed_findings`).

    Raises:
        TypeError: ``answers`` is not a dict.
    """

    def problem_of(patient_name: str, answer: object) -> str | None:
        if isinstance(answer, dict) and not answer:  # {}: Python's empty dict, meant as set()
            answer = set()
        if isinstance(answer, str) or not isinstance(answer, (set, frozenset, list, tuple)):
            return f"answer with a set of test names (set() for none), got {answer!r}"
        unknown = [f for f in answer if not isinstance(f, str) or _finding_of(f) is None]
        if unknown:
            return f"{unknown[0]!r} is not a test of examine; use the names of ch11.FINDINGS"
        said = {_finding_of(f) for f in answer}
        truth = failed_findings(patient_name)
        if said != truth:
            extra = sorted(said - truth)
            if truth and said > truth:  # every failing test named, and more: why do these pass?
                passes = f"{' and '.join(extra)} pass{'es' if len(extra) == 1 else ''}"
                why = _EXTRA_HINTS.get(extra[0], _EXTRA_HINT)
                return f"not {sorted(said)}: {passes}. {why}"
            return f"not {sorted(said) or 'none'}. {_PREDICT_HINTS[patient_name]}"
        return None

    keys = tuple(PREDICT_PATIENTS)
    return _check_answers(
        "predictions", answers, keys, f"{{patient name: set of findings}} for {sorted(keys)}",
        problem_of, repr, f"all {len(keys)} patients right.", verbose,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Exercise 3: the greedy loop (bug 9)
# --------------------------------------------------------------------------------------------


def reference_greedy_decode(model: clinic.Transformer, src: Tensor, max_len: int) -> Tensor:
    """``(batch, max_len)`` ids: the clinic model's greedy output, the growing sequence fed
    back at each step (:func:`companion.clinic.greedy_decode`)."""
    with torch.no_grad():
        return clinic.greedy_decode(model, src, max_len)  # (batch, max_len)


class _CaseModel(clinic.Transformer):
    """A small clinic model whose repr fits on one line of a check's report."""

    def __repr__(self) -> str:
        return "clinic.Transformer(d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.1)"


def _greedy_cases() -> list[Case]:
    """Batches of one to four sentences, ``max_len`` longer, shorter and equal to the source;
    in the last three cases the sources have different lengths, right-padded with ``<pad>``
    (a loop that forgets the source mask lets the pads into cross-attention). The models have
    dropout 0.1 and come in ``eval()`` mode: a loop that switches them to ``train()`` decodes
    with dropout on and fails."""
    g = seeded_generator(114)
    cases: list[Case] = []
    for seed, batch, seq_len, max_len, pads in [
        (0, 3, 5, 8, ()), (1, 2, 7, 4, ()), (2, 4, 6, 6, ()), (3, 1, 4, 9, ()),
        (4, 3, 8, 6, (0, 3, 5)), (5, 4, 6, 7, (2, 0, 4, 1)), (6, 2, 9, 5, (6, 0)),
    ]:  # fmt: skip
        torch.manual_seed(seed)
        model = _CaseModel(d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.1).eval()
        src, _, _ = clinic.toy_batch(batch, g, seq_len=seq_len)  # (batch, seq_len + 1)
        for row, count in enumerate(pads):  # row ends in `count` pads
            if count:
                src[row, -count:] = clinic.PAD_ID
        cases.append({"model": model, "src": src, "max_len": max_len})
    return cases


def _stopped_early(got: Tensor, right: Tensor) -> bool:
    """True when ``got`` (batch, max_len or fewer) differs from the right output ``right`` only
    after each sentence's first ``<eos>`` in ``right``, and holds only ``<pad>`` or ``<eos>``
    there (or ends early): the loop stopped at ``<eos>``."""
    if got.dim() != 2 or got.shape[0] != right.shape[0] or not 0 < got.shape[1] <= right.shape[1]:
        return False
    if torch.equal(got, right):
        return False
    is_eos = right == clinic.EOS_ID  # (batch, max_len)
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), right.shape[1])  # (batch,)
    width = got.shape[1]  # shorter than max_len: the loop broke off once every sentence ended
    if width < right.shape[1] and not (first < width).all():  # one token short: not an <eos> stop
        return False
    after = torch.arange(width)[None, :] > first[:, None]  # (batch, width)
    filler = (got == clinic.PAD_ID) | (got == clinic.EOS_ID)
    return bool(((got == right[:, :width]) | (after & filler)).all())


def _last_token_loop(model: clinic.Transformer, src: Tensor, max_len: int) -> Tensor:
    """The last-token slip, batched: each step feeds the decoder only the previous token."""
    src_mask = model.make_src_mask(src)  # (batch, 1, 1, src_len)
    memory = model.encode(src, src_mask)
    token = torch.full((src.shape[0], 1), clinic.BOS_ID)  # (batch, 1)
    out = []
    for _ in range(max_len):
        token = model.decode(token, memory, src_mask)[:, -1:].argmax(dim=-1)  # (batch, 1)
        out.append(token)
    return torch.cat(out, dim=1)  # (batch, max_len)


def check_greedy_decode(greedy_decode: Callable[..., Tensor], verbose: bool = True) -> CheckResult:
    """Check ``greedy_decode(model, src, max_len)`` → ``(batch, max_len)`` on small random
    clinic models, batches of several sentences, ``max_len`` unlike the source length and
    right-padded sources of different lengths. A call into a healthy decoding loop
    (``clinic.greedy_decode``, :mod:`companion.decode`, this module's reference) fails; the
    model's own methods (``encode``, ``decode``, ``make_src_mask``) are what the loop calls."""
    guarded = greedy_decode
    if greedy_decode is not reference_greedy_decode:  # the reference passes its own check
        guarded = refusing_calls(
            greedy_decode,
            "write the decoding loop",
            (_decode,),
            functions=(clinic.greedy_decode, reference_greedy_decode),
        )

    # functools.wraps keeps its signature: a renamed parameter gets the checker's message
    @functools.wraps(greedy_decode)
    def no_grad(**kwargs: object) -> Tensor:
        with torch.no_grad():
            ids = guarded(**kwargs)
        if isinstance(ids, Tensor) and ids.dtype != torch.long:  # float ids: the values may match
            raise TypeError(
                f"greedy_decode must return token ids as integers (torch.long), got {ids.dtype}: "
                "nn.Embedding cannot look up float ids"
            )
        return ids

    def padded_hint(case: Case, got: object) -> str:
        if case["model"].training:  # the loop switched dropout on
            return (
                "\n   hint: the model came in eval() mode and left in training mode: the loop "
                "decoded with dropout on (leave the caller's mode alone, or call model.eval())"
            )
        if isinstance(got, Tensor):
            with torch.no_grad():
                right = reference_greedy_decode(**case)  # (batch, max_len)
            if _stopped_early(got, right):  # checked first: its first token is right too
                return (
                    "\n   hint: the output matches up to each sentence's first <eos> and not after "
                    "it: no early stop at <eos>; return max_len tokens for every sentence"
                )
        if isinstance(got, Tensor) and got.shape == (case["src"].shape[0], case["max_len"]):
            with torch.no_grad():
                last_only = _last_token_loop(**case)
            unpadded = not (case["src"] == clinic.PAD_ID).any()  # padded: the source mask's hint
            first_only = torch.equal(got[:, 0], right[:, 0]) and not torch.equal(got, right)
            if torch.equal(got, last_only) or (unpadded and first_only):  # the last-token slip
                return (
                    "\n   hint: the first token is right and later ones are not: does each step "
                    "feed the decoder the whole prefix (<bos> and every token so far), not only "
                    "the last token?"
                )
        if not (case["src"] == clinic.PAD_ID).any():
            return ""
        return (
            "\n   hint: this case's sources are right-padded: does the source mask "
            "(model.make_src_mask) reach both encode and decode?"
        )

    return run_check(
        "greedy_decode",
        no_grad,
        reference_greedy_decode,
        _greedy_cases(),
        verbose=verbose,
        hint=padded_hint,
    )


# --------------------------------------------------------------------------------------------
# Exercise 6: mystery patients (the common bugs, companion.clinic.CONDITIONS)
# --------------------------------------------------------------------------------------------

#: The patients of the exercise: ``clinic.mystery(seed)`` for each seed. Two of them (0, 9) fail
#: the same first diagnostic for different reasons; two others (5, 7) give the same row of
#: ``clinic.examine`` (padding invariance alone), so that the table of the chapter cannot tell
#: them apart and only a look at the model's mask can.
MYSTERY_SEEDS = (0, 5, 7, 9)

#: conditions whose ``clinic.examine`` findings fail the same diagnostics: naming one of them
#: from the table alone is a guess
_SAME_ROW = ("padding mask on the query axis", "padding mask forgotten")

#: The menu of the exercise: the names of ``clinic.CONDITIONS`` in alphabetical order (not the
#: chapter's order). An answer is one of them.
MYSTERY_MENU = tuple(sorted(clinic.CONDITIONS, key=str.casefold))


#: checks that tests/test_exercises.py's generic tests cannot run, with the reason
GENERIC_TEST_EXEMPT = {
    "check_mystery": "it takes the reader's answers (a dict of condition names), not a "
    "function; tests/test_exercises_ch11.py checks right, wrong and missing answers",
    "check_leak_reach": "it takes the reader's predictions (a dict of ints), not a function; "
    "tests/test_exercises_ch11.py checks right, wrong and missing answers",
    "check_predictions": "it takes the reader's predictions (a dict of sets of finding names), "
    "not a function; tests/test_exercises_ch11.py checks right, wrong and missing answers",
}


def _normal(name: str) -> str:
    """``name`` in lowercase with single spaces: the form answers are compared in."""
    return " ".join(name.casefold().split())


def _menu_text() -> str:
    return "; ".join(repr(name) for name in MYSTERY_MENU)


def _mystery_problem(seed: int, answer: object) -> str | None:
    """None when ``answer`` is the name of the bug of ``clinic.mystery(seed)``, else why not."""
    if isinstance(answer, (tuple, list, set)) and len(answer) == 1:
        return (
            f"write the name as a str, not a {type(answer).__name__} holding it ({answer!r}): "
            f"{next(iter(answer))!r} rather than {answer!r}"
        )
    if isinstance(answer, (tuple, list, set)):
        return (
            f"name one condition, not {len(answer)} ({answer!r}): a diagnosis that hedges "
            "between bugs is not a diagnosis"
        )
    if not isinstance(answer, str):
        return f"the answer must be a str, one name of the menu, got {type(answer).__name__}"
    names = {_normal(name): name for name in MYSTERY_MENU}
    named = names.get(_normal(answer))
    if named is None:
        return f"{answer!r} is not on the menu; answer with one of: {_menu_text()}"
    truth = registry._condition_of(clinic.mystery(seed))
    if named != truth and named in _SAME_ROW:  # the same hint whatever the truth: no elimination
        return (
            f"not {named!r}. Before naming a padding-mask bug, look at the mask itself: "
            "print patient.model.encoder_mask(src) for a padded src and ask which axis "
            "it hides"
        )
    if named != truth:
        return (
            f"not {named!r}. Read every finding of clinic.examine(patient), not only the "
            "first, and test your diagnosis on the patient itself"
        )
    return None


def check_mystery(answers: Mapping[int, str], verbose: bool = True) -> CheckResult:
    """Check ``answers``, ``{seed: the name of the bug of clinic.mystery(seed)}``, for the seeds
    of :data:`MYSTERY_SEEDS`. Each answer is one name of :data:`MYSTERY_MENU` (the keys of
    ``clinic.CONDITIONS``), compared without regard to case or spacing; an unknown name is
    rejected with the menu, a list or tuple of several names (a hedge) and the name of another
    bug are rejected.

    Raises:
        TypeError: ``answers`` is not a dict.
    """

    def keys_problem(answers: Mapping) -> str | None:
        wrong = [key for key in answers if not isinstance(key, int) or isinstance(key, bool)]
        if not wrong:
            return None
        return (
            f"the keys must be the seeds as int, {MYSTERY_SEEDS}, got {wrong[0]!r} "
            f"({type(wrong[0]).__name__}); write {{0: ..., 5: ..., 7: ..., 9: ...}}"
        )

    def empty(answer: object) -> bool:
        return answer is None or (isinstance(answer, str) and not answer.strip())

    def problem_of(seed: int, answer: object) -> str | None:
        if empty(answer):
            return f"no answer; answer with one of: {_menu_text()}"
        return _mystery_problem(seed, answer)

    return _check_answers(
        "mystery", answers, MYSTERY_SEEDS, f"{{seed: the name of the bug}} for the seeds {MYSTERY_SEEDS}",
        problem_of, lambda seed: f"patient {seed}", f"all {len(MYSTERY_SEEDS)} patients named right.",
        verbose, empty=empty, keys_problem=keys_problem,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Exercise 5: a batch-independence test of your own
# --------------------------------------------------------------------------------------------

#: how far a sentence's logits may move (batched vs alone) and still count as independent: a
#: batch of one may take other float32 kernels
BATCH_ATOL = 1e-4
#: the band of tolerances exercise 5 accepts: any absolute tolerance in it separates the check's
#: healthy models (float noise under 2/3 of the lower end, 6e-6 on a logit near zero) from its
#: smallest planted dependence (over twice the upper end, 3e-3 on logits near 100, so a relative
#: tolerance alone fails one of the two); chapter 11 measures both and asserts these margins
BATCH_BAND = (1e-5, 1e-3)


def reference_batch_independent(logits_fn: Callable[[Tensor], Tensor], ids: Tensor) -> bool:
    """Whether each sentence's logits depend on that sentence only (not on its row of the
    batch, not on the other sentences): every sentence run alone gives its logits in the batch,
    to :data:`BATCH_ATOL`.

    Args:
        logits_fn: token ids ``(batch, seq)`` → logits ``(batch, seq, vocab)``.
        ids: ``(batch, seq)``, batch ≥ 2.
    """
    with torch.no_grad():
        batched = logits_fn(ids)  # (batch, seq, vocab)
        for row in range(ids.shape[0]):
            alone = logits_fn(ids[row : row + 1])  # (1, seq, vocab)
            if (alone[0] - batched[row]).abs().max().item() > BATCH_ATOL:
                return False
    return True


class _BatchModel:
    """A tiny sequence model, ids ``(batch, seq)`` → logits ``(batch, seq, vocab)``, that mixes
    the sentences of a batch in one of several ways (``how``); its repr names the model only by
    its case number, so a failing report does not hand out the answer."""

    VOCAB, WIDTH = 12, 6
    #: (reader row, row it reads) pairs: each defeats a test that watches only some rows
    READS = {
        "row 0 reads row 1": ((0, 1),),  # the last row is clean
        "row 2 reads row 3": ((2, 3),),  # the first two rows are clean
        "rows 1 and 3 read each other": ((1, 3), (3, 1)),  # symmetric under reversal of 5 rows
        "the last row reads row 0": ((2, 0),),  # in a batch of 3: only the last row mixes
        "row 1 reads row 0": ((1, 0),),  # in a batch of 4: the halves, and randperm(4) with
        # seed 0 (rows 0 and 1 stay in place), see the same mixing as the whole batch
        "row 0 reads row 2": ((0, 2),),  # in a batch of 4: only the first row mixes
        "neighbouring rows read each other": ((0, 1), (1, 0), (2, 3), (3, 2)),  # a reshape that
        # pairs sentences: in a batch of 4, two halves of the batch mix as the whole does
    }

    def __init__(self, number: int, how: str, strength: float = 0.5) -> None:
        g = seeded_generator(1160 + number)
        self.number, self.how, self.strength = number, how, strength
        self.table = torch.randn(self.VOCAB, self.WIDTH, generator=g)  # (vocab, width)
        self.out = torch.randn(self.WIDTH, self.VOCAB, generator=g)  # (width, vocab)
        self.rows = torch.randn(16, self.WIDTH, generator=g)  # (16, width): batch-axis codes

    def __call__(self, ids: Tensor) -> Tensor:
        x = self.table[ids]  # (batch, seq, width)
        steps = torch.arange(1, ids.shape[1] + 1)[None, :, None]  # (1, seq, 1)
        h = torch.tanh(x.cumsum(1) / steps)  # (batch, seq, width): each sentence's own prefix mean
        s, batch = self.strength, ids.shape[0]
        if self.how == "rounding":  # another kernel for another batch size: 1.5e-7 per row
            h = h + 1.5e-7 * batch
        elif self.how == "batch size":  # reads the batch's size: copies of a sentence hide it
            h = h + 0.1 * s * batch
        elif self.how == "a sentence alone":  # a batch of one is treated differently (a stray
            if batch == 1:  # .squeeze(), say): a leave-one-out test never runs one and misses it
                h = h + s
        elif self.how == "batch mean":  # symmetric in the rows: reversing the batch hides it
            h = h + s * h.mean(0, keepdim=True)
        elif self.how == "reads the first row":  # row 0 is clean, the others read it
            h = torch.cat([h[:1], h[1:] + s * h[:1]], dim=0)
        elif self.how == "batch-axis positions":  # a position table indexed by the row
            h = h + s * self.rows[:batch, None, :]
        elif self.how == "batch mean at position 0":  # only the first position mixes the batch
            h = torch.cat([h[:, :1] + s * h[:, :1].mean(0, keepdim=True), h[:, 1:]], dim=1)
        elif self.how == "padded rows read the batch mean":  # content decides which rows mix:
            # any reordering of the batch commutes with it, and a sentence without pads is clean
            padded = (ids == 0).any(1)[:, None, None]  # (batch, 1, 1): the sentences with a pad
            h = torch.where(padded, h + s * h.mean(0, keepdim=True), h)
        elif self.how in self.READS:  # some rows read others; the rest are clean
            mixed = h.clone()  # (batch, seq, width)
            for reader, source in self.READS[self.how]:
                if max(reader, source) < batch:  # a smaller batch (a sentence alone) is clean
                    mixed[reader] = h[reader] + s * h[source]
            h = mixed
        logits = h @ self.out  # (batch, seq, vocab)
        if self.how == "rounding near zero":  # logit 0 sits near 1e-4 and rounds differently in
            logits = logits.clone()  # a batch by 6e-6: a relative gap of 6e-2, an absolute one
            logits[..., 0] = 1e-4 + (6e-6 if batch > 1 else 0.0)  # under the band's bottom
        elif self.how == "small leak on large logits":  # logits near 100; row 1 reads row 0 by
            logits = logits + 100.0  # 3e-3 to 5e-3: over the band's top, yet only ~4e-5 relative
            if batch > 1:
                logits[1] = logits[1] + 4e-3 + 1e-3 * torch.tanh(logits[0, 0, 0] - 100.0)
        elif self.how == "leak centred over the vocabulary" and batch > 1:  # row 1 reads row 0
            move = self.strength * torch.tanh(logits[0])  # (seq, vocab): by up to 0.5 a logit,
            logits = logits.clone()  # yet its moves sum to zero over the vocabulary (a signed
            logits[1] = logits[1] + move - move.mean(-1, keepdim=True)  # sum of them misses it)
        if self.how == "one logit" and batch > 1:  # one logit of row 1 reads row 0, by 3e-3
            logits = logits.clone()  # to 5e-3: over the band's top, yet its mean over a row's 600
            logits[1, -1, 0] += 4e-3 + 1e-3 * torch.tanh(logits[0, 0, 0])  # is under its bottom
        return logits

    def __repr__(self) -> str:
        return f"model {self.number} (a function from ids (batch, seq) to logits)"


def batch_independence_cases() -> list[Case]:
    """The cases :func:`check_batch_independent` runs a reader's test on, in its order: each a
    dict with ``logits_fn`` (ids ``(batch, seq_len)`` → logits ``(batch, seq_len, vocab)``, its
    ``how`` naming what it does to the batch) and ``ids`` ``(batch, seq_len)``; the same on
    every call (seeded). Chapter 11 measures on them the moves its exercise 5 solution quotes."""
    return _batch_cases()


def _batch_cases() -> list[Case]:
    g = seeded_generator(116)
    cases: list[Case] = []
    for number, (how, strength, batch) in enumerate(
        [
            ("healthy", 0.5, 3),
            ("batch mean", 0.5, 4),
            ("rounding", 0.5, 4),
            ("reads the first row", 0.5, 3),
            ("batch-axis positions", 0.5, 3),
            ("batch mean", 0.01, 3),  # a small leak: a loose tolerance misses it
            ("healthy", 0.5, 2),
            ("row 0 reads row 1", 0.5, 2),  # misses: the last sentence alone
            ("row 2 reads row 3", 0.5, 4),  # misses: the first two sentences alone
            ("rows 1 and 3 read each other", 0.5, 5),  # misses: first alone + reversed batch
            ("batch mean at position 0", 0.5, 3),  # misses: the last position only
            ("the last row reads row 0", 0.5, 3),  # misses: every row but the last
            ("one logit", 0.5, 3),  # misses: a mean difference (< 5e-3 / 600 entries < 1e-5)
            ("row 1 reads row 0", 0.5, 4),  # misses: randperm(4) with seed 0 + first alone
            ("row 0 reads row 2", 0.5, 4),  # misses: every sentence alone but the first
            ("neighbouring rows read each other", 0.5, 4),  # misses: two halves vs the whole
            ("padded rows read the batch mean", 0.5, 4),  # misses: a reordering + first or last
            ("batch size", 0.5, 3),  # misses: each sentence against a batch of its copies
            ("a sentence alone", 0.5, 3),  # misses: leave-one-out (it never runs a batch of one)
            ("rounding near zero", 0.5, 3),  # fails: a relative tolerance alone, or atol < 6e-6
            ("small leak on large logits", 0.5, 3),  # misses: a relative tolerance alone
            ("leak centred over the vocabulary", 0.5, 3),  # misses: a signed sum of differences
        ]
    ):
        length = 50 if how == "one logit" else 5
        ids = torch.randint(0, _BatchModel.VOCAB, (batch, length), generator=g)  # (batch, length)
        if how == "padded rows read the batch mean":  # the first and last rows without pads
            ids = ids.clamp(min=1)  # no pad id 0 anywhere ...
            ids[1:-1, 3:] = 0  # ... but two at the end of the middle sentences
        cases.append({"logits_fn": _BatchModel(number, how, strength), "ids": ids})
    return cases


#: one line per kind of model, added to a failing report: what the case's model does
_BATCH_HINTS = {
    "healthy": "this model is batch-independent: each sentence alone gives its batched logits",
    "rounding": (
        "this model only rounds differently in a batch (by about 2e-6 at most): rounding, not a leak; a"
        " tolerance from 1e-5 to 1e-3 tells the two apart"
    ),
    "rounding near zero": (
        "this model only rounds differently in a batch, by 6e-6 on a logit near 1e-4: rounding, not a"
        " leak; compare with an absolute tolerance from 1e-5 to 1e-3, not a relative one"
    ),
    "small leak on large logits": (
        "one row moves by 3e-3 to 5e-3 on logits near 100: a leak that a relative tolerance misses;"
        " compare with an absolute tolerance from 1e-5 to 1e-3"
    ),
    "batch mean": "every row of this model reads the batch mean, so reversing the batch hides it",
    "reads the first row": "the rows after the first read row 0; row 0 itself is clean",
    "batch-axis positions": "this model's output depends on the row index of the batch",
    "batch mean at position 0": (
        "only the first position mixes the batch, and only a little: compare every logit at every"
        " position (an argmax need not move)"
    ),
    "one logit": (
        "a single logit moves by 3e-3 to 5e-3: compare the largest difference, not the mean, with a"
        " tolerance from 1e-5 to 1e-3"
    ),
    "leak centred over the vocabulary": (
        "row 1's logits move, but their moves sum to zero over the vocabulary: compare the largest"
        " absolute difference, not a signed sum or mean"
    ),
    "batch size": "this model reads the batch size: run every sentence alone, a batch of one",
    "a sentence alone": (
        "this model treats a batch of one differently (a stray .squeeze(), say): a test that never "
        "runs a batch of one (dropping one row, or a sentence beside its copy) misses it, so run "
        "every sentence alone"
    ),
}


def _batch_hint(case: Case, got: object) -> str:
    """One line saying what the failing case's model does (any rows that read other rows share
    a line: run every sentence alone)."""
    model = case["logits_fn"]
    if model.how == "batch mean" and model.strength < 0.1:  # a small leak, not a symmetric one
        return (
            "\n   hint: every row of this model reads a small share of the batch mean: a leak "
            "that a loose tolerance misses (compare every logit, with a tolerance from 1e-5 to 1e-3)"
        )
    line = _BATCH_HINTS.get(
        model.how, "only some rows of this model read others: run every sentence alone"
    )
    return f"\n   hint: {line}"


def check_batch_independent(
    batch_independent: Callable[..., bool], verbose: bool = True
) -> CheckResult:
    """Check ``batch_independent(logits_fn, ids)`` → ``True`` when every sentence's logits
    depend on that sentence only (to any absolute tolerance in :data:`BATCH_BAND`, 1e-5 to 1e-3),
    else ``False``, on small models:
    healthy ones (two whose batched result rounds differently: by about 2e-6, and by 6e-6 on a
    logit near 1e-4), and ones that
    mix the batch symmetrically (a batch mean, also a small one, or one at the first position only),
    make some rows read others (the first row read by the rest, row 0 reading row 1, row 2
    reading row 3 of four, rows 1 and 3 of five reading each other, the last row reading row 0,
    row 1 reading row 0 and row 0 reading row 2 of four, neighbouring rows of four reading each
    other), let only the padded sentences read the batch mean, move a single logit by 3e-3 to
    5e-3 (or a whole row, on logits near 100), move a row by a leak whose moves sum to zero over
    the vocabulary, add a position code along the batch axis (``batch_first`` confusion), or read the
    batch size. A tolerance below the healthy models' noise (``torch.equal``, say), above the
    smallest planted dependence, or relative only (``rtol`` without ``atol``) fails a case; a test that watches only some rows or
    positions, averages the differences (or sums them with their signs), only reorders the batch (reversed, rolled, a fixed
    permutation) besides running one sentence alone, compares two halves of the batch with the whole, or compares each sentence with a
    batch of its copies, misses one of them. A call into the clinic's toolkit
    (``clinic.batch_independence``) fails."""

    guarded = refusing_calls(
        batch_independent,
        "write the batch-independence test",
        (toolkit,),
    )

    # functools.wraps keeps its signature: a renamed parameter gets the checker's message
    @functools.wraps(batch_independent)
    def as_bool(**kwargs: object) -> object:
        verdict = guarded(**kwargs)
        return bool(verdict) if isinstance(verdict, (bool, torch.Tensor)) else verdict

    return run_check(
        "batch_independent",
        as_bool,
        reference_batch_independent,
        _batch_cases(),
        verbose=verbose,
        hint=_batch_hint,
    )
