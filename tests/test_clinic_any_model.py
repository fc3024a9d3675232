"""The bug clinic's diagnostics for any model (chapter 11): every diagnostic passes on the
healthy models and fails on the bug it is meant to catch; the adapter, the parity with
torch.nn.Transformer, the mystery patient and the bad-input errors."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import types

import pytest
import torch

from companion import clinic
from companion.clinic import ward1
from companion.clinic.registry import _condition_of

PAD = clinic.PAD_ID


@pytest.fixture(scope="module")
def padded():
    """A padded batch of the reader's task: src (8, src_len), tgt_in and labels (8, tgt_len)."""
    src, tgt = clinic.padded_batch(8, torch.Generator().manual_seed(0))
    tgt_in, labels = clinic.teacher_forcing(tgt)
    return src, tgt_in, labels


def reader(cls=clinic.ReaderTransformer, **kwargs):
    torch.manual_seed(0)
    return cls(**kwargs)


def reader_map(num_layers=2, d_model=32):
    names = clinic.clinic_key_map(
        num_layers, encoder_prefix="encoder_layers", decoder_prefix="decoder_layers",
        src_embedding="embed.weight", tgt_embedding="embed.weight",
        generator_weight="embed.weight", generator_bias=None,
    )  # fmt: skip
    return lambda state: {
        **clinic.apply_key_map(state, names),
        "generator.weight": state["embed.weight"] * d_model**-0.5,  # the tied output's scale
    }


# --------------------------------------------------------------------------------------------
# the padded task
# --------------------------------------------------------------------------------------------


def test_padded_batch_has_variable_lengths_and_the_task():
    src, tgt = clinic.padded_batch(16, torch.Generator().manual_seed(1), vocab_size=20)
    assert src.shape[1] != tgt.shape[1]
    src_lens, tgt_lens = (src != PAD).sum(1), (tgt != PAD).sum(1)
    assert len(set(src_lens.tolist())) > 1 and (src == PAD).any() and (tgt == PAD).any()
    for b in range(16):
        symbols = src[b, : src_lens[b] - 1]
        assert src[b, src_lens[b] - 1] == clinic.EOS_ID
        assert tgt[b, 0] == clinic.BOS_ID and tgt[b, tgt_lens[b] - 1] == clinic.EOS_ID
        assert torch.equal(tgt[b, 1 : tgt_lens[b] - 1], symbols[0::2].flip(0))
        assert ((symbols >= 4) & (symbols < 20)).all()
    tgt_in, labels = clinic.teacher_forcing(tgt)
    assert torch.equal(tgt_in[:, 1:], labels[:, :-1])


# --------------------------------------------------------------------------------------------
# each diagnostic: passes on the healthy model, fails on its bug
# --------------------------------------------------------------------------------------------


def test_healthy_reader_passes_every_diagnostic():
    findings = clinic.examine(clinic.admit(None))
    assert all(findings), "\n".join(map(str, findings))
    assert {f.test for f in findings} >= {
        "causal leak",
        "batch independence",
        "labels shifted",
    }


@pytest.mark.parametrize("condition", list(clinic.CONDITIONS))
def test_each_condition_fails_its_diagnostic(condition):
    """The diagnostic named by the registry fails on the bug and passes on the healthy model."""
    catcher = clinic.CONDITIONS[condition].caught_by
    test_names = {
        "causal_leak_check": "causal leak",
        "batch_independence": "batch independence",
        "padding_invariance": "padding invariance",
        "initial_loss_check": "loss at initialisation",
        "registration_check": "registration",
        "deterministic_check": "deterministic evaluation",
        "loss_padding_check": "loss ignores padding",
        "label_shift_check": "labels shifted",
    }
    sick = {f.test: f for f in clinic.examine(clinic.admit(condition))}
    healthy = {f.test: f for f in clinic.examine(clinic.admit(None))}
    assert not sick[test_names[catcher]], str(sick[test_names[catcher]])
    assert healthy[test_names[catcher]], str(healthy[test_names[catcher]])


