"""The registry of chapter 11's bug clinic: :data:`BUGS`, each bug with the symptom it produces,
the test that catches it and its fixed twin, and :func:`build`, a clinic model with one bug of
ward 1 planted.

For the diagnostics that work on any model: :data:`CONDITIONS`, the common bugs of a reader's
own model and the code around it, :func:`admit`, a :class:`~companion.clinic.patient.Patient`
with one of them (or none), and the exercise :func:`mystery` / :func:`check_diagnosis`: a
patient with an unnamed bug, and the check of the reader's diagnosis.
"""

from __future__ import annotations

import ast
import random
import re
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from companion._validation import check_instance
from companion.clinic.patient import (
    READER_VOCAB_SIZE,
    Decoder,
    DecoderLayer,
    MultiHeadAttention,
    Parts,
    Patient,
    PositionalEncoding,
    ReaderAttention,
    ReaderTransformer,
    Transformer,
    greedy_decode,
    sequence_loss,
    teacher_forcing,
)
from companion.clinic.ward1 import (
    CausalOffByOne,
    DoubledExponentPositions,
    ForgottenPaddingMask,
    LayersInAList,
    QueryAxisPaddingMask,
    ScaleAfterSoftmax,
    SeqFirstPositions,
    SharedAttentionLayer,
    SharedHeadProjection,
    SoftmaxGenerator,
    SoftmaxOverQueries,
    SwappedDecoderCall,
    UnscaledTiedOutput,
    ValueResidual,
    ViewWithoutTranspose,
    last_token_greedy_decode,
    logits_in_eval,
    logits_without_eval,
    loss_over_padding,
    unshifted_labels,
)
from companion.clinic.ward2 import (
    DetachedPositions,
    DropoutAfterNorm,
    DropoutBeforeAdd,
    InlineNormBlock,
    LearnedPositions,
    MaskedPaddingEncoder,
    OneBasedEmbedding,
    PaddingIdxEncoder,
    RegisteredNormBlock,
    ZeroBasedEmbedding,
    causal_attention,
    discarded_mask_attention,
    interleaved_stacks,
    no_softmax_attention,
    stacked,
)

__all__ = [
    "Bug",
    "BUGS",
    "build",
    "BUG_NAMES",
    "Condition",
    "CONDITIONS",
    "admit",
    "mystery",
    "check_diagnosis",
    "MUSEUM",
    "museum_patients",
]


@dataclass(frozen=True)
class Bug:
    """One bug class of the clinic.

    Attributes:
        number: 1-18, as in chapter 11 (ward 1: 1-10, ward 2: 11-18).
        title: what is wrong, in a few words.
        symptom: what a learner sees.
        caught_by: the test that pinpoints it.
        buggy: the class or function holding the bug.
        fixed: its correct twin.
    """

    number: int
    title: str
    symptom: str
    caught_by: str
    buggy: object
    fixed: object

    @property
    def ward(self) -> int:
        """1 for the bugs planted in the model, 2 for the self-contained cases."""
        return 1 if self.number <= 10 else 2


