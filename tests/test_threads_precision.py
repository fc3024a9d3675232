"""The thread policy (companion.utils.set_threads), mixed precision in a training step
(companion.train.autocast_dtype, grad_scaler, train_step's amp_dtype/scaler), the time
estimate of a run (companion.run.estimate_training_time) and the progress bar's plan."""

from __future__ import annotations

import sys

import pytest
import torch

from companion import utils
from companion.configs import PRECISIONS, get_config
from companion.model import Transformer, TransformerConfig
from companion.train import autocast_dtype, grad_scaler, train_step
from companion.utils import ThreadChoice, busy_cores, set_threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------- the thread policy


def test_set_threads_uses_the_cores_other_work_leaves_free(restore_threads, monkeypatch):
    monkeypatch.delenv("COMPANION_THREADS", raising=False)
    monkeypatch.setattr(utils, "TORCH_DEFAULT_THREADS", 4)
    monkeypatch.setattr(utils.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    for busy, expected in [(0.0, 4), (0.4, 3), (1.0, 3), (1.8, 2), (3.0, 1), (4.0, 1)]:
        monkeypatch.setattr(utils, "busy_cores", lambda interval, busy=busy: busy)
        choice = set_threads()
        assert choice.threads == expected == torch.get_num_threads(), (busy, choice)
        assert choice.cores == 4 and choice.busy == busy and "busy with other work" in str(choice)
    monkeypatch.setattr(utils, "busy_cores", lambda interval: 0.0)
    assert set_threads(limit=2).threads == 2
    assert set_threads(limit=1).threads == 1  # small tensors: no measurement needed
    monkeypatch.setattr(utils, "busy_cores", lambda interval: None)  # macOS, Windows
    choice = set_threads()
    assert choice.threads == 4 and "default" in choice.reason


def test_set_threads_obeys_companion_threads(restore_threads, monkeypatch):
    monkeypatch.setenv("COMPANION_THREADS", "3")
    choice = set_threads(limit=1)
    assert (choice.threads, torch.get_num_threads()) == (3, 3)
    assert str(choice).startswith("torch uses 3 of") and "COMPANION_THREADS" in str(choice)
    monkeypatch.setenv("COMPANION_THREADS", "two")
    with pytest.raises(ValueError, match="COMPANION_THREADS must be a positive integer, got 'two'"):
        set_threads()


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "2"])
def test_set_threads_refuses_a_bad_limit(limit, monkeypatch):
    monkeypatch.delenv("COMPANION_THREADS", raising=False)
    with pytest.raises(ValueError, match=r"limit must be a positive int or None, got"):
        set_threads(limit)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/stat")
def test_busy_cores_measures_other_work():
    busy = busy_cores(0.05)
    assert isinstance(busy, float) and 0.0 <= busy <= len(utils.os.sched_getaffinity(0)) + 0.01
    with pytest.raises(ValueError, match="interval must be a positive number of seconds, got 0"):
        busy_cores(0)


def test_thread_choice_says_what_it_chose():
    choice = ThreadChoice(
        threads=1, cores=2, busy=1.0, reason="1.0 of the cores busy with other work"
    )
    assert str(choice) == "torch uses 1 of 2 threads: 1.0 of the cores busy with other work"


# --------------------------------------------------------------------- mixed precision


def test_autocast_dtype_follows_the_precision_and_the_device(monkeypatch):
    assert autocast_dtype("fp32", "cuda") is None and autocast_dtype("auto", "cpu") is None
    assert autocast_dtype("bf16", "cpu") is torch.bfloat16
    assert autocast_dtype("fp16", "cuda:0") is torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # A100, H100, L4
    assert autocast_dtype("auto", "cuda") is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)  # T4, V100
    assert autocast_dtype("auto", torch.device("cuda", 0)) is torch.float16
    with pytest.raises(ValueError, match="precision must be one of"):
        autocast_dtype("fp8", "cpu")
    assert grad_scaler(None, "cpu") is None and grad_scaler(torch.bfloat16, "cpu") is None
    assert get_config("gpu").precision == "auto" and get_config("cpu").precision == "fp32"
    assert PRECISIONS == ("fp32", "bf16", "fp16", "auto")
    with pytest.raises(ValueError, match="precision must be one of"):
        get_config("cpu", precision="half")


def _tiny_step_setup():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(9, 9, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0)
    )
    src = torch.randint(3, 9, (4, 5))
    tgt = torch.cat(
        [torch.ones(4, 1, dtype=torch.long), src, 2 * torch.ones(4, 1, dtype=torch.long)], 1
    )
    return model, src, tgt


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_mixed_precision_step_learns_and_keeps_float32_weights(dtype):
    """bf16 and fp16 (with its gradient scaler) autocast on the CPU: the forward runs in the low
    precision, the loss, the gradients and the weights stay float32, and the model learns."""
    model, src, tgt = _tiny_step_setup()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scaler = grad_scaler(dtype, "cpu")
    assert (scaler is None) == (dtype == torch.bfloat16)
    seen = []
    handle = model.generator.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    first = train_step(model, src, tgt, optimizer, amp_dtype=dtype, scaler=scaler)
    handle.remove()
    for _ in range(60):
        last = train_step(model, src, tgt, optimizer, amp_dtype=dtype, scaler=scaler)
    assert seen == [dtype], f"the output layer should run in {dtype}, ran in {seen}"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert last.loss < first.loss / 3, (first.loss, last.loss)


