"""Chapter 6's training study: where the LayerNorm goes, with and without warm-up.

The setup of section 6.4 (a 6 + 6-layer Transformer that learns to reverse sequences of 1 to 8
digits, Adam with the paper's constants, clipping at norm 1) and a training run that records
what sections 6.5 and 6.7 measure. ``benchmarks/ch06_grid.py`` trains its grid with the same
functions, so that the chapter's runs and the stored grid come from one piece of code.

===========================  ===================================================================
name                         what it is
===========================  ===================================================================
:func:`init_encoder`         section 6.3's encoder at initialisation (with or without a final norm)
:func:`init_inputs`          section 6.3's inputs and loss (random read-out or cross-entropy)
:func:`lr_schedule`          the schedules ``"constant"``, ``"warm-up"`` and ``"decay"``, for LambdaLR
:func:`train_data`           the reversal data of section 6.4 (batches drawn by a seeded loader)
:func:`probe_batch`          a fixed batch on which each update's change of the logits is measured
:func:`build_model`          the 6 + 6-layer model (or ``num_layers`` + ``num_layers``)
:func:`train_run`            one training run: the loss of every step, plus the measurements
:func:`replay_encoder`       section 6.7.3: an encoder run sub-layer by sub-layer, with the stream's
                             size and each sub-layer's relative update
===========================  ===================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from companion._validation import check_bool, check_choice, check_positive_int
from companion.data import PAD_ID, CopyReverseDataset, collate_batch
from companion.layers import EncoderLayer
from companion.model import Encoder, Transformer, TransformerConfig
from companion.train import inverse_sqrt_warmup, shift_targets, train_step

__all__ = [
    "BATCH",
    "D_FF",
    "D_MODEL",
    "FIRST_STEPS",
    "HEADS",
    "INIT_BATCH",
    "INIT_D_FF",
    "INIT_SEQ_LEN",
    "SCHEDULES",
    "STEPS",
    "WARMUP",
    "build_model",
    "gradient_norm",
    "init_encoder",
    "init_inputs",
    "lr_schedule",
    "probe_batch",
    "replay_encoder",
    "train_data",
    "train_run",
]

#: section 6.4's model: width, heads, feed-forward width
D_MODEL, HEADS, D_FF = 64, 4, 128
#: the longest run, the batch size and the warm-up length (steps)
STEPS, BATCH, WARMUP = 200, 32, 60
#: the first updates, whose effect on the logits and on the weights :func:`train_run` records
FIRST_STEPS = 10
#: the learning-rate schedules of :func:`lr_schedule` (section 6.6 compares all three)
SCHEDULES = ("constant", "warm-up", "decay")
#: section 6.3's encoder at initialisation (``d_model`` and heads as above) and its inputs
INIT_D_FF, INIT_BATCH, INIT_SEQ_LEN = 256, 8, 16
LOSS_KINDS = ("random readout", "cross-entropy")


def init_encoder(
    num_layers: int, norm_first: bool, seed: int, final_norm: bool | None = None
) -> Encoder:
    """Section 6.3's encoder stack at initialisation, as Xiong et al. analyse it.

    ``num_layers`` layers, ``d_model`` 64, 4 heads, ``d_ff`` 256, no dropout; Xavier-normal
    matrices and zero biases, drawn after ``torch.manual_seed(seed)``. ``final_norm``: whether
    the stack ends with a LayerNorm; ``None`` (default) follows the package (Pre-LN has one,
    Post-LN, whose last sub-layer already ends with a norm, has none). The encoder maps
    ``(batch, len, 64)`` to ``(batch, len, 64)``.
    """
    check_positive_int("num_layers", num_layers)
    check_bool("norm_first", norm_first)
    check_positive_int("seed", seed, minimum=0)
    if final_norm is not None:
        check_bool("final_norm", final_norm)
    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=num_layers, d_model=D_MODEL, num_heads=HEADS, d_ff=INIT_D_FF, dropout=0.0,
        norm_first=norm_first, final_norm=final_norm,
    )  # fmt: skip
    encoder = Encoder(config)
    for name, parameter in encoder.named_parameters():
        if parameter.dim() > 1:
            nn.init.xavier_normal_(parameter)
        elif name.endswith("bias"):
            nn.init.zeros_(parameter)
    return encoder


def init_inputs(
    seed: int, loss_kind: str = "random readout"
) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """Section 6.3's inputs and loss, drawn from a generator seeded with ``1000 + seed``.

    Returns ``(x, loss_fn)``: ``x`` of shape ``(8, 16, 64)`` with independent unit-variance
    entries, and ``loss_fn(y)`` a scalar loss of the encoder output ``y (8, 16, 64)``.
    ``"random readout"``: :math:`\\sum_y \\xi_y \\cdot y / \\sqrt{128}` with an independent
    Gaussian direction :math:`\\xi_y` for each of the 128 output vectors; ``"cross-entropy"``:
    cross-entropy on random labels (32 classes) through one shared linear read-out.
    """
    check_positive_int("seed", seed, minimum=0)
    check_choice("loss_kind", loss_kind, LOSS_KINDS)
    gen = torch.Generator().manual_seed(1000 + seed)
    shape = (INIT_BATCH, INIT_SEQ_LEN, D_MODEL)
    x = torch.randn(shape, generator=gen)  # (batch, len, d_model)
    n_tok = INIT_BATCH * INIT_SEQ_LEN
    if loss_kind == "random readout":
        xi = torch.randn(shape, generator=gen)  # (batch, len, d_model): one direction per token

        def loss_fn(y: Tensor) -> Tensor:
            return (xi * y).sum() / math.sqrt(n_tok)

    else:
        readout = torch.randn(D_MODEL, 32, generator=gen) / math.sqrt(D_MODEL)  # (d_model, 32)
        labels = torch.randint(0, 32, (n_tok,), generator=gen)  # (batch * len,)

        def loss_fn(y: Tensor) -> Tensor:
            return nn.functional.cross_entropy((y @ readout).flatten(0, 1), labels)

    return x, loss_fn


def lr_schedule(kind: str, peak_lr: float, warmup: int = WARMUP) -> Callable[[int], float]:
    """The learning rate of each step, for ``LambdaLR`` with a base learning rate of 1.

    ``"constant"``: ``peak_lr`` from the first step. ``"warm-up"``: a linear ramp to
    ``peak_lr`` at step ``warmup`` (default :data:`WARMUP`), then a decay like ``1/sqrt(step)``
    (the 2017 paper's schedule, rescaled so that its peak is ``peak_lr``). ``"decay"``: the
    warm-up schedule without its ramp, ``peak_lr`` from the first step to step ``warmup``, then
    the same decay; it differs from ``"warm-up"`` only before step ``warmup``.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"kind: expected one of {SCHEDULES}, got {kind!r}")
    if isinstance(peak_lr, bool) or not isinstance(peak_lr, (int, float)) or not peak_lr > 0:
        raise ValueError(f"peak_lr: expected a positive number, got {peak_lr!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup: expected a positive int, got {warmup!r}")
    if kind == "constant":
        return lambda step: peak_lr
    factor = peak_lr * math.sqrt(D_MODEL * warmup)  # so that lr(warmup) = peak_lr
    return inverse_sqrt_warmup(D_MODEL, warmup, factor, ramp=kind == "warm-up")