BUGS: dict[str, Bug] = {
    bug.title: bug
    for bug in [
        Bug(1, "decoder self-attention on the encoder output", "future target tokens change earlier outputs",
            "causal leak test", SwappedDecoderCall, Decoder),
        Bug(2, "residual adds the value input", "outputs differ from the reference; a shape error when lengths differ",
            "parity after copying weights", ValueResidual, DecoderLayer),
        Bug(3, "one head_dim × head_dim projection shared by the heads", "fewer parameters; weights do not load",
            "parameter count", SharedHeadProjection, MultiHeadAttention),
        Bug(4, "heads split by view without transpose", "tokens mixed across positions",
            "permutation equivariance", ViewWithoutTranspose, MultiHeadAttention),
        Bug(5, "softmax in the generator and in the loss", "the loss stalls",
            "overfitting one batch", SoftmaxGenerator, Transformer),
        Bug(6, "mask by truthiness, inverted, or off by one", "an error, NaN, or a leak",
            "causal leak test", CausalOffByOne, Transformer),
        Bug(7, "scale after the softmax, or by d_k", "weights that do not sum to 1, or too flat",
            "parity after copying weights", ScaleAfterSoftmax, MultiHeadAttention),
        Bug(8, "positional exponent doubled, cosine of the next index", "a table unlike the paper's",
            "parity after copying weights", DoubledExponentPositions, PositionalEncoding),
        Bug(9, "inference feeds back the last token only", "low greedy accuracy; batch 1 only",
            "greedy accuracy and batched decoding", last_token_greedy_decode, greedy_decode),
        Bug(10, "one attention module for self- and cross-attention", "fewer parameters",
            "parameter count", SharedAttentionLayer, DecoderLayer),
        Bug(11, "padding_idx taken for a padding mask", "outputs change with the amount of padding",
            "batch invariance", PaddingIdxEncoder, MaskedPaddingEncoder),
        Bug(12, "masked_fill result discarded; tril == 1 mask", "future keys get weight",
            "causal leak test", discarded_mask_attention, causal_attention),
        Bug(13, "no softmax", "weights that do not sum to 1",
            "constant-value test", no_softmax_attention, causal_attention),
        Bug(14, "LayerNorm built inside forward", "γ, β missing from parameters and state_dict",
            "state_dict and parameter count", InlineNormBlock, RegisteredNormBlock),
        Bug(15, ".data detaches the learned positions", "zero gradient, frozen table",
            "gradient check", DetachedPositions, LearnedPositions),
        Bug(16, "decoder layer l reads encoder layer l", "outputs differ from the reference",
            "parity after copying weights", interleaved_stacks, stacked),
        Bug(17, "dropout after the LayerNorm", "the residual stream itself is dropped",
            "train/eval comparison with a zero sub-layer", DropoutAfterNorm, DropoutBeforeAdd),
        Bug(18, "ids 1 … vocab_size in nn.Embedding(vocab_size, d)", "IndexError on the last word; row 0 unused",
            "embedding the last id", OneBasedEmbedding, ZeroBasedEmbedding),
    ]
}  # fmt: skip


#: The ward-1 bugs by the names chapter 11 gives them: ``build(name)`` is ``build(number)``.
#: Bug 9 (the last-token loop) is in the decoding loop, not the model, so it has no entry.
BUG_NAMES: dict[str, int] = {
    "swapped arguments": 1,
    "memory residual": 2,
    "shared head projection": 3,
    "head split without a transpose": 4,
    "double softmax": 5,
    "mask off by one": 6,
    "misplaced scale": 7,
    "doubled exponent": 8,
    "shared attention module": 10,
}