def test_fp16_step_with_an_overflowing_gradient_is_skipped():
    model, src, tgt = _tiny_step_setup()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120)  # scaled gradients overflow fp32
    before = [p.detach().clone() for p in model.parameters()]
    train_step(model, src, tgt, optimizer, amp_dtype=torch.float16, scaler=scaler)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "the step ran"
    assert scaler.get_scale() < 2.0**120  # and the scale came down


def test_train_step_refuses_another_amp_dtype():
    model, src, tgt = _tiny_step_setup()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        ValueError,
        match="amp_dtype must be None, torch.bfloat16 or torch.float16, got torch.float64",
    ):
        train_step(model, src, tgt, optimizer, amp_dtype=torch.float64)


def test_a_bf16_run_trains_and_resumes(tmp_path):
    """The precision is a configuration field: a toy run in bf16 trains, and an fp16 run's
    checkpoint holds its gradient scaler, which a resumed run restores."""
    from companion.run import train

    bf16 = train(get_config("toy", precision="bf16", toy_examples=400), None, max_steps=30,
                 progress=False, evaluate=False)  # fmt: skip
    assert bf16.trainer.amp_dtype is torch.bfloat16 and bf16.trainer.scaler is None
    assert bf16.history.loss[-1] < bf16.history.loss[0]
    config = get_config("toy", precision="fp16", toy_examples=400)
    first = train(config, tmp_path, max_steps=10, progress=False, evaluate=False)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert "scaler" in state and state["scaler"]["scale"] == first.trainer.scaler.get_scale()
    resumed = train(config, tmp_path, max_steps=12, resume=True, progress=False, evaluate=False)
    assert resumed.trainer.step == 12


# --------------------------------------------------------------------- planning a run


def test_estimate_training_time_leaves_the_run_unchanged():
    from companion.run import TimeEstimate, build_model, estimate_training_time, prepare_data

    config = get_config("toy", toy_examples=400, max_steps=50)
    data = prepare_data(config, progress=False)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    estimate = estimate_training_time(config, data, probe_steps=2)
    assert torch.equal(torch.rand(3), expected_next), "the estimate used the random stream"
    assert isinstance(estimate, TimeEstimate) and estimate.steps == 50
    assert estimate.seconds_per_step > 0 and estimate.seconds_per_validation > 0
    per_epoch = len(data.train) // 1  # at most one batch per example
    assert 1 <= estimate.validations <= 50 // 1 + 1 and per_epoch
    assert estimate.total_seconds == pytest.approx(
        50 * estimate.seconds_per_step + estimate.validations * estimate.seconds_per_validation
    )
    assert str(estimate).startswith("about ") and "50 steps" in str(estimate)
    assert estimate_training_time(config, data, 7, probe_steps=1).steps == 7
    with pytest.raises(ValueError, match="steps must be given when the config has no max_steps"):
        estimate_training_time(config.replace(max_steps=None), data)
    with pytest.raises(TypeError, match="data must be the RunData of prepare_data"):
        estimate_training_time(config, [])
    with pytest.raises(ValueError, match="probe_steps must be >= 1, got 0"):
        estimate_training_time(config, data, probe_steps=0)
    assert build_model  # the model of the estimate is a throwaway copy of this one


def test_the_progress_bar_plans_the_steps_of_the_run():
    from companion.run import build_model, prepare_data
    from companion.trainer import Trainer

    config = get_config("toy", toy_examples=400)
    data = prepare_data(config, progress=False)
    model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
    trainer = Trainer(model, config, data.train, data.val, progress=False)
    per_epoch = len(trainer.epoch_batches(0))
    assert trainer._steps_planned(max_steps=7, max_epochs=None) == 7
    assert trainer._steps_planned(max_steps=None, max_epochs=3) == 3 * per_epoch
    assert trainer._steps_planned(max_steps=10_000, max_epochs=2) == 2 * per_epoch
    assert trainer._steps_planned(max_steps=None, max_epochs=None) is None  # a time budget


def test_a_run_trained_in_pieces_equals_one_trained_at_once():
    """benchmarks/translator_runs.py scores a run after 100, 200, ... steps and takes the
    weights for those of runs stopped there: the schedule does not depend on where a run
    stops, and scoring (evaluation mode) draws no random number."""
    from companion.metrics import sequence_accuracy
    from companion.run import build_model, prepare_data, train

    config = get_config("toy", toy_examples=400, dropout=0.1, max_epochs=None, max_steps=25)
    data = prepare_data(config, progress=False)
    at_once = train(config, None, progress=False, evaluate=False).model
    torch.manual_seed(config.seed)  # as train() seeds
    model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
    torch.manual_seed(config.seed + 1)
    from companion.trainer import Trainer

    trainer = Trainer(model, config, data.train, data.val, progress=False)
    for stop in (7, 19, 25):  # across an epoch's end (400 examples: about 8 batches each)
        trainer.fit(max_steps=stop)
        sequence_accuracy(trainer.model, data.val)  # scoring on the way
    for name, value in at_once.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name]), name