def train_data(steps: int = STEPS) -> CopyReverseDataset:
    """Section 6.4's training set: ``steps × BATCH`` reversal examples of 1 to 8 digits."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive int, got {steps!r}")
    return CopyReverseDataset("reverse", num_examples=steps * BATCH, max_len=8, seed=1)


def probe_batch() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A fixed batch of 64 other examples: ``(src, tgt_input, labels, real)`` with shapes
    ``(64, src_len)``, ``(64, tgt_len - 1)``, ``(64, tgt_len - 1)``, ``(64, tgt_len - 1)``
    (``real``: the positions that are scored, not padding)."""
    probe = CopyReverseDataset("reverse", num_examples=64, max_len=8, seed=2)
    src, tgt = collate_batch([probe[i] for i in range(len(probe))])
    tgt_input, labels = shift_targets(tgt)
    return src, tgt_input, labels, labels != PAD_ID


def build_model(num_layers: int, norm_first: bool, vocab_size: int | None = None) -> Transformer:
    """Section 6.4's Transformer: ``num_layers`` encoder and decoder layers, ``d_model`` 64,
    4 heads, ``d_ff`` 128, no dropout, Pre-LN if ``norm_first``. Its weights come from the
    global random state (seed it first). ``vocab_size``: the reversal task's by default."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers: expected a positive int, got {num_layers!r}")
    if not isinstance(norm_first, bool):
        raise ValueError(f"norm_first: expected a bool, got {type(norm_first).__name__}")
    if vocab_size is None:
        vocab_size = CopyReverseDataset("reverse", num_examples=1, max_len=8, seed=1).vocab_size
    return Transformer(
        TransformerConfig(
            vocab_size, vocab_size, d_model=D_MODEL, num_heads=HEADS, num_layers=num_layers,
            d_ff=D_FF, dropout=0.0, norm_first=norm_first, src_pad_id=PAD_ID, tgt_pad_id=PAD_ID,
        )
    )  # fmt: skip


def gradient_norm(module: nn.Module) -> float:
    """Frobenius norm of all the gradients of a module's parameters together."""
    grads = [p.grad.norm() for p in module.parameters() if p.grad is not None]
    if not grads:
        raise ValueError(
            f"module: expected parameters with gradients, {type(module).__name__} has none"
        )
    return torch.stack(grads).norm().item()