def test_causal_leak_check_is_vocabulary_agnostic(padded):
    src, tgt_in, _ = padded
    fn = clinic.as_logits_fn(reader())
    healthy = clinic.causal_leak_check(fn, (src[:2], tgt_in[:2]), pad_id=PAD)
    assert healthy and torch.equal(
        healthy.details["dependence"], torch.tril(torch.ones(6, 6, dtype=torch.bool))
    )
    leaky = clinic.causal_leak_check(
        clinic.as_logits_fn(reader(attention=clinic.SoftmaxOverQueries)), (src[:2], tgt_in[:2]),
        pad_id=PAD,
    )  # fmt: skip
    assert not leaky and leaky.details["dependence"].triu(1).any()
    assert str(leaky).startswith("FAIL  causal leak:")
    # the clinic's own bug 6 through the generic check, and the legacy matrix of another size
    toy_src, toy_in, _ = clinic.toy_batch(1, torch.Generator().manual_seed(1))
    off_by_one = clinic.as_logits_fn(clinic.build(6))
    assert not clinic.causal_leak_check(off_by_one, (toy_src, toy_in), vocab_size=11, pad_id=PAD)
    wide = clinic.Transformer(vocab_size=40)  # ids above the clinic's 11 reach it too
    seen = clinic.causal_leak(wide, toy_src, toy_in)
    assert torch.equal(seen, torch.tril(torch.ones(13, 13, dtype=torch.bool)))


def test_causal_leak_gradient_sees_what_the_perturbation_sees(padded):
    src, tgt_in, _ = padded
    healthy, sick = reader(), reader(attention=clinic.SoftmaxOverQueries)
    assert clinic.causal_leak_gradient(healthy, (src, tgt_in), healthy.embed)
    finding = clinic.causal_leak_gradient(sick, (src, tgt_in), sick.embed)
    upper = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert not finding and finding.details["dependence"][upper].all()  # every later token
    toy_src, toy_in, _ = clinic.toy_batch(2, torch.Generator().manual_seed(0))
    for bug, leaks in ((None, False), (1, True), (6, True)):
        model = clinic.build(bug)
        found = clinic.causal_leak_gradient(model, (toy_src, toy_in), model.tgt_embedding)
        assert found.passed != leaks, (bug, str(found))
    off_by_one = clinic.build(6)
    gradient = clinic.causal_leak_gradient(off_by_one, (toy_src, toy_in), off_by_one.tgt_embedding)
    perturbed = clinic.causal_leak(off_by_one, toy_src, toy_in)
    assert torch.equal(gradient.details["dependence"], perturbed)  # the same leak, two ways
    with pytest.raises(ValueError, match=r"embedding was never called on inputs\[-1\]"):
        clinic.causal_leak_gradient(off_by_one, (toy_src, toy_in), off_by_one.src_embedding)


def test_causal_leak_check_works_on_a_decoder_only_adapter():
    """A decoder-only logits function (ids → logits): a causal cumulative mean passes, a
    reversed one fails."""
    table = torch.randn(9, 5, generator=torch.Generator().manual_seed(0))

    def causal(ids):  # (batch, seq) → (batch, seq, 5): mean of the embeddings so far
        x = table[ids]
        return x.cumsum(1) / torch.arange(1, ids.shape[1] + 1)[None, :, None]

    def anti(ids):
        return causal(ids.flip(1)).flip(1)

    ids = torch.randint(1, 9, (2, 7), generator=torch.Generator().manual_seed(1))
    assert clinic.causal_leak_check(causal, ids, vocab_size=9, pad_id=0)
    assert not clinic.causal_leak_check(anti, ids, vocab_size=9, pad_id=0)


def test_permutation_equivariance():
    good = clinic.MultiHeadAttention(32, 4)
    bad = clinic.ViewWithoutTranspose(32, 4)
    bad.load_state_dict(good.state_dict())
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(0))
    assert clinic.permutation_equivariance(lambda t: good(t, t, t), x)
    finding = clinic.permutation_equivariance(lambda t: bad(t, t, t), x)
    assert not finding and finding.details["gap"] > 1e-3
    assert not clinic.permutation_equivariance(lambda t: t.cumsum(1), x)