def build(bug: int | str | None = None, seed: int = 0, **sizes: int | float) -> Transformer:
    """A clinic :class:`Transformer` with bug ``bug`` of ward 1 planted (``None``: correct),
    initialised from ``torch.manual_seed(seed)``; ``sizes`` go to :class:`Transformer`.
    ``bug`` is a number 1-10 or a name of :data:`BUG_NAMES`, e.g. ``"mask off by one"``.

    Bugs 6 and 7 have variants: ``6`` is the off-by-one causal mask, ``7`` the scale after the
    softmax (build :class:`InvertedCausalMask`, :class:`TruthinessMask` and :class:`ScaleByDk`
    with :class:`Parts` or directly). Bug 9 is in the decoding loop, not the model.
    """
    kinds: dict[int | None, tuple[type[Transformer], Parts]] = {
        None: (Transformer, Parts()),
        1: (Transformer, Parts(decoder=SwappedDecoderCall)),
        2: (Transformer, Parts(decoder_layer=ValueResidual)),
        3: (Transformer, Parts(attention=SharedHeadProjection)),
        4: (Transformer, Parts(attention=ViewWithoutTranspose)),
        5: (SoftmaxGenerator, Parts()),
        6: (CausalOffByOne, Parts()),
        7: (Transformer, Parts(attention=ScaleAfterSoftmax)),
        8: (Transformer, Parts(positions=DoubledExponentPositions)),
        9: (Transformer, Parts()),
        10: (Transformer, Parts(decoder_layer=SharedAttentionLayer)),
    }
    if isinstance(bug, str):
        if bug not in BUG_NAMES:
            raise ValueError(f"bug must be a name of BUG_NAMES {sorted(BUG_NAMES)}, got {bug!r}")
        bug = BUG_NAMES[bug]
    if isinstance(bug, bool) or bug not in kinds:
        raise ValueError(f"bug must be None, a ward-1 bug number 1-10 or a name, got {bug!r}")
    cls, parts = kinds[bug]
    torch.manual_seed(seed)
    return cls(parts=parts, **sizes)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Any model: the conditions of a reader's Transformer, the patients, the mystery patient
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """A common bug of a reader's model or of the code around it.

    Attributes:
        name: the bug, in a few words (the key of :data:`CONDITIONS`).
        synonyms: other phrases :func:`check_diagnosis` accepts, matched as whole words
            (lowercase; a word ending in ``*`` is a stem, ``a + b`` needs both parts).
        symptom: what a learner sees.
        caught_by: the diagnostic of :mod:`companion.clinic.toolkit` that fails on it.
        buggy: the class or function holding the bug.
        fixed: its correct twin.
    """

    name: str
    synonyms: tuple[str, ...]
    symptom: str
    caught_by: str
    buggy: object
    fixed: object


#: The documented pool of :func:`mystery`: the common bugs, each caught by one diagnostic.
CONDITIONS: dict[str, Condition] = {
    condition.name: condition
    for condition in [
        Condition("batch_first confusion", ("batch first", "batch axis", "seq first", "sequence first",
                  "size 0", "position of the batch", "positions by batch"),
                  "a sentence's output depends on its row in the batch", "batch_independence",
                  SeqFirstPositions, ReaderTransformer),
        Condition("softmax over the wrong dimension", ("softmax",),
                  "outputs read later tokens; weights that do not sum to 1 per query",
                  "causal_leak_check", SoftmaxOverQueries, ReaderAttention),
        Condition("padding counted in the loss", ("padding in the loss", "pads in the loss",
                  "padding counted", "pads counted", "loss counts", "ignore index",
                  "loss over padding", "loss over the padding", "loss includes pad*", "pad* + loss"),
                  "the loss changes with the amount of padding", "loss_padding_check",
                  loss_over_padding, sequence_loss),
        Condition("unshifted labels", ("not shifted", "unshifted", "shift*", "labels equal the input",
                  "copy"), "the training loss falls to 0, the model predicts nothing",
                  "label_shift_check", unshifted_labels, teacher_forcing),
        Condition("padding mask on the query axis", ("query axis", "queries axis", "query mask",
                  "unsqueeze", "mask* + quer*", "pad* + quer*", "mask* + wrong dim*",
                  "mask* + wrong axis", "mask* + wrong axes"),
                  "outputs change when pads are appended", "padding_invariance",
                  QueryAxisPaddingMask, ReaderTransformer),
        Condition("padding mask forgotten", ("no padding mask", "forgot* + padding mask",
                  "missing + padding mask", "without + padding mask", "no mask", "padding idx",
                  "mask + never built", "mask* + none"),
                  "outputs change when pads are appended", "padding_invariance",
                  ForgottenPaddingMask, ReaderTransformer),
        Condition("model.eval() forgotten", ("eval", "eval mode", "evaluation mode", "train mode",
                  "training mode", "model train"),
                  "two evaluations of the same sentence differ", "deterministic_check",
                  logits_without_eval, logits_in_eval),
        Condition("layers in a plain list", ("plain list", "python list", "in a list", "layers list",
                  "layer list", "list of layers", "not + modulelist", "no modulelist", "missing + modulelist",
                  "without + modulelist", "forgot* + modulelist", "instead of + modulelist",
                  "not registered", "unregistered", "registration", "never registered"),
                  "layers missing from parameters() and state_dict(), never trained",
                  "registration_check", LayersInAList, ReaderTransformer),
        Condition("tied output not rescaled", ("scal*", "unscaled", "tied", "tying",
                  "initial loss", "loss at init*", "sqrt", "√"),
                  "a loss far above ln(vocabulary size) before training", "initial_loss_check",
                  UnscaledTiedOutput, ReaderTransformer),
    ]
}  # fmt: skip