def train_run(
    model: Transformer,
    data: CopyReverseDataset,
    lr: float,
    schedule: str,
    seed: int = 0,
    steps: int = STEPS,
    clip_norm: float | None = 1.0,
    moment_batches: int = 0,
    first_moment: bool = True,
    probe: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
    warmup: int = WARMUP,
) -> dict[str, np.ndarray]:
    """Train ``model`` on ``data`` with Adam (β = 0.9, 0.98; ε = 1e-9) and the schedule
    ``schedule`` peaking at ``lr`` (:func:`lr_schedule`, with ``warmup`` steps to the peak);
    the seed fixes the batches' order. Returns arrays:

    * ``loss`` ``(steps,)``;
    * ``grad_ratio`` ``(steps,)``: gradient norm of the bottom decoder layer / the top one;
    * ``delta_f`` ``(FIRST_STEPS,)``: ‖Δz‖ / ‖z‖, the relative change of the logits z on the
      probe batch (:func:`probe_batch` by default) made by each of the first updates;
    * ``adam_step`` ``(FIRST_STEPS,)``: mean |Δθ| / lr over all weights, for each of them;
    * ``norm_scale`` ``(steps, 3 * decoder layers)``: for each decoder LayerNorm, bottom to top
      (self-attention, cross-attention, feed-forward norm of each layer), the mean over the
      batch's target tokens of :math:`D = \\sqrt{\\operatorname{Var}(x) + \\varepsilon}`, the
      standard deviation its input is divided by, in the forward pass of each step.

    ``moment_batches``: before training, Adam sees that many other batches at learning rate 0,
    so that its moment estimates are filled while the weights stay where they are; with
    ``first_moment=False`` m̂ is emptied again afterwards, so that only v̂ is pre-estimated.
    """
    if not isinstance(model, Transformer):
        raise ValueError(f"model: expected a companion Transformer, got {type(model).__name__}")
    if (
        isinstance(steps, bool)
        or not isinstance(steps, int)
        or not 1 <= steps <= len(data) // BATCH
    ):
        raise ValueError(
            f"steps: expected an int from 1 to {len(data) // BATCH} (the data's batches), got {steps!r}"
        )
    if (
        isinstance(moment_batches, bool)
        or not isinstance(moment_batches, int)
        or moment_batches < 0
    ):
        raise ValueError(f"moment_batches: expected an int ≥ 0, got {moment_batches!r}")
    probe_src, probe_input, _, probe_real = probe_batch() if probe is None else probe
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=1.0,
        betas=(0.9, 0.98),
        eps=1e-9,
        foreach=True,  # foreach: faster
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(schedule, lr, warmup))
    if moment_batches:
        other = DataLoader(data, batch_size=BATCH, shuffle=True, collate_fn=collate_batch,
                           generator=torch.Generator().manual_seed(seed + 100))  # fmt: skip
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        for _, (src, tgt) in zip(range(moment_batches), other):
            train_step(model, src, tgt, optimizer, pad_id=PAD_ID, clip_norm=clip_norm)
        for group in optimizer.param_groups:
            group["lr"] = lr_schedule(schedule, lr, warmup)(0)
        if not first_moment:  # as RAdam's Adam-2k control: v̂ estimated, m̂ still empty
            for state in optimizer.state.values():
                state["exp_avg"].zero_()
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, collate_fn=collate_batch,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    record = {"loss": np.full(steps, np.nan), "grad_ratio": np.full(steps, np.nan),
              "delta_f": np.full(FIRST_STEPS, np.nan), "adam_step": np.full(FIRST_STEPS, np.nan)}  # fmt: skip
    bottom, top = model.decoder.layers[0], model.decoder.layers[-1]
    norms = [
        norm
        for layer in model.decoder.layers
        for norm in (layer.self_attention_norm, layer.cross_attention_norm, layer.feed_forward_norm)
    ]
    record["norm_scale"] = np.full((steps, len(norms)), np.nan)
    current = {"step": -1, "real": None}  # the step being trained and its target tokens

    def record_scale(column: int) -> Callable:
        def hook(module: nn.Module, inputs: tuple[Tensor]) -> None:
            if current["step"] >= 0:  # the training forward pass, not the probe
                with torch.no_grad():
                    var = inputs[0].var(dim=-1, correction=0)[current["real"]]  # (tokens,)
                    scale = torch.sqrt(var + module.eps).mean().item()
                record["norm_scale"][current["step"], column] = scale

        return hook

    handles = [norm.register_forward_pre_hook(record_scale(i)) for i, norm in enumerate(norms)]
    with torch.no_grad():
        logits_after = model.eval()(probe_src, probe_input)[probe_real]  # (tokens, vocab)
    for step, (src, tgt) in zip(range(steps), loader):
        current["step"], current["real"] = step, tgt[:, :-1] != PAD_ID  # (batch, tgt_len - 1)
        if step < FIRST_STEPS:
            logits_before = logits_after  # the weights have not changed since
            weights_before = [p.detach().clone() for p in model.parameters()]
        stats = train_step(
            model, src, tgt, optimizer, scheduler, pad_id=PAD_ID, clip_norm=clip_norm
        )
        current["step"] = -1
        record["loss"][step] = stats.loss
        record["grad_ratio"][step] = gradient_norm(bottom) / gradient_norm(top)
        if step < FIRST_STEPS:
            with torch.no_grad():
                logits_after = model.eval()(probe_src, probe_input)[probe_real]
                change = (logits_after - logits_before).norm() / logits_before.norm()
                moved = sum(
                    (p - w).abs().sum().item() for p, w in zip(model.parameters(), weights_before)
                )
            record["delta_f"][step] = change.item()
            record["adam_step"][step] = (
                moved / sum(p.numel() for p in model.parameters()) / stats.lr
            )
    for handle in handles:
        handle.remove()
    return record