def test_batch_independence_catches_the_seq_first_positions(padded):
    src, tgt_in, _ = padded
    assert clinic.batch_independence(clinic.as_logits_fn(reader()), (src, tgt_in))
    finding = clinic.batch_independence(
        clinic.as_logits_fn(reader(clinic.SeqFirstPositions)), (src, tgt_in)
    )
    assert not finding and finding.details["largest"] > 1e-3

    def mixes_rows(ids):  # attention over the batch axis: row b reads the mean of all rows
        x = torch.nn.functional.one_hot(ids, 16).float()
        return x + x.mean(0, keepdim=True)

    assert not clinic.batch_independence(mixes_rows, src)


def test_padding_invariance_catches_the_query_axis_mask(padded):
    src, tgt_in, _ = padded
    assert clinic.padding_invariance(clinic.as_logits_fn(reader()), (src, tgt_in), pad_id=PAD)
    finding = clinic.padding_invariance(
        clinic.as_logits_fn(reader(clinic.QueryAxisPaddingMask)), (src, tgt_in), pad_id=PAD
    )
    assert not finding and finding.details["gap"] > 1e-4
    torch.manual_seed(0)
    unmasked = clinic.PaddingIdxEncoder(16, 16, 2)  # ward 2's bug 11 through the generic check
    masked = clinic.MaskedPaddingEncoder(16, 16, 2)
    masked.load_state_dict(unmasked.state_dict())
    assert not clinic.padding_invariance(lambda ids: unmasked(ids), src, pad_id=PAD)
    assert clinic.padding_invariance(lambda ids: masked(ids), src, pad_id=PAD)


def _causal_decoder_only(padding_mask: bool, positions_skip_pads: bool = True):
    """A two-layer causal decoder-only logits function, ids (batch, seq_len) -> (batch, seq_len,
    16), with or without a key padding mask; positions count real tokens only unless told."""
    g = torch.Generator().manual_seed(0)
    emb, pos_table, unembed = (
        torch.randn(*s, generator=g) / 4 for s in ((16, 8), (20, 8), (8, 16))
    )

    def logits(ids: torch.Tensor) -> torch.Tensor:
        real = ids != PAD  # (batch, seq_len)
        if positions_skip_pads:
            positions = (real.cumsum(1) - 1).clamp(min=0)  # (batch, seq_len)
        else:
            positions = torch.arange(ids.shape[1]).expand_as(ids)  # (batch, seq_len)
        x = emb[ids] + pos_table[positions]  # (batch, seq_len, 8)
        allowed = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()  # causal
        allowed = allowed & real[:, None, :] if padding_mask else allowed.expand(len(ids), -1, -1)
        for _ in range(2):
            scores = (x @ x.transpose(1, 2) / 8**0.5).masked_fill(~allowed, -1e9)
            x = x + torch.softmax(scores, dim=-1) @ x  # (batch, seq_len, 8)
        return x @ unembed  # (batch, seq_len, 16)

    return logits


def test_padding_invariance_needs_left_pads_on_a_causal_decoder_only_model():
    """Appended pads sit after every real token, where the causal mask hides them: the right-side
    test passes a model with no padding mask at all. Prepended pads catch it, and catch positions
    that count the pads, while a correct model passes both sides."""
    ids = torch.randint(4, 16, (4, 6), generator=torch.Generator().manual_seed(1))  # no pads
    verdicts = {
        (mask, side): bool(
            clinic.padding_invariance(_causal_decoder_only(mask), ids, pad_id=PAD, side=side)
        )
        for mask in (False, True)
        for side in ("right", "left")
    }
    assert verdicts == {
        (False, "right"): True,  # the blind spot the docstring names
        (False, "left"): False,
        (True, "right"): True,
        (True, "left"): True,
    }, verdicts
    shifted = _causal_decoder_only(True, positions_skip_pads=False)
    assert not clinic.padding_invariance(shifted, ids, pad_id=PAD, side="left")
    with pytest.raises(ValueError, match="side"):
        clinic.padding_invariance(_causal_decoder_only(True), ids, pad_id=PAD, side="both")


