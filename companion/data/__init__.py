"""Data for the course: a toy copy/reverse task, Multi30k German→English, its English side
for language models, and the training objectives of the three model families.

Every public name is importable from here (``from companion.data import collate_batch``); the
submodules, in reading order (definitions → parts → whole):

- :mod:`companion.data.vocab`: the special tokens ``<pad>=0, <bos>=1, <eos>=2, <unk>=3``
  (:data:`PAD_ID` …), :class:`WordTokenizer` (and the :class:`Tokenizer` protocol a subword
  tokenizer can follow) and :class:`Vocab` (chapters 5 and 8).
- :mod:`companion.data.toy`: :class:`CopyReverseDataset`, random digit sequences to copy or
  reverse, to debug a model in seconds (chapters 3, 5, 6 and 7).
- :mod:`companion.data.batching`: :class:`TranslationDataset`, :func:`collate_batch` (pads
  examples into ``src (batch, src_len)`` and ``tgt (batch, tgt_len)``, the target wrapped in
  ``<bos> … <eos>``), :class:`TokenBatchSampler` (batches of at most ``max_tokens`` tokens,
  similar lengths together) and :func:`padding_waste` (chapters 3-8).
- :mod:`companion.data.download`: :class:`ChecksumError`, :class:`DownloadError`, SHA-256
  checks and atomic downloads (chapter 8).
- :mod:`companion.data.multi30k`: Multi30k task 1 (29,000 / 1,014 / 1,000 sentence pairs):
  its files and checksums (:data:`MULTI30K_SHA256`), the cache folder
  (:func:`default_cache_dir`), a local copy (``root=`` or ``$MULTI30K_ROOT``) or a download,
  and :func:`load_multi30k`, the raw ``(de, en)`` pairs of one split (chapter 8).
- :mod:`companion.data.prepare`: :func:`prepare_multi30k` does all of it in one call and
  returns a :class:`Multi30kData` whose :meth:`~Multi30kData.loader` gives ready-made batches
  (chapter 8).
- :mod:`companion.data.objectives`: what a model trains on, as ``(inputs, targets, mask)``
  (:class:`ObjectiveExample`): :func:`causal_lm_example` (GPT), :func:`masked_lm_example`
  (BERT's 80/10/10), :func:`span_corruption_example` (T5; its steps :func:`random_spans` and
  :func:`corrupt_spans`) and :func:`prefix_lm_example` (chapter 10). A target equal to the
  pad id carries no loss.
- :mod:`companion.data.lm`: :func:`english_sentences` (Multi30k's English side),
  :class:`LanguageModelData` (a vocabulary from the training split and bucketed batches of
  ``<bos> words <eos>`` rows) and :func:`ngram_perplexity` (add-k unigram/bigram baselines)
  (chapter 10).

Conventions: a source sequence carries no special tokens; a target sequence gets ``<bos>`` in
front and ``<eos>`` at the end when it is collated, so a model reads ``tgt[:, :-1]`` and
predicts ``tgt[:, 1:]``. Padding is always :data:`PAD_ID` (0).
"""

from __future__ import annotations

from companion.data.batching import (
    TokenBatchSampler,
    TranslationDataset,
    collate_batch,
    padding_waste,
)
from companion.data.download import (
    ChecksumError,
    DownloadError,
    sha256_of_file,
    verify_checksum,
)
from companion.data.lm import LanguageModelData, english_sentences, ngram_perplexity
from companion.data.multi30k import (
    BASE_URL_ENV_VAR,
    MULTI30K_NUM_PAIRS,
    MULTI30K_SHA256,
    MULTI30K_SPLITS,
    MULTI30K_URL,
    ROOT_ENV_VAR,
    default_cache_dir,
    load_multi30k,
    multi30k_files,
    read_parallel,
)
from companion.data.objectives import (
    MASK_FRACTION,
    RANDOM_FRACTION,
    ObjectiveExample,
    causal_lm_example,
    corrupt_spans,
    masked_lm_example,
    prefix_lm_example,
    random_spans,
    span_corruption_example,
)
from companion.data.prepare import Multi30kData, prepare_multi30k
from companion.data.toy import CopyReverseDataset
from companion.data.vocab import (
    BOS,
    BOS_ID,
    EOS,
    EOS_ID,
    PAD,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK,
    UNK_ID,
    Tokenizer,
    Vocab,
    WordTokenizer,
)

__all__ = [
    "PAD",
    "BOS",
    "EOS",
    "UNK",
    "SPECIAL_TOKENS",
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "UNK_ID",
    "CopyReverseDataset",
    "MULTI30K_URL",
    "MULTI30K_SPLITS",
    "MULTI30K_NUM_PAIRS",
    "MULTI30K_SHA256",
    "ROOT_ENV_VAR",
    "BASE_URL_ENV_VAR",
    "ChecksumError",
    "DownloadError",
    "default_cache_dir",
    "sha256_of_file",
    "verify_checksum",
    "multi30k_files",
    "read_parallel",
    "load_multi30k",
    "Tokenizer",
    "WordTokenizer",
    "Vocab",
    "TranslationDataset",
    "collate_batch",
    "TokenBatchSampler",
    "padding_waste",
    "Multi30kData",
    "prepare_multi30k",
    "ObjectiveExample",
    "MASK_FRACTION",
    "RANDOM_FRACTION",
    "causal_lm_example",
    "masked_lm_example",
    "random_spans",
    "corrupt_spans",
    "span_corruption_example",
    "prefix_lm_example",
    "english_sentences",
    "LanguageModelData",
    "ngram_perplexity",
]