def admit(condition: str | None = None, seed: int = 0) -> Patient:
    """A :class:`~companion.clinic.patient.Patient` with ``condition`` (a key of
    :data:`CONDITIONS`; ``None``: healthy): a :class:`~companion.clinic.patient.
    ReaderTransformer` (vocabulary :data:`~companion.clinic.patient.READER_VOCAB_SIZE`,
    dropout 0.1) initialised from ``torch.manual_seed(seed)``, its evaluation adapter, loss
    and label shift, one of them buggy."""
    if condition is not None and condition not in CONDITIONS:
        raise ValueError(
            f"condition must be None or one of {sorted(CONDITIONS)}, got {condition!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    models = {
        "batch_first confusion": SeqFirstPositions,
        "padding mask on the query axis": QueryAxisPaddingMask,
        "padding mask forgotten": ForgottenPaddingMask,
        "layers in a plain list": LayersInAList,
        "tied output not rescaled": UnscaledTiedOutput,
    }
    torch.manual_seed(seed)
    if condition == "softmax over the wrong dimension":
        model = ReaderTransformer(attention=SoftmaxOverQueries)
    else:
        model = models.get(condition, ReaderTransformer)()
    forgetful = condition == "model.eval() forgotten"
    patient = Patient(
        model=model,
        logits=(logits_without_eval if forgetful else logits_in_eval)(model),
        loss=loss_over_padding if condition == "padding counted in the loss" else sequence_loss,
        shift=unshifted_labels if condition == "unshifted labels" else teacher_forcing,
        vocab_size=READER_VOCAB_SIZE,
        label="healthy" if condition is None else condition,
    )
    _remember(patient, condition)
    return patient


def mystery(seed: int) -> Patient:
    """A patient with an unnamed bug: one of :data:`CONDITIONS`, chosen by ``seed`` (the same
    seed, the same bug and the same weights). Examine it with the toolkit
    (:func:`companion.clinic.toolkit.examine` runs the diagnostics), name the bug, and check
    the name with :func:`check_diagnosis` (exercise 6's seeds:
    :func:`companion.exercises.ch11.check_mystery`)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    names = list(CONDITIONS)
    condition = names[random.Random(seed).randrange(len(names))]
    patient = admit(condition, seed)
    patient.label = f"mystery patient {seed}"
    _disguise(patient)
    _remember(patient, condition)
    return patient


_DISGUISES: dict[type, type] = {}

#: the condition of each patient admitted, by ``id(patient)``, with a weak reference that
#: tells a live patient from a new object at a recycled address: the answer is kept off the
#: patient itself, so that no attribute of a mystery patient names its bug
_TRUTH: dict[int, tuple[weakref.ref, str | None]] = {}


def _remember(patient: Patient, condition: str | None) -> None:
    key = id(patient)
    _TRUTH[key] = (weakref.ref(patient, lambda _ref: _TRUTH.pop(key, None)), condition)


def _condition_of(patient: Patient) -> str | None:
    """The condition ``patient`` was admitted with (``None``: healthy).

    Raises:
        ValueError: ``patient`` was not made by :func:`admit` or :func:`mystery`.
    """
    entry = _TRUTH.get(id(patient))
    if entry is None or entry[0]() is not patient:
        raise ValueError(
            "patient must come from clinic.admit or clinic.mystery, got another Patient"
        )
    return entry[1]


def _anonymous(function: Callable, name: str, qualname: str, doc: str | None) -> Callable:
    """A copy of ``function`` under a neutral name, qualified name and docstring, its code
    compiled from an unnamed file: the same behaviour, nothing that names a bug (``inspect``
    cannot find its source either)."""
    code = function.__code__.replace(co_name=name, co_qualname=qualname, co_filename="<patient>")
    copy = types.FunctionType(code, function.__globals__, name, function.__defaults__,
                              function.__closure__)  # fmt: skip
    copy.__qualname__, copy.__doc__ = qualname, doc
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


def _disguised_class(cls: type) -> type:
    """A class named, documented and derived like the healthy class that ``cls`` (a bug class
    of ward 1) overrides, holding anonymous copies of the buggy methods: neither its name, its
    ``__mro__`` nor its methods' names or source mention the bug class."""
    if cls not in _DISGUISES:
        buggy = [c for c in cls.__mro__ if c.__module__ == SeqFirstPositions.__module__]
        base = next(c for c in cls.__mro__ if c.__module__ != SeqFirstPositions.__module__)
        namespace: dict[str, object] = {"__module__": base.__module__,
                                        "__qualname__": base.__qualname__, "__doc__": base.__doc__}  # fmt: skip
        for owner in reversed(buggy):  # the most derived last, so that its methods win
            for key, value in vars(owner).items():
                if isinstance(value, types.FunctionType):
                    healthy = getattr(base, key, None)
                    namespace[key] = _anonymous(value, key, f"{base.__qualname__}.{key}",
                                                getattr(healthy, "__doc__", None))  # fmt: skip
        _DISGUISES[cls] = type(base.__name__, (base,), namespace)
    return _DISGUISES[cls]