def test_initial_loss_catches_the_unscaled_tied_output(padded):
    src, tgt_in, labels = padded
    healthy = clinic.initial_loss_check(
        clinic.as_logits_fn(reader()), (src, tgt_in), labels, pad_id=PAD
    )
    assert healthy and abs(healthy.details["loss"] - math.log(16)) < 0.3
    sick = clinic.initial_loss_check(
        clinic.as_logits_fn(reader(clinic.UnscaledTiedOutput)), (src, tgt_in), labels, pad_id=PAD
    )
    assert not sick and sick.details["loss"] > math.log(16) + 0.5


def test_overfit_check_catches_the_double_softmax():
    src, tgt_in, tgt_out = clinic.toy_batch(16, torch.Generator().manual_seed(0))
    healthy = clinic.overfit_check(clinic.build(), (src, tgt_in), tgt_out, pad_id=PAD)
    stalled = clinic.overfit_check(clinic.build(5), (src, tgt_in), tgt_out, pad_id=PAD)
    assert healthy and healthy.details["losses"][-1] < 0.05
    assert not stalled and stalled.details["losses"][-1] > math.log(1 + 10 / math.e)


def test_registration_check_catches_layers_in_a_list():
    healthy, sick = reader(), reader(clinic.LayersInAList)
    assert clinic.registration_check(healthy)
    finding = clinic.registration_check(sick)
    assert not finding and finding.details["hidden"][0].startswith("encoder_layers[0]")
    hidden = sum(p.numel() for p in healthy.parameters()) - sum(
        p.numel() for p in sick.parameters()
    )
    assert finding.details["hidden_parameters"] == hidden > 0
    assert not any(key.startswith("encoder_layers") for key in sick.state_dict())
    sick.double()  # .to() does not reach the list
    assert sick.encoder_layers[0].feed_forward.hidden_proj.weight.dtype == torch.float32


def test_deterministic_check_catches_a_missing_eval(padded):
    src, tgt_in, _ = padded
    model = reader()
    assert clinic.deterministic_check(clinic.logits_in_eval(model), (src, tgt_in))
    model.train()
    assert not clinic.deterministic_check(clinic.logits_without_eval(model), (src, tgt_in))


def test_loss_padding_check(padded):
    src, tgt_in, labels = padded
    logits = clinic.as_logits_fn(reader())(src, tgt_in)
    assert clinic.loss_padding_check(clinic.sequence_loss, logits, labels, pad_id=PAD)
    finding = clinic.loss_padding_check(clinic.loss_over_padding, logits, labels, pad_id=PAD)
    assert not finding and min(finding.details["gaps"].values()) > 1e-3

    def summed_over_real(logits, labels):  # ignores the pads but sums: passes (a) and (b)
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=PAD, reduction="sum"
        )

    assert clinic.loss_padding_check(summed_over_real, logits, labels, pad_id=PAD)


def test_label_shift_check(padded):
    _, tgt_in, labels = padded
    assert clinic.label_shift_check(tgt_in, labels, pad_id=PAD)
    _, tgt = clinic.padded_batch(8, torch.Generator().manual_seed(0))
    same_in, same_labels = clinic.unshifted_labels(tgt)
    finding = clinic.label_shift_check(same_in, same_labels, pad_id=PAD)
    assert not finding and finding.details["same"] == 1.0


# --------------------------------------------------------------------------------------------
# parity with torch.nn.Transformer after mapping the state_dict
# --------------------------------------------------------------------------------------------


