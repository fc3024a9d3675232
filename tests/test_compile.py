"""torch.compile: the model and the loss trace as one graph, and a compiled run trains the same."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from helpers import tiny_transformer

from companion.train import sequence_loss, shift_targets

PAD = 0


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    src = torch.randint(1, 30, (4, 9), generator=generator)  # (4, 9)
    tgt = torch.randint(1, 30, (4, 8), generator=generator)  # (4, 8)
    src[0, 6:] = PAD  # padding in both: the masked paths are traced too
    tgt[1, 5:] = PAD
    return src, tgt


@pytest.mark.parametrize("norm_first", [False, True])
def test_forward_and_loss_compile_without_a_graph_break(norm_first: bool) -> None:
    model = tiny_transformer(30, num_layers=2, dropout=0.1, norm_first=norm_first).train()

    def forward_and_loss(src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        decoder_input, labels = shift_targets(tgt)  # (batch, tgt_len - 1) each
        logits = model(src, decoder_input)  # (batch, tgt_len - 1, vocab)
        return sequence_loss(logits, labels, pad_id=PAD, label_smoothing=0.1)

    dynamo.reset()
    explanation = dynamo.explain(forward_and_loss)(*batch())
    reasons = [str(b.reason) for b in explanation.break_reasons]
    assert explanation.graph_break_count == 0, reasons
    assert explanation.graph_count == 1


def test_explain_sees_a_graph_break_when_there_is_one() -> None:  # the test above can fail
    model = tiny_transformer(30).eval()

    def with_a_sync(src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        logits = model(src, tgt)
        dynamo.graph_break()  # what a host sync in the model would do
        return -logits

    dynamo.reset()
    assert dynamo.explain(with_a_sync)(*batch()).graph_break_count >= 1


def test_a_compiled_run_trains_like_the_eager_one(make_trainer, tiny_config) -> None:
    """``TrainConfig.compile``: the same losses as eager, step for step (dropout off)."""
    config = tiny_config.replace(dropout=0.0)
    losses = {}
    for compile_model in (False, True):
        dynamo.reset()
        trainer = make_trainer(config.replace(compile=compile_model))
        assert (trainer.step_model is not trainer.model) == compile_model
        data = trainer.train_data
        losses[compile_model] = []
        for start in (0, 8, 16):
            rows = [data[i] for i in range(start, start + 8)]
            src, tgt = (torch.nn.utils.rnn.pad_sequence(
                [torch.as_tensor(r[k]) for r in rows], batch_first=True, padding_value=PAD
            ) for k in (0, 1))  # fmt: skip
            losses[compile_model].append(trainer.train_step(src, tgt).loss)
    assert losses[True] == pytest.approx(losses[False], rel=1e-5, abs=1e-6)