def _disguise(patient: Patient) -> None:
    """Hide the bug's name: every module of a bug class of ward 1 becomes an instance of a
    class built from the healthy parent (:func:`_disguised_class`), and the adapter, loss and
    shift become anonymous copies named ``logits``, ``loss`` and ``shift``. The behaviour is
    unchanged: only the diagnostics tell."""
    for module in patient.model.modules():
        if type(module).__module__ == SeqFirstPositions.__module__:  # a bug class of ward 1
            module.__class__ = _disguised_class(type(module))
    patient.logits = _anonymous(patient.logits, "logits", "logits", "(src, tgt_in) -> logits")
    patient.loss = _anonymous(patient.loss, "loss", "loss", "(logits, labels) -> a scalar")
    patient.shift = _anonymous(patient.shift, "shift", "shift", "tgt -> (tgt_in, labels)")


def _words(text: str) -> str:
    """Lowercase words separated by single spaces, padded with a space on each side."""
    return " " + " ".join(re.sub(r"[^a-z0-9√]+", " ", text.lower()).split()) + " "


def _phrase_pattern(phrase: str) -> re.Pattern[str]:
    """A synonym as a regular expression on :func:`_words`' text: whole words, in order; a word
    ending in ``*`` matches any word it begins; ``a + b`` needs both parts, in any order."""
    parts = []
    for part in phrase.split(" + "):
        words = re.sub(r"[^a-z0-9√*]+", " ", part.lower()).split()
        words = [
            re.escape(w[:-1]) + "[a-z0-9]*" if w.endswith("*") else re.escape(w) for w in words
        ]
        parts.append(f"(?=.* {' '.join(words)} )")
    return re.compile("".join(parts))


def _named(answer: str) -> list[str]:
    """The conditions whose name or synonyms occur in ``answer``, as whole words. An answer
    that names both the unregistered layers and ``eval`` names the registration bug: its
    layers are why ``model.eval()`` never reaches them."""
    said = _words(answer)
    named = [
        name
        for name, condition in CONDITIONS.items()
        if any(_phrase_pattern(phrase).match(said) for phrase in (name, *condition.synonyms))
    ]
    hedged = re.search(r" (or|either|maybe|perhaps) ", said)
    if "layers in a plain list" in named and "model.eval() forgotten" in named and not hedged:
        named.remove("model.eval() forgotten")
    if "padding mask on the query axis" in named and _backwards(said):
        named.remove("padding mask on the query axis")
    return named


