"""The catalogue of the bug museum: realistic one-line (or few-line) bugs in ``companion``.

Each :class:`Mutant` names the bug class it stands for, the file of ``companion/`` it
patches, the exact snippets it replaces (each must occur exactly once in that file, so the
catalogue fails loudly when the package changes instead of silently testing nothing) and the
pytest node ids that must catch it. ``tests/test_mutants.py`` applies every mutant to a
temporary copy of the package and runs those tests against the copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mutant", "MUTANTS", "apply_mutant"]


@dataclass(frozen=True)
class Mutant:
    """One bug: ``edits`` are ``(original, replacement)`` pairs applied to ``path``."""

    id: str  #: short name, the pytest id of the mutant
    bug: str  #: the bug class it represents, in words
    path: str  #: the patched file, relative to the package, e.g. ``"attention.py"``
    edits: tuple[tuple[str, str], ...]  #: exact snippets and what replaces them
    tests: tuple[str, ...]  #: node ids ``tests/test_x.py::test_name`` that must fail


def apply_mutant(mutant: Mutant, package: Path) -> None:
    """Patch the copy of ``companion`` at ``package`` in place; every original snippet must
    occur exactly once in the file (``AssertionError`` otherwise)."""
    target = package / mutant.path
    text = target.read_text(encoding="utf-8")
    for original, replacement in mutant.edits:
        count = text.count(original)
        assert count == 1, (
            f"mutant {mutant.id}: the snippet must occur exactly once in companion/"
            f"{mutant.path}, found {count} times (has the package changed?):\n{original}"
        )
        assert replacement != original, f"mutant {mutant.id}: an edit changes nothing"
        text = text.replace(original, replacement)
    target.write_text(text, encoding="utf-8")


def _m(id: str, bug: str, path: str, edits: list[tuple[str, str]], *tests: str) -> Mutant:
    """Shorthand for one catalogue entry."""
    return Mutant(id, bug, path, tuple(edits), tuple(tests))


MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ attention
    _m(
        "attention_backward_without_the_softmax_row_term",
        "hand-written softmax backward keeps t = g ⊙ d but forgets - w ⊙ rowsum(t)",
        "kernels.py",
        [
            (
                "grad_scores.addcmul_(weights, row_sums, value=-1.0)",
                "grad_scores.addcmul_(weights, row_sums, value=0.0)",
            )
        ],
        "tests/test_attention.py::test_written_out_dropout_attention_backward_passes_gradcheck",
    ),
    _m(
        "scale_by_d_k",
        "scores divided by d_k instead of √d_k",
        "attention.py",
        [("scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0 / q.shape[-1]")],
        "tests/test_scaled_dot_product.py::test_scale_argument_and_default",
    ),
    _m(
        "scale_after_softmax",
        "the 1/√d_k scale applied to the weights after the softmax",
        "attention.py",
        [
            (
                "scores = (q @ k.transpose(-2, -1)) * scale  # (..., q_len, k_len)",
                "scores = q @ k.transpose(-2, -1)  # (..., q_len, k_len)",
            ),
            (
                "weights = torch.softmax(scores, dim=-1)  # (..., q_len, k_len)\n    if mask",
                "weights = torch.softmax(scores, dim=-1) * scale  # (..., q_len, k_len)\n    if mask",
            ),
        ],
        "tests/test_scaled_dot_product.py::test_matches_torch_functional",
    ),
    _m(
        "no_softmax",
        "no softmax: the raw scores used as attention weights",
        "attention.py",
        [
            (
                "weights = torch.softmax(scores, dim=-1)  # (..., q_len, k_len)\n    if mask",
                "weights = scores  # (..., q_len, k_len)\n    if mask",
            )
        ],
        "tests/test_scaled_dot_product.py::test_matches_torch_functional",
    ),
    _m(
        "masked_fill_discarded",
        "masked_fill's result discarded (it is not in place)",
        "attention.py",
        [
            (
                "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
                "scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
            )
        ],
        "tests/test_scaled_dot_product.py::test_matches_torch_functional",
    ),
    _m(
        "mask_convention_flipped",
        "mask convention flipped: True read as 'blocked' (torch.nn.MultiheadAttention's way)",
        "attention.py",
        [
            (
                "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
                "scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)",
            ),
            (
                "weights = weights.masked_fill(~mask, 0.0)",
                "weights = weights.masked_fill(mask, 0.0)",
            ),
        ],
        "tests/test_scaled_dot_product.py::test_blocked_keys_get_exactly_zero_weight",
    ),
    _m(
        "heads_split_without_transpose",
        "heads split with view/reshape straight to (batch, heads, len, head_dim), no transpose",
        "attention.py",
        [
            (
                "return split.transpose(1, 2)  # (batch, heads, len, head_dim)",
                "return split.reshape(batch, heads, seq_len, self.head_dim)  # (batch, heads, len, head_dim)",
            )
        ],
        "tests/test_attention.py::test_split_heads_and_merge_heads",
    ),
    _m(
        "heads_merged_without_transpose",
        "heads merged with reshape without the transpose back",
        "attention.py",
        [
            (
                "heads_last = x.transpose(1, 2)  # (batch, len, heads, head_dim)",
                "heads_last = x  # (batch, len, heads, head_dim)",
            )
        ],
        "tests/test_attention.py::test_split_heads_and_merge_heads",
    ),
    _m(
        "gqa_repeat_instead_of_repeat_interleave",
        "GQA: key/value heads tiled with repeat instead of repeat_interleave",
        "attention.py",
        [
            (
                "return x.repeat_interleave(group, dim=1)",
                "return x.repeat(1, group, 1, 1)",
            )
        ],
        "tests/test_gqa.py::test_repeat_kv_heads_uses_repeat_interleave_on_the_head_axis",
    ),
    _m(
        "rope_query_offset_ignored",
        "RoPE: the queries rotated from position 0 when decoding with a cache",
        "attention.py",
        [
            (
                "q = self.rotary.rotate(q, offset=query_offset)",
                "q = self.rotary.rotate(q, offset=0)",
            )
        ],
        "tests/test_rope_alibi.py::test_cached_steps_equal_full_causal_attention",
    ),
    _m(
        "cache_values_prepended",
        "KV cache: the new values put before the cached ones (keys and values out of step)",
        "attention.py",
        [
            (
                "v = torch.cat([cache.values, v], dim=2)",
                "v = torch.cat([v, cache.values], dim=2)",
            )
        ],
        "tests/test_attention.py::test_key_value_cache_step_by_step_equals_causal_attention",
    ),
    # ------------------------------------------------------------------ layers
    _m(
        "residual_adds_normalised_input",
        "Pre-LN residual adds the normalised input instead of the sub-layer's input",
        "layers.py",
        [
            (
                "return x + self.residual_dropout(sublayer(norm(x)))",
                "return norm(x) + self.residual_dropout(sublayer(norm(x)))",
            )
        ],
        "tests/test_layers.py::test_encoder_layer_parity_with_torch",
    ),
    _m(
        "post_ln_dropout_after_norm",
        "Post-LN: dropout applied after the LayerNorm instead of on the sub-layer output",
        "layers.py",
        [
            (
                "return norm(scaled + self.residual_dropout(sublayer(x)))  # (batch, len, d_model)",
                "return self.residual_dropout(norm(scaled + sublayer(x)))",
            )
        ],
        "tests/test_caught_layers.py::test_post_ln_output_is_normalised_in_training_mode",
    ),
    _m(
        "cross_attention_kv_from_target",
        "cross-attention takes keys and values from the target instead of the encoder memory",
        "layers.py",
        [
            (
                "x, memory, memory, mask, need_weights=need_weights, cache=cache",
                "x, x, x, mask, need_weights=need_weights, cache=cache",
            )
        ],
        "tests/test_layers.py::test_decoder_layer_parity_with_torch",
    ),
    _m(
        "decoder_self_attention_on_memory",
        "decoder self-attention reads the encoder output (arguments in the wrong order)",
        "layers.py",
        [
            (
                "lambda h: self.self_attend(h, tgt_mask, need_weights, is_causal, own),",
                "lambda h: self.self_attention(\n"
                "                h, memory, memory, tgt_mask, need_weights=need_weights, cache=own\n"
                "            )[0],",
            )
        ],
        "tests/test_layers.py::test_decoder_layer_is_causal_by_default",
    ),
    _m(
        "one_attention_for_self_and_cross",
        "one attention module shared by self- and cross-attention",
        "layers.py",
        [
            (
                "self.cross_attention = self.attention()  # no positions",
                "self.cross_attention = self.self_attention  # no positions",
            )
        ],
        "tests/test_layers.py::test_decoder_layer_parity_with_torch",
    ),
    _m(
        "feed_forward_without_activation",
        "feed-forward network without its non-linearity",
        "layers.py",
        [
            (
                "hidden = self.activation(hidden)  # (..., d_ff)",
                "hidden = hidden  # (..., d_ff)",
            )
        ],
        "tests/test_layers.py::test_feed_forward_is_position_wise",
    ),
    _m(
        "kept_relu_without_relu",
        "the CPU training path of the feed-forward network drops out but forgets the ReLU",
        "kernels.py",
        [
            (
                "output = hidden.clamp_min(0.0).mul_(kept)  # (..., d_ff) relu(h) ⊙ m",
                "output = hidden.clone().mul_(kept)  # (..., d_ff) h ⊙ m",
            )
        ],
        "tests/test_layers.py::test_feed_forward_training_path_is_relu_then_dropout",
    ),
    # ------------------------------------------------------------------ model
    _m(
        "layers_in_a_plain_list",
        "layers kept in a plain list: not registered, their parameters never trained or saved",
        "model.py",
        [
            (
                "self.layers = nn.ModuleList(\n            layer(",
                "self.layers = list(\n            layer(",
            )
        ],
        "tests/test_model.py::test_paper_base_and_big_counts_on_the_meta_device",
    ),
    _m(
        "embedding_not_scaled",
        "token embeddings not multiplied by √d_model",
        "model.py",
        [
            (
                "return self.embedding(tokens) * self.scale  # (..., d_model)",
                "return self.embedding(tokens)  # (..., d_model)",
            )
        ],
        "tests/test_model.py::test_token_embedding_is_scaled_by_sqrt_d_model",
    ),
    _m(
        "tied_weights_untied",
        "tied weights untied: the generator gets a copy of the embedding, not the same matrix",
        "model.py",
        [
            (
                "self.generator.weight = self.tgt_embedding.weight",
                "self.generator.weight.data.copy_(self.tgt_embedding.weight.data)",
            )
        ],
        "tests/test_model.py::test_tied_embeddings_share_one_matrix",
    ),
    _m(
        "padding_masks_swapped",
        "padding masks swapped: the target mask given to cross-attention and vice versa",
        "model.py",
        [
            (
                "                tgt_mask,\n                memory_mask,\n                need_weights",
                "                memory_mask,\n                tgt_mask,\n                need_weights",
            )
        ],
        "tests/test_model.py::test_transformer_parity_with_torch",
    ),
    _m(
        "cache_offset_off_by_one",
        "KV cache: target positions continue one past the cached ones",
        "model.py",
        [
            (
                "offset = cache.length  # positions continue",
                "offset = cache.length + 1  # positions continue",
            )
        ],
        "tests/test_model.py::test_cached_steps_match_the_whole_prefix",
    ),
    _m(
        "encoder_final_norm_discarded",
        "the encoder's final LayerNorm computed and discarded: the decoder reads the raw memory",
        "model.py",
        [
            (
                "            x = self.final_norm(x)  # (batch, src_len, d_model)\n        return x",
                "            self.final_norm(x)  # (batch, src_len, d_model)\n        return x",
            )
        ],
        "tests/test_model.py::test_transformer_parity_with_torch",
    ),
    # ------------------------------------------------------------------ positional
    _m(
        "positional_exponent_counted_twice",
        "sinusoidal positions: the exponent 2m/d counted twice (4m/d)",
        "positional.py",
        [
            (
                "return base ** (-two_m / dim)  # (dim/2,)",
                "return base ** (-2 * two_m / dim)  # (dim/2,)",
            )
        ],
        "tests/test_positional.py::test_sinusoidal_table_matches_the_paper_formula",
    ),
    _m(
        "cosine_uses_the_odd_index",
        "sinusoidal positions: the cosine of dimension 2i+1 uses 2i+1 in the exponent, not 2i",
        "positional.py",
        [
            (
                "table[:, 1::2] = torch.cos(angles)  # odd dimensions",
                "table[:, 1::2] = torch.cos(positions * base ** (-(two_i + 1) / d_model))  # odd",
            ),
            (
                "    positions = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)\n    angles",
                "    positions = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)\n"
                "    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)\n    angles",
            ),
        ],
        "tests/test_positional.py::test_sinusoidal_table_matches_the_paper_formula",
    ),
    _m(
        "learned_positions_detached",
        "learned positions read through .data: the position table never gets a gradient",
        "positional.py",
        [
            (
                "return self.dropout(x + self.embedding(positions))",
                "return self.dropout(x + self.embedding.weight.data[positions])",
            )
        ],
        "tests/test_caught_positional.py::test_learned_positions_receive_a_gradient_for_the_positions_used",
    ),
    _m(
        "alibi_slopes_of_the_wrong_half",
        "ALiBi slope rule: the even-numbered slopes of 2p heads instead of the odd-numbered ones",
        "positional.py",
        [
            (
                "between = _geometric_slopes(2 * power)[0::2]",
                "between = _geometric_slopes(2 * power)[1::2]",
            )
        ],
        "tests/test_rope_alibi.py::test_alibi_slopes_for_other_head_counts_follow_the_paper",
    ),
    # ------------------------------------------------------------------ masking
    _m(
        "causal_mask_off_by_one",
        "causal mask off by one: every query also sees the next token",
        "masking.py",
        [
            (
                "return torch.tril(ones, diagonal=k_len - q_len)",
                "return torch.tril(ones, diagonal=k_len - q_len + 1)",
            )
        ],
        "tests/test_masking.py::test_causal_mask_square_is_lower_triangular",
    ),
    _m(
        "padding_mask_flipped",
        "padding mask convention flipped: True on the padding",
        "masking.py",
        [
            (
                "return (tokens != pad_id)[:, None, None, :]",
                "return (tokens == pad_id)[:, None, None, :]",
            )
        ],
        "tests/test_masking.py::test_padding_mask_shape_and_values",
    ),
    _m(
        "sliding_window_off_by_one",
        "sliding window off by one: a causal window of w sees w + 1 keys",
        "masking.py",
        [
            (
                "return (distance >= 0) & (distance < window)",
                "return (distance >= 0) & (distance <= window)",
            )
        ],
        "tests/test_masking_sparse.py::test_sliding_window_causal_by_hand",
    ),
    _m(
        "prefix_lm_prefix_off_by_one",
        "prefix LM: the first target token is counted in the bidirectional prefix",
        "masking.py",
        [
            (
                "in_prefix = positions[None, :] < prefix_len",
                "in_prefix = positions[None, :] <= prefix_len",
            )
        ],
        "tests/test_masking.py::test_prefix_lm_mask_by_hand",
    ),
    # ------------------------------------------------------------------ interop
    _m(
        "converter_swaps_k_and_v",
        "interop converter: key and value rows of in_proj_weight swapped",
        "interop.py",
        [
            (
                "return attention.query_proj, attention.key_proj, attention.value_proj",
                "return attention.query_proj, attention.value_proj, attention.key_proj",
            )
        ],
        "tests/test_attention.py::test_parity_with_torch_multihead_attention",
    ),
    # ------------------------------------------------------------------ train
    _m(
        "labels_not_shifted",
        "teacher forcing: labels not shifted (the model learns to copy its input)",
        "train.py",
        [("return tgt[:, :-1], tgt[:, 1:]", "return tgt[:, :-1], tgt[:, :-1]")],
        "tests/test_train.py::test_shift_targets",
    ),
    _m(
        "label_smoothing_over_v_minus_1",
        "label smoothing over the V - 1 wrong classes instead of all V",
        "train.py",
        [
            (
                "(1 - eps) * nll - eps * log_probs.mean(dim=-1)",
                "(1 - eps) * nll - eps * (log_probs.sum(dim=-1) + nll) / (log_probs.shape[-1] - 1)",
            )
        ],
        "tests/test_train.py::test_sequence_loss_value_and_gradient_equal_torch_cross_entropy",
    ),
    _m(
        "label_smoothing_gradient_v_minus_1",
        "label-smoothing gradient spreads ε over V - 1 classes (forward and backward disagree)",
        "train.py",
        [("grad_logits.sub_(eps / vocab)", "grad_logits.sub_(eps / (vocab - 1))")],
        "tests/test_train.py::test_sequence_loss_value_and_gradient_equal_torch_cross_entropy",
    ),
    _m(
        "softmax_before_cross_entropy",
        "softmax applied to the logits before the cross-entropy (which applies its own)",
        "train.py",
        [
            (
                "loss = sequence_loss(logits, labels, pad_id=pad_id, label_smoothing=label_smoothing)",
                "loss = sequence_loss(\n        logits.softmax(dim=-1), labels, pad_id=pad_id, label_smoothing=label_smoothing\n    )",
            )
        ],
        "tests/test_train.py::test_train_step_learns_a_fixed_batch",
    ),
    _m(
        "noam_warmup_exponent",
        "Noam schedule: warm-up slope step·warmup^-0.5 instead of step·warmup^-1.5",
        "train.py",
        [("step * warmup_steps**-1.5", "step * warmup_steps**-0.5")],
        "tests/test_train.py::test_inverse_sqrt_warmup_shape",
    ),
    # ------------------------------------------------------------------ efficient attention
    _m(
        "blockwise_rescale_skipped",
        "block-wise (Flash) attention: the running output not rescaled when the maximum grows",
        "efficient_attention.py",
        [
            (
                "accumulated = accumulated * rescale[..., None] + probs",
                "accumulated = accumulated + probs",
            )
        ],
        "tests/test_efficient_attention.py::test_blockwise_with_a_scale_and_a_padding_mask",
    ),
    # ------------------------------------------------------------------ cache
    _m(
        "cache_reorder_forgets_values",
        "KV cache reorder moves the keys but not the values",
        "cache.py",
        [
            (
                "            self.values = self.values.index_select(0, indices)  # (new_batch, heads, len, head_dim)\n",
                "",
            )
        ],
        "tests/test_model.py::test_cache_reorder_follows_the_beams",
    ),
    # ------------------------------------------------------------------ decode
    _m(
        "greedy_feeds_back_only_the_last_token",
        "greedy decoding without a cache feeds back only the last token",
        "decode.py",
        [
            (
                "logits = model.decode(ys, memory, src_mask)  # (batch, t, vocab)",
                "logits = model.decode(ys[:, -1:], memory, src_mask)  # (batch, t, vocab)",
            )
        ],
        "tests/test_decode.py::test_cache_gives_exactly_the_same_tokens",
    ),
    _m(
        "greedy_loops_for_the_source_length",
        "greedy decoding loops for the source length instead of the length limit",
        "decode.py",
        [
            (
                "finished = torch.zeros(batch, dtype=torch.bool, device=memory.device)  # (batch,)\n"
                "        for step in range(int(limits.max())):",
                "finished = torch.zeros(batch, dtype=torch.bool, device=memory.device)  # (batch,)\n"
                "        for step in range(src.shape[1]):",
            )
        ],
        "tests/test_decode.py::test_padding_does_not_change_a_translation",
    ),
    _m(
        "no_padding_after_eos",
        "greedy decoding keeps generating after <eos> instead of padding",
        "decode.py",
        [
            (
                "(pad_id, bos_id)).argmax(dim=-1)  # (batch,)\n"
                "            next_token = next_token.masked_fill(finished, pad_id)  # (batch,)\n",
                "(pad_id, bos_id)).argmax(dim=-1)  # (batch,)\n",
            )
        ],
        "tests/test_decode.py::test_one_length_limit_per_sentence",
    ),
    _m(
        "beam_cache_reorder_skipped",
        "beam search: the KV cache not reordered to follow the surviving beams",
        "decode.py",
        [("            cache.reorder(source_rows)\n", "")],
        "tests/test_decode.py::test_history_replays_the_beams_and_their_scores",
    ),
    _m(
        "length_penalty_precedence",
        "GNMT length penalty: (5 + length) / 6**α instead of ((5 + length) / 6)**α",
        "decode.py",
        [
            (
                "return ((5.0 + length) / 6.0) ** alpha",
                "return (5.0 + length) / 6.0**alpha",
            )
        ],
        "tests/test_decode.py::test_length_penalty_values",
    ),
    _m(
        "beam_forgets_the_beam_offset",
        "beam search: parent rows taken without the sentence's row offset",
        "decode.py",
        [
            (
                "source_rows = (row_offset + top_beam.gather(1, pick)).view(-1)",
                "source_rows = top_beam.gather(1, pick).view(-1)",
            )
        ],
        "tests/test_decode.py::test_beam_search_batch_matches_single_sentences",
    ),
    # ------------------------------------------------------------------ families
    _m(
        "decoder_only_not_causal",
        "decoder-only model: no causal mask when there is no other mask",
        "families.py",
        [
            (
                "kernel_causal = is_causal and mask is None",
                "kernel_causal = False and mask is None",
            )
        ],
        "tests/test_families.py::test_decoder_only_never_leaks_a_later_token",
    ),
    # ------------------------------------------------------------------ data
    _m(
        "masked_lm_80_10_10_overlap",
        "BERT masking: the 'random token' 10% drawn from the same range as the 80% [MASK]",
        "data/objectives.py",
        [
            (
                "selected & (split_draw >= MASK_FRACTION) & (split_draw < MASK_FRACTION + RANDOM_FRACTION)",
                "selected & (split_draw < RANDOM_FRACTION)",
            )
        ],
        "tests/test_objectives.py::test_masked_lm_follows_its_documented_draws",
    ),
    # ------------------------------------------------------------------ more classic bugs
    _m(
        "loss_averaged_over_padding",
        "the loss divided by every position, padding included, not by the real tokens",
        "train.py",
        [
            (
                "counted.to(logits.dtype) / counted.sum()",
                "counted.to(logits.dtype) / counted.numel()",
            )
        ],
        "tests/test_train.py::test_sequence_loss_ignores_padding_and_smooths",
    ),
    _m(
        "vocabulary_min_freq_off_by_one",
        "vocabulary off by one: a token must occur more than min_freq times, not at least",
        "data/vocab.py",
        [("if n >= min_freq)", "if n > min_freq)")],
        "tests/test_vocab.py::test_vocab_build_order_and_min_freq",
    ),
    _m(
        "temperature_multiplies",
        "sampling temperature multiplies the logits instead of dividing them",
        "decode.py",
        [
            (
                "return torch.softmax((logits - best) / temperature, dim=-1)",
                "return torch.softmax((logits - best) * temperature, dim=-1)",
            )
        ],
        "tests/test_decode.py::test_first_token_frequencies_follow_the_tempered_distribution",
    ),
    _m(
        "top_k_keeps_k_minus_1",
        "top-k sampling off by one: the k-th best token is dropped too",
        "decode.py",
        [
            (
                "logits = logits.masked_fill(logits < kth_best, -math.inf)",
                "logits = logits.masked_fill(logits <= kth_best, -math.inf)",
            )
        ],
        "tests/test_decode.py::test_temperature_zero_and_top_1_are_greedy",
    ),
    _m(
        "bleu_lengths_swapped",
        "BLEU brevity penalty reads the hypothesis and reference lengths swapped",
        "metrics.py",
        [
            (
                "sys_len, ref_len = int(totals[0]), int(totals[1])",
                "sys_len, ref_len = int(totals[1]), int(totals[0])",
            )
        ],
        "tests/test_metrics.py::test_bootstrap_interval_contains_the_score_and_is_reproducible",
    ),
    _m(
        "rms_norm_over_the_wrong_axes",
        "RMSNorm (torch < 2.4 fallback) averages over positions and features, not features only",
        "layers.py",
        [
            (
                "x.pow(2).mean(dim=-1, keepdim=True)",
                "x.pow(2).mean(dim=(-2, -1), keepdim=True)",
            )
        ],
        "tests/test_layers.py::test_make_norm_rms_matches_torch_rms_norm",
    ),
    _m(
        "checkpoint_missing_model_kind",
        "checkpoint missing a key: the model's class is not saved",
        "checkpoint.py",
        [("        _KIND_KEY: kind,\n", "")],
        "tests/test_families.py::test_decoder_only_checkpoint_round_trip",
    ),
    _m(
        "sinusoidal_offset_ignored",
        "sinusoidal positions ignore the offset: a continuation restarts at position 0",
        "positional.py",
        [
            (
                "return self.table[offset:needed]  # (seq_len, d_model)",
                "return self.table[: needed - offset]  # (seq_len, d_model)",
            )
        ],
        "tests/test_positional.py::test_encoding_adds_to_x_with_offset",
    ),
    # ------------------------------------------------------------------ dropout
    _m(
        "dropout_top_bit_not_random",
        "dropout's random words drawn over [0, 2**63): the top lane never drops for p < 0.5",
        "dropout.py",
        [
            (
                "raw = np.random.SFC64(seed).random_raw(words)",
                "raw = np.random.SFC64(seed).random_raw(words) >> np.uint64(1)",
            )
        ],
        "tests/test_dropout.py::test_keep_rate_matches_the_realised_probability",
    ),
    _m(
        "dropout_survivors_not_rescaled",
        "dropout zeroes but does not scale the survivors by 1 / (1 - p): the mean shrinks",
        "dropout.py",
        [
            (
                "return 1.0 / kept if kept else 0.0",
                "return 1.0 if kept else 0.0",
            )
        ],
        "tests/test_dropout.py::test_dropout_is_unbiased_and_scales_the_survivors",
    ),
    # ------------------------------------------------------------------ public boundaries
    _m(
        "cache_head_size_unchecked",
        "a key/value cache is checked for its batch and kv heads but not its head size: a "
        "cache of another model reaches torch.cat",
        "_attention_checks.py",
        [
            (
                "if not (fits and tensor.shape[3] == attention.head_dim):",
                "if not fits:",
            )
        ],
        "tests/test_public_boundaries.py::test_a_cache_with_another_head_size_is_refused",
    ),
    _m(
        "generate_positions_off_by_one",
        "learned positions counted for the last generated token too, which is never fed back: "
        "a prompt of max_len tokens may generate nothing",
        "families.py",
        [
            (
                "fed, max_len = prompt.shape[1] + max_new_tokens - 1, self.config.max_len",
                "fed, max_len = prompt.shape[1] + max_new_tokens, self.config.max_len",
            )
        ],
        "tests/test_public_boundaries.py::test_generate_with_learned_positions_may_fill_max_len_plus_one",
    ),
    _m(
        "checkpoint_dtype_lost_on_load",
        "from_checkpoint builds a float32 model and copies the saved float64 weights into it, "
        "rounded",
        "checkpoint.py",
        [
            (
                '_take_saved_dtypes(model, checkpoint["model"])',
                "None",
            )
        ],
        "tests/test_public_boundaries.py::test_a_float64_model_comes_back_float64_and_exact",
    ),
    _m(
        "tiny_temperature_overflows",
        "logits divided by the temperature before they are shifted: at temperature 1e-40 the "
        "best one overflows to inf and the softmax gives NaN",
        "decode.py",
        [
            (
                "torch.softmax((logits - best) / temperature, dim=-1)",
                "torch.softmax(logits / temperature, dim=-1)",
            )
        ],
        "tests/test_public_boundaries.py::test_a_tiny_temperature_samples_the_greedy_token",
    ),
    # ------------------------------------------------------------------ more patients
    # The common bugs of chapter 11's clinic, planted in the package itself (the clinic's
    # patients are companion.clinic.CONDITIONS and BUGS; these are the museum's).
    _m(
        "prefix_lm_target_off_by_one",
        "prefix LM: the first target token (predicted from the last prefix token) left out "
        "of the loss",
        "data/objectives.py",
        [
            (
                "inside = positions[None, :] < prefix - 1  # (batch, in_len) targets inside the prefix",
                "inside = positions[None, :] < prefix  # (batch, in_len) targets inside the prefix",
            )
        ],
        "tests/test_objectives.py::test_prefix_lm_by_hand",
    ),
    _m(
        "masked_lm_targets_only_at_mask",
        "BERT masking: targets only where [MASK] was put, not at the 10% random and 10% kept "
        "selected tokens",
        "data/objectives.py",
        [
            (
                "targets = batch.masked_fill(~selected, pad_id)",
                "targets = batch.masked_fill(~to_mask, pad_id)",
            )
        ],
        "tests/test_objectives.py::test_masked_lm_follows_its_documented_draws",
    ),
    _m(
        "t5_sentinel_after_its_span",
        "T5 span corruption: each sentinel written after its span in the targets, not before",
        "data/objectives.py",
        [
            (
                "targets += [sentinels[index], *tokens[start:stop]]",
                "targets += [*tokens[start:stop], sentinels[index]]",
            )
        ],
        "tests/test_objectives.py::test_corrupt_spans_reproduces_figure_2_of_the_t5_paper",
    ),
    _m(
        "generate_without_eos_padding",
        "decoder-only generate: a row that said <eos> goes on generating instead of padding",
        "families.py",
        [("                next_token = next_token.masked_fill(finished, fill)  # (batch,)\n", "")],
        "tests/test_families.py::test_eos_finishes_a_row_and_stops_when_all_have",
    ),
    _m(
        "softmax_over_the_queries",
        "softmax over the wrong dimension: over the queries (dim=-2), not the keys",
        "attention.py",
        [
            (
                "weights = torch.softmax(scores, dim=-1)  # (..., q_len, k_len)\n    if mask",
                "weights = torch.softmax(scores, dim=-2)  # (..., q_len, k_len)\n    if mask",
            )
        ],
        "tests/test_scaled_dot_product.py::test_matches_torch_functional",
    ),
    _m(
        "interop_attn_mask_heads_major",
        "interop batch-axis slip: a per-head mask flattened heads-major, (heads, batch), where "
        "torch reads (batch, heads)",
        "interop.py",
        [
            (
                "expanded = mask.expand(batch, num_heads, q_len, k_len)",
                "expanded = mask.expand(batch, num_heads, q_len, k_len).transpose(0, 1)",
            )
        ],
        "tests/test_masking.py::test_attn_mask_round_trip_2d_and_per_head",
        "tests/test_attention.py::test_parity_with_torch_multihead_attention",
    ),
)