def test_parity_with_torch_on_the_clinic_and_the_reader(padded):
    src, tgt_in, _ = padded
    toy_src, toy_in, _ = clinic.toy_batch(4, torch.Generator().manual_seed(0))
    key_map = clinic.clinic_key_map(2)
    assert clinic.parity_with_torch(clinic.build(), key_map, toy_src, toy_in, num_heads=4,
                                    pad_id=PAD)  # fmt: skip
    for bug in (2, 4, 7, 8):  # the ward-1 bugs parity catches
        finding = clinic.parity_with_torch(
            clinic.build(bug), key_map, toy_src, toy_in, num_heads=4, pad_id=PAD
        )
        assert not finding and finding.details["gap"] > 1e-3, bug
    healthy = clinic.parity_with_torch(reader(), reader_map(), src, tgt_in, num_heads=4, pad_id=PAD)
    assert healthy and healthy.details["gap"] < 1e-5
    for cls in (clinic.SeqFirstPositions, clinic.QueryAxisPaddingMask, clinic.UnscaledTiedOutput):
        assert not clinic.parity_with_torch(
            reader(cls), reader_map(), src, tgt_in, num_heads=4, pad_id=PAD
        ), cls.__name__


def test_parity_with_torch_lists_what_does_not_fit():
    toy_src, toy_in, _ = clinic.toy_batch(2, torch.Generator().manual_seed(0))
    key_map = clinic.clinic_key_map(2)
    del key_map["transformer.decoder.layers.1.norm3.weight"]
    key_map["transformer.extra.weight"] = "generator.bias"
    with pytest.raises(ValueError) as error:
        clinic.parity_with_torch(clinic.build(), key_map, toy_src, toy_in, num_heads=4)
    message = str(error.value)
    assert (
        "reference keys with no weight mapped: transformer.decoder.layers.1.norm3.weight" in message
    )
    assert "mapped keys the reference does not have: transformer.extra.weight" in message
    assert "decoder.layers.1.feed_forward_norm.weight" in message  # the model key left unused
    swapped = clinic.clinic_key_map(2)
    swapped["transformer.encoder.layers.0.linear1.weight"] = (
        "encoder.layers.0.feed_forward.output_proj.weight"
    )
    with pytest.raises(
        ValueError, match=r"shape mismatches: transformer\.encoder\.layers\.0\.linear1"
    ):
        clinic.parity_with_torch(clinic.build(), swapped, toy_src, toy_in, num_heads=4)
    with pytest.raises(ValueError, match="does not have: no.such.key"):
        clinic.parity_with_torch(clinic.build(), {"src_embedding.weight": "no.such.key"},
                                 toy_src, toy_in, num_heads=4)  # fmt: skip
    with pytest.raises(TypeError, match="key_map must be a dict"):
        clinic.parity_with_torch(clinic.build(), ["a"], toy_src, toy_in, num_heads=4)


# --------------------------------------------------------------------------------------------
# the mystery patient
# --------------------------------------------------------------------------------------------


def test_mystery_is_deterministic_and_covers_the_pool():
    first, again = clinic.mystery(3), clinic.mystery(3)
    truth = _condition_of(first)
    assert truth == _condition_of(again)
    assert all(
        torch.equal(a, b) for a, b in zip(first.model.parameters(), again.model.parameters())
    )
    assert "mystery patient 3" in repr(first) and truth not in repr(first)
    assert {_condition_of(clinic.mystery(seed)) for seed in range(40)} == set(clinic.CONDITIONS)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 6, 7, 9, 17])  # one of each condition
def test_a_mystery_patient_does_not_name_its_bug(seed):
    """Neither its repr, nor its model's printout and class, nor its functions' names tell
    the bug; its findings are those of the same patient admitted by name."""
    patient = clinic.mystery(seed)
    condition = clinic.CONDITIONS[_condition_of(patient)]
    telling = {condition.buggy.__name__.lower(), condition.name.lower()}
    functions = (patient.logits, patient.loss, patient.shift)
    shown = " ".join([repr(patient), str(patient.model), type(patient.model).__name__,
                      *(f.__qualname__ for f in functions)]).lower()  # fmt: skip
    assert not [word for word in telling if word in shown], shown[:300]
    findings = {f.test: f.passed for f in clinic.examine(patient)}
    named = {f.test: f.passed for f in clinic.examine(clinic.admit(condition.name, seed))}
    assert findings == named  # the disguise changes no behaviour


