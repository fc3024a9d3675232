"""The bug clinic of chapter 11: a compact from-scratch Transformer, its classic bugs, and the
tests that find them.

The model here is written in the usual from-scratch style: short classes
(:class:`PositionalEncoding`, :class:`MultiHeadAttention`, :class:`FeedForward`,
:class:`EncoderLayer`, :class:`DecoderLayer`, :class:`Encoder`, :class:`Decoder`,
:class:`Transformer`), Post-LN as in the paper, sinusoidal positions, no input checks inside
``forward`` (a bug must show its true symptom, not a friendly error). The correct version
computes exactly what :class:`companion.model.Transformer` computes: its parameters carry the
same names, so :func:`reference_model` copies them into the package's model and
:func:`parity` compares the two outputs.

Each bug of the chapter is a small subclass that overrides one method (or a function next to
its fixed twin), so that ``inspect.getsource`` shows the bug beside the fix. :data:`BUGS` lists
them with the symptom each produces and the test that catches it:

* **ward 1** (bugs 1-10): bugs planted in the model, found with the tests of the toolkit:
  :func:`parity` (after copying weights) and :func:`gradient_parity` (the same for one
  backward pass), :func:`causal_leak`,
  :func:`is_permutation_equivariant`, ``count_parameters``, :func:`overfit_one_batch`;
* **ward 2** (bugs 11-18): short, self-contained cases (attention functions, a layer, an
  embedding) with their own one-line tests.

The toy task is :func:`toy_batch`: reverse 12 symbols, vocabulary 11 (the four special tokens
of :mod:`companion.data.vocab` and 7 symbols).

**Any model.** The diagnostics of :mod:`companion.clinic.toolkit` (second half) work on any
``nn.Module`` through an adapter from token ids to logits (:func:`as_logits_fn`) and return a
:class:`Finding` (``PASS``/``FAIL``, one line with the numbers): :func:`causal_leak_check`
(vocabulary-agnostic) and :func:`causal_leak_gradient`, :func:`permutation_equivariance`,
:func:`batch_independence`, :func:`padding_invariance`, :func:`initial_loss_check`,
:func:`overfit_check`, :func:`registration_check`, :func:`deterministic_check`,
:func:`loss_padding_check`, :func:`label_shift_check`, and :func:`parity_with_torch` (a
``state_dict`` key map onto ``torch.nn.Transformer``; :func:`clinic_key_map`). Their
patients: :class:`ReaderTransformer`, a reader's plain-PyTorch model on the padded,
variable-length task :func:`padded_batch`, with the common bugs of :data:`CONDITIONS`
(:func:`admit` builds a :class:`Patient`, :func:`examine` runs the diagnostics). The exercise:
:func:`mystery` plants an unnamed bug, :func:`check_diagnosis` checks its name. More
patients: the bug museum, :func:`museum_patients` (``tests/mutants/catalogue.py``).

Every public name is importable from here (``from companion import clinic``; ``clinic.build``);
the files, in reading order:

- :mod:`companion.clinic.patient`: the model, from-scratch style (correct), and the toy task's ids;
  the reader's model, the padded task and :class:`Patient`.
- :mod:`companion.clinic.toolkit`: the toy task and the tests that examine the model; the
  diagnostics for any model.
- :mod:`companion.clinic.ward1`: bugs 1-10, each overriding one method of the correct class;
  the common bugs of the reader's model.
- :mod:`companion.clinic.ward2`: bugs 11-18, a few lines of buggy code beside the fix.
- :mod:`companion.clinic.registry`: :data:`BUGS` and :func:`build`; :data:`CONDITIONS`,
  :func:`admit`, :func:`mystery`, :func:`check_diagnosis`, :func:`museum_patients`.
"""

from __future__ import annotations

from companion.clinic import patient, registry, toolkit, ward1, ward2
from companion.clinic.patient import *  # noqa: F403  (each file's __all__ is the package's)
from companion.clinic.patient import TokenEmbedding as TokenEmbedding  # public, not in __all__
from companion.clinic.registry import *  # noqa: F403
from companion.clinic.toolkit import *  # noqa: F403
from companion.clinic.ward1 import *  # noqa: F403
from companion.clinic.ward2 import *  # noqa: F403

__all__ = [*patient.__all__, *toolkit.__all__, *ward1.__all__, *ward2.__all__, *registry.__all__]