def replay_encoder(
    layers: list[EncoderLayer] | nn.ModuleList,
    x: Tensor,
    mask: Tensor | None = None,
    keep: Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray, Tensor]:
    """Run encoder layers sub-layer by sub-layer (section 6.7.3).

    Args:
        layers: EncoderLayers (all Pre-LN or all Post-LN, dropout off).
        x: (batch, seq_len, d_model) input of the first layer.
        mask: attention mask as the encoder gets it, e.g. (batch, 1, 1, seq_len), or None.
        keep: (batch, seq_len) boolean, the tokens to average over (not padding), or None.

    Returns:
        ``(rms, nu, out)``: rms (2·layers,) of the stream entering each sub-layer; nu
        (2·layers,) = ‖F(·)‖ / ‖x‖ of each sub-layer, the mean over the kept tokens of the
        per-token ratio; out (batch, seq_len, d_model). Each layer's replay is checked against
        the layer itself.
    """
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise ValueError(
            f"x: expected a tensor of shape (batch, seq_len, d_model), got "
            f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}"
        )
    if not all(isinstance(layer, EncoderLayer) for layer in layers):
        raise ValueError("layers: expected companion EncoderLayers only")
    keep = torch.ones(x.shape[:2], dtype=torch.bool) if keep is None else keep
    rms, nu = [], []
    with torch.no_grad():
        for layer in layers:
            x_in = x

            def attention(inputs: Tensor, layer: EncoderLayer = layer) -> Tensor:
                # (batch, seq_len, d_model): the output, not the weights
                return layer.self_attention(inputs, inputs, inputs, mask)[0]

            for norm, branch in (
                (layer.self_attention_norm, attention),
                (layer.feed_forward_norm, layer.feed_forward),
            ):
                update = branch(norm(x)) if layer.norm_first else branch(x)  # F(·)
                size = x.norm(dim=-1)  # (batch, seq_len)
                rms.append((size / math.sqrt(x.shape[-1]))[keep].mean().item())
                nu.append((update.norm(dim=-1) / size)[keep].mean().item())
                x = x + update if layer.norm_first else norm(x + update)
            expected = layer(x_in, mask)
            if not torch.allclose(x, expected, atol=1e-5):  # the replay is exact
                gap = (x - expected).abs().max().item()
                raise RuntimeError(f"the replay differs from the layer by {gap:.1e}")
    return np.array(rms), np.array(nu), x