#: the names of ward 1's bug classes and functions: none may show on a mystery patient
BUG_NAMES = {
    name.lower()
    for name, value in vars(ward1).items()
    if getattr(value, "__module__", None) == ward1.__name__
}


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 6, 7, 9, 17])  # one of each condition
def test_no_attribute_of_a_mystery_patient_reveals_its_bug(seed):
    """Exercise 6's answer is not in the patient: no attribute holds the condition, and no
    class in its model's modules' __mro__, no method and no function of the patient carries a
    bug's name or source."""
    patient = clinic.mystery(seed)
    truth = _condition_of(patient)
    assert truth not in [str(value) for value in vars(patient).values()]
    assert not [key for key in vars(patient) if "condition" in key or "truth" in key]
    names = []
    for module in patient.model.modules():
        for cls in type(module).__mro__:
            names += [cls.__name__, cls.__qualname__, cls.__doc__ or ""]
            names += [f"{value.__qualname__} {value.__doc__ or ''}" for value in vars(cls).values()
                      if isinstance(value, types.FunctionType)]  # fmt: skip
    for function in (patient.logits, patient.loss, patient.shift):
        names += [function.__name__, function.__qualname__, function.__doc__ or ""]
        names += [
            getattr(cell.cell_contents, "__qualname__", "") for cell in function.__closure__ or ()
        ]
        with pytest.raises((OSError, TypeError)):
            inspect.getsource(function)  # the source is not reachable either
    shown = " ".join(names).lower()
    assert not [
        name for name in BUG_NAMES | {truth.lower()} if re.search(rf"\b{re.escape(name)}\b", shown)
    ]
    assert "# bug" not in shown and "bug:" not in shown


def test_check_diagnosis_refuses_a_patient_of_unknown_origin():
    made = clinic.admit(None)
    stranger = clinic.Patient(made.model, made.logits, made.loss, made.shift, made.vocab_size)
    with pytest.raises(ValueError, match="clinic.admit or clinic.mystery"):
        clinic.check_diagnosis(stranger, "healthy")


def test_check_diagnosis_accepts_names_and_synonyms_and_rejects_others(capsys):
    for name, condition in clinic.CONDITIONS.items():
        patient = clinic.admit(name)
        assert clinic.check_diagnosis(patient, name.upper(), verbose=False)
        for synonym in condition.synonyms:  # a stem* as the stem, a + b as "a and b"
            said = synonym.replace("*", "").replace(" + ", " and ")
            assert clinic.check_diagnosis(patient, f"I think: {said}!", verbose=False), synonym
        others = [other for other in clinic.CONDITIONS if other != name]
        assert not any(clinic.check_diagnosis(patient, other, verbose=False) for other in others)
    patient = clinic.admit("model.eval() forgotten")
    assert clinic.check_diagnosis(patient, "forgot to call model.eval()")
    assert "Right" in capsys.readouterr().out
    assert not clinic.check_diagnosis(patient, "layers in a plain list")
    out = capsys.readouterr().out
    assert "Not layers in a plain list" in out and "deterministic_check" in out
    assert not clinic.check_diagnosis(patient, "a cosmic ray")
    assert "names none" in capsys.readouterr().out
    assert not clinic.check_diagnosis(patient, "dropout, or the layers in a list")
    assert "Not layers in a plain list" in capsys.readouterr().out
    assert not clinic.check_diagnosis(patient, "dropout")  # a symptom of two patients
    assert "symptom" in capsys.readouterr().out
    assert not clinic.check_diagnosis(
        patient, "model.eval() forgotten and padding counted in the loss"
    )
    assert "several" in capsys.readouterr().out
    assert clinic.check_diagnosis(clinic.admit(None), "healthy", verbose=False)
    assert not clinic.check_diagnosis(clinic.admit(None), "unshifted labels", verbose=False)