def test_the_schedule_without_its_ramp_holds_the_peak_then_decays_the_same():
    from companion.train import inverse_sqrt_warmup

    ramp, flat = inverse_sqrt_warmup(256, 300, 0.5), inverse_sqrt_warmup(256, 300, 0.5, ramp=False)
    assert flat(0) == flat(1) == flat(299) == ramp(300) == pytest.approx(1.8042e-3, rel=1e-4)
    assert all(flat(s) == ramp(s) for s in (300, 301, 1000, 5000))
    assert ramp(1) < ramp(150) < ramp(300)
    with pytest.raises(TypeError, match="ramp must be a bool, got str"):
        inverse_sqrt_warmup(256, 300, ramp="no")
    assert get_config("cpu").warmup and not get_config("cpu", warmup=False).warmup


# --------------------------------------------------------------------- one search, every α


def test_one_beam_search_gives_every_length_penalty_exactly():
    """The search ranks partial translations by log-probability only; α decides only which
    finished hypothesis wins. So rescoring one search's hypotheses equals searching again."""
    from companion.decode import beam_search, best_hypotheses

    torch.manual_seed(3)
    model = Transformer(
        TransformerConfig(14, 14, d_model=16, num_heads=2, num_layers=1, d_ff=32, src_pad_id=0)
    ).eval()
    src = torch.randint(3, 14, (8, 6))
    finished: list = []
    first = beam_search(model, src, beam_size=4, max_len=14, length_penalty_alpha=0.0,
                        hypotheses=finished)  # fmt: skip
    assert len(finished) == 8 and all(len(h) >= 1 for h in finished)
    outputs = {}
    for alpha in (0.0, 0.6, 1.5, 4.0):
        searched = beam_search(model, src, beam_size=4, max_len=14, length_penalty_alpha=alpha)
        rescored = best_hypotheses(finished, alpha)
        assert torch.equal(searched, rescored), alpha
        outputs[alpha] = searched
    assert torch.equal(first, outputs[0.0])
    assert not torch.equal(outputs[0.0], outputs[4.0]), "α should change some choice here"
    with pytest.raises(TypeError, match="hypotheses must be a list"):
        beam_search(model, src, hypotheses=())


def test_the_length_penalty_sweep_searches_once_and_equals_separate_translators(monkeypatch):
    import companion.metrics as metrics
    from companion.data import Vocab, WordTokenizer

    torch.manual_seed(0)
    words = ["ein", "mann", "hund", "läuft", "a", "man", "dog", "runs", "."]
    vocab = Vocab.build([words], min_freq=1)
    model = Transformer(
        TransformerConfig(
            len(vocab),
            len(vocab),
            d_model=16,
            num_heads=2,
            num_layers=1,
            d_ff=32,
            src_pad_id=0,
            tgt_pad_id=0,
        )  # fmt: skip
    )
    sentences = ["ein mann läuft .", "ein hund .", "mann hund hund läuft ."]
    translator = metrics.Translator(model, WordTokenizer(), vocab, vocab, beam_size=3)
    calls = []
    real = metrics.beam_search
    monkeypatch.setattr(metrics, "beam_search", lambda *a, **k: calls.append(1) or real(*a, **k))
    swept = translator.translate_with_penalties(sentences, [0.0, 0.6, 2.0])
    assert len(calls) == 1, "one search for all three α"
    for alpha, translations in swept.items():
        alone = metrics.Translator(model, WordTokenizer(), vocab, vocab, beam_size=3,
                                   length_penalty=alpha)  # fmt: skip
        assert alone.translate(sentences) == translations, alpha
    scores = metrics.length_penalty_sweep(translator, list(zip(sentences, sentences)), [0.6, 2.0])
    assert list(scores) == [0.6, 2.0] and translator.length_penalty == 0.6
    with pytest.raises(ValueError, match="alphas must be a non-empty list"):
        translator.translate_with_penalties(sentences, [])
    with pytest.raises(ValueError, match=r"alphas\[1\] must be"):
        translator.translate_with_penalties(sentences, [0.6, -1.0])


def test_the_command_line_takes_a_precision_and_says_what_threads_it_uses(
    tmp_path, capsys, restore_threads, monkeypatch
):
    import json

    from companion.run import main

    monkeypatch.delenv("COMPANION_THREADS", raising=False)
    results = main(
        ["--config", "toy", "--out", str(tmp_path), "--max-steps", "2", "--no-progress",
         "--set", "toy_examples=200", "--precision", "bf16"]
    )  # fmt: skip
    assert results["steps"] == 2
    assert json.loads((tmp_path / "config.json").read_text())["precision"] == "bf16"
    assert "torch uses" in capsys.readouterr().err  # the thread policy's choice, on stderr
    with pytest.raises(SystemExit):
        main(["--config", "toy", "--out", str(tmp_path), "--precision", "fp8"])
