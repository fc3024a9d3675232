"""companion.data, the package: every public name of the former single module is still here.

The tests of the parts live in files named after the submodules: test_vocab.py, test_toy.py,
test_batching.py, test_download.py, test_multi30k.py and test_prepare.py; the submodules added
for chapter 10 in test_objectives.py and test_lm_data.py.
"""

from __future__ import annotations

import importlib

import companion.data

#: ``companion.data.__all__`` before it became a package (companion/data.py), in its order.
PUBLIC_NAMES = [
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
]

#: Added for chapter 10: the training objectives and the language-model data.
CHAPTER_10_NAMES = [
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

SUBMODULES = ["vocab", "toy", "batching", "download", "multi30k", "prepare", "objectives", "lm"]


def test_all_is_exactly_the_former_public_names() -> None:
    assert companion.data.__all__ == PUBLIC_NAMES + CHAPTER_10_NAMES


def test_every_public_name_resolves() -> None:
    namespace: dict[str, object] = {}
    exec("from companion.data import *", namespace)
    assert set(PUBLIC_NAMES + CHAPTER_10_NAMES) <= namespace.keys()
    for name in PUBLIC_NAMES + CHAPTER_10_NAMES:
        assert getattr(companion.data, name) is namespace[name]


def test_each_name_comes_from_exactly_one_submodule() -> None:
    """The package re-exports; every public name is defined in (and listed by) one submodule."""
    owners: dict[str, list[str]] = {}
    for module_name in SUBMODULES:
        module = importlib.import_module(f"companion.data.{module_name}")
        for name in module.__all__:
            assert hasattr(module, name), f"companion.data.{module_name} lacks {name}"
            owners.setdefault(name, []).append(module_name)
    assert all(len(modules) == 1 for modules in owners.values()), owners
    for name in PUBLIC_NAMES + CHAPTER_10_NAMES:
        assert name in owners, f"{name} is not listed by any submodule's __all__"
        module = importlib.import_module(f"companion.data.{owners[name][0]}")
        assert getattr(module, name) is getattr(companion.data, name)