def test_museum_patients_are_the_catalogue():
    from mutants.catalogue import MUTANTS

    patients = clinic.museum_patients()
    assert [p["id"] for p in patients] == [m.id for m in MUTANTS]
    assert patients[-1]["tests"] == list(MUTANTS[-1].tests)
    with pytest.raises(FileNotFoundError, match="the bug museum is not at"):
        clinic.museum_patients("/nonexistent")


# --------------------------------------------------------------------------------------------
# bad input and the result object
# --------------------------------------------------------------------------------------------


def test_finding_reads_well():
    finding = clinic.Finding("x", False, "one line", {"gap": 1.0})
    assert str(finding) == "FAIL  x: one line" and repr(finding) == "Finding(FAIL  x: one line)"
    assert not finding and clinic.Finding("x", True, "ok")


def test_diagnostics_reject_bad_input(padded):
    src, tgt_in, labels = padded
    fn = clinic.as_logits_fn(reader())
    with pytest.raises(TypeError, match="fn must be a logits function"):
        clinic.causal_leak_check("model", src)
    with pytest.raises(TypeError, match="inputs must be a"):
        clinic.causal_leak_check(fn, "ids")
    with pytest.raises(TypeError, match=r"inputs\[0\] must be an integer tensor"):
        clinic.causal_leak_check(fn, (src.float(), tgt_in))
    with pytest.raises(ValueError, match=r"inputs\[1\] has shape \(2, 6\)"):
        clinic.batch_independence(fn, (src, tgt_in[:2]))
    with pytest.raises(ValueError, match="batch of at least 2"):
        clinic.batch_independence(fn, (src[:1], tgt_in[:1]))
    with pytest.raises(ValueError, match="one position per token"):
        clinic.causal_leak_check(fn, (src, tgt_in), vary=0)
    with pytest.raises(ValueError, match="vary must index one of the 2"):
        clinic.padding_invariance(fn, (src, tgt_in), pad_id=PAD, vary=2)
    with pytest.raises(ValueError, match=r"pad_id must be in 0 … 15"):
        clinic.padding_invariance(fn, (src, tgt_in), pad_id=16)
    with pytest.raises(ValueError, match=r"labels must have shape \(8, 6\)"):
        clinic.initial_loss_check(fn, (src, tgt_in), labels[:, :3])
    with pytest.raises(ValueError, match=r"output must have shape \(batch, seq, vocab\)"):
        clinic.causal_leak_check(lambda s, t: fn(s, t)[..., 0], (src, tgt_in))
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq, d\)"):
        clinic.permutation_equivariance(lambda t: t, torch.randn(3, 4))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        clinic.registration_check(object())
    with pytest.raises(ValueError, match="no position that is not pad_id"):
        clinic.label_shift_check(labels, torch.zeros_like(labels), pad_id=PAD)
    with pytest.raises(ValueError, match="condition must be None or one of"):
        clinic.admit("gremlins")
    with pytest.raises(TypeError, match="answer must be a str"):
        clinic.check_diagnosis(clinic.admit(None), 3)
    with pytest.raises(TypeError, match="seed must be an int"):
        clinic.mystery("3")
    with pytest.raises(ValueError, match=r"tgt must be a \(batch, tgt_len\) tensor"):
        clinic.teacher_forcing(torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="encoder_prefix must be a str"):
        clinic.clinic_key_map(2, encoder_prefix=None)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        clinic.logits_in_eval("model")


def _fairseq_patient(model, ignore_index=1):
    """A patient in fairseq's/BART's special ids: <s> = 0, <pad> = 1, </s> = 2."""

    def loss(logits, labels):
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=ignore_index
        )

    return clinic.Patient(model, clinic.as_logits_fn(model), loss, clinic.teacher_forcing,
                          vocab_size=16, pad_id=1, bos_id=0, eos_id=2)  # fmt: skip