#: The query-axis bug stated backwards: the mask *should* go on the queries ("should be
#: applied to the queries, not the keys"), or it sits on the keys instead of the queries.
_SHOULD = r" (should|must|needs? to|ought to|has to)"
_SHOULD_QUERIES = re.compile(_SHOULD + r"( (?!key)[a-z]+){0,4} quer")
_INSTEAD_OF_QUERIES = re.compile(r" instead of( the)? quer")


def _backwards(said: str) -> bool:
    """Whether ``said`` (from :func:`_words`) wants the padding mask on the queries."""
    if _SHOULD_QUERIES.search(said):
        return True
    return bool(_INSTEAD_OF_QUERIES.search(said)) and not re.search(_SHOULD, said)


def check_diagnosis(patient: Patient, answer: str, verbose: bool = True) -> bool:
    """Whether ``answer`` names ``patient``'s bug: its name in :data:`CONDITIONS` or one of its
    synonyms, as whole words (case and punctuation do not matter, e.g. ``"forgot
    model.eval()"``; a symptom alone, such as ``"dropout"``, names nothing). An answer
    that names another bug, several bugs or none is rejected, with a hint: the diagnostic that
    catches the bug. ``verbose`` prints the verdict."""
    check_instance("patient", patient, Patient, "a clinic Patient (from mystery or admit)")
    if not isinstance(answer, str):
        raise TypeError(f"answer must be a str naming the bug, got {type(answer).__name__}")
    truth = _condition_of(patient)
    named = _named(answer)
    if truth is None:
        correct = not named and bool(re.search(r"healthy|no bug|none", answer.lower()))
        message = (
            "Right: this patient is healthy." if correct else "Not quite: this patient has no bug."
        )
    elif named == [truth]:
        condition = CONDITIONS[truth]
        correct = True
        message = f"Right: {truth}. Symptom: {condition.symptom}; caught by {condition.caught_by}."
    else:
        correct = False
        hint = f"Hint: look at what clinic.{CONDITIONS[truth].caught_by} says about it."
        if not named and re.search(r"dropout|evaluation", answer.lower()):
            message = (
                f"{answer!r} names a symptom, not the bug: dropout stays on at evaluation in "
                f"more than one patient; say why it is on. {hint}"
            )
        elif not named:
            message = f"{answer!r} names none of clinic.CONDITIONS. {hint}"
        elif len(named) > 1:
            message = f"{answer!r} names several bugs ({', '.join(named)}): name one. {hint}"
        else:
            message = f"Not {named[0]}. {hint}"  # its diagnostic may fail too (eval vs list)
    if verbose:
        print(message)
    return correct


#: Where the bug museum lives in the course repository: one mutant of the package per entry,
#: with the tests that must catch it (``tests/test_mutants.py`` proves that they do).
MUSEUM = "tests/mutants/catalogue.py"


def museum_patients(root: str | Path | None = None) -> list[dict[str, object]]:
    """More patients: the bug museum's mutants, ``[{"id", "bug", "path", "tests"}, ...]``.

    Each is a bug planted in a copy of ``companion`` (``path``, relative to the package) and
    the tests that catch it. The museum is part of the repository, not of the installed
    package: ``root`` is the repository's folder (default: the folder above the package, which
    is right for a clone with ``pip install -e .``).

    Raises:
        FileNotFoundError: the museum is not there (a package installed without the
            repository); the message gives the path to look in.
    """
    base = Path(__file__).resolve().parents[2] if root is None else Path(root)
    catalogue = base / MUSEUM
    if not catalogue.is_file():
        raise FileNotFoundError(
            f"the bug museum is not at {catalogue}: pass root=, the folder of a clone of the "
            f"course repository (the museum is {MUSEUM} there)"
        )
    tree = ast.parse(catalogue.read_text(encoding="utf-8"))  # read, never executed
    entries = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_m"
    ]
    patients = []
    for node in sorted(entries, key=lambda n: n.lineno):
        mutant_id, bug, path, _edits, *tests = (ast.literal_eval(arg) for arg in node.args)
        patients.append({"id": mutant_id, "bug": bug, "path": path, "tests": tests})
    return patients