def test_patient_batch_uses_the_patients_special_ids():
    patient = _fairseq_patient(reader(pad_id=1))
    src, tgt_in, labels = patient.batch(8)
    assert (tgt_in[:, 0] == 0).all()  # <bos> = 0
    assert (src == 1).any() and (labels == 1).any()  # pads on both sides, id 1
    assert not (src == 0).any() and (src == 2).sum() == 8  # no <s> in a source, one </s> each
    default_src, _ = clinic.padded_batch(8, torch.Generator().manual_seed(0))
    assert torch.equal(src == 1, default_src == PAD)  # the same lengths as the default ids
    with pytest.raises(ValueError, match="must differ"):
        clinic.padded_batch(2, torch.Generator(), pad_id=1, bos_id=1)


def test_examine_passes_a_healthy_model_with_pad_id_1_and_catches_a_bug():
    healthy = clinic.examine(_fairseq_patient(reader(pad_id=1)))
    assert all(healthy), [str(f) for f in healthy if not f]
    pads = next(f for f in healthy if f.test == "loss ignores padding")
    assert "(0 pad labels" not in str(pads) and "(13 pad labels" in str(pads)  # not vacuous
    wrong_loss = clinic.examine(_fairseq_patient(reader(pad_id=1), ignore_index=0))
    assert [f.test for f in wrong_loss if not f] == ["loss ignores padding"]
    unmasked = reader(pad_id=0)  # masks id 0, not the patient's pad id 1
    failed = [f.test for f in clinic.examine(_fairseq_patient(unmasked)) if not f]
    assert "padding invariance" in failed


def _decoder_only_patient(positional: str, pad_id: int | None, shift=clinic.teacher_forcing):
    """The course's DecoderOnlyTransformer (chapter 10), never trained, dropout 0.1, as a
    one-input patient; ``pad_id=None`` leaves its pads unmasked."""
    from companion.families import DecoderOnlyTransformer
    from companion.model import TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(
        tgt_vocab=16, d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.1,
        tgt_pad_id=pad_id, positional=positional,
    )  # fmt: skip
    model = DecoderOnlyTransformer(config)
    return clinic.Patient(
        model=model,
        logits=clinic.as_logits_fn(model),
        loss=clinic.sequence_loss,
        shift=shift,
        vocab_size=16,
    )


def test_examine_decoder_only_passes_a_healthy_model_and_names_each_failure():
    """decoder_only=True: one input (<bos>, symbols, <eos>, pads), the pads prepended. A RoPE
    model with its pads masked passes; without the mask, or with positions that count the pads
    (sinusoidal), prepended pads fail; unshifted labels fail 'labels shifted'."""
    healthy = clinic.examine(_decoder_only_patient("rope", PAD), decoder_only=True)
    assert all(healthy), [str(f) for f in healthy if not f]
    assert [f.test for f in healthy] == [f.test for f in clinic.examine(clinic.admit(None))]
    assert "pads before" in str(healthy[4])
    unmasked = clinic.examine(_decoder_only_patient("rope", None), decoder_only=True)
    assert [f.test for f in unmasked if not f] == ["padding invariance"]
    counted = clinic.examine(_decoder_only_patient("sinusoidal", PAD), decoder_only=True)
    assert "padding invariance" in [f.test for f in counted if not f]
    unshifted = clinic.examine(
        _decoder_only_patient("rope", PAD, shift=lambda seq: (seq, seq)), decoder_only=True
    )
    assert "labels shifted" in [f.test for f in unshifted if not f]


def test_examine_decoder_only_catches_a_leak_and_wants_a_bool():
    """A decoder-only model that reads the whole sequence fails the causal leak check; the
    encoder-decoder call on a one-input adapter is not silently accepted either."""
    patient = _decoder_only_patient("rope", PAD)
    inner = patient.logits

    def leaky(ids):  # each position also reads the sequence's last token
        return inner(ids) + inner(ids.flip(1)).flip(1)[:, -1:]

    leak = clinic.examine(dataclasses.replace(patient, logits=leaky), decoder_only=True)
    assert not next(f for f in leak if f.test == "causal leak")
    with pytest.raises(TypeError, match="decoder_only"):
        clinic.examine(patient, decoder_only="yes")
    with pytest.raises(TypeError):
        clinic.examine(patient)  # two inputs to a one-input model
