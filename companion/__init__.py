"""companion - the tested code behind the course "Transformer, Step by Step".

One module per concept (ARCHITECTURE.md draws the stack): :mod:`companion.masking`,
:mod:`companion.positional`, :mod:`companion.attention`, :mod:`companion.cache`,
:mod:`companion.layers`, :mod:`companion.moe`, :mod:`companion.model`, :mod:`companion.families` (decoder-only and
encoder-only models), :mod:`companion.interop`, :mod:`companion.data`, training with
:mod:`companion.configs`, :mod:`companion.train` (one step), :mod:`companion.checkpoint`,
:mod:`companion.history`, :mod:`companion.distributed`, :mod:`companion.trainer` (the loop)
and :mod:`companion.run` (a whole run, the command line), :mod:`companion.decode`,
:mod:`companion.metrics`, :mod:`companion.viz`, :mod:`companion.exercises`,
:mod:`companion.utils`. The most used names are re-exported here; the data, training,
decoding and metrics modules are imported on their own
(``from companion.decode import greedy_decode``) so ``import companion`` stays light (the
re-exported model families bring :mod:`companion.decode` and :mod:`companion.data` along,
a few milliseconds).

Mask convention (whole package): a boolean mask is ``True`` where a query **may attend** to a
key; see :mod:`companion.masking`.
"""

from companion.attention import (
    AdditiveScore,
    MultiHeadAttention,
    scaled_dot_product_attention,
)
from companion.cache import DecoderCache, DecoderOnlyCache, KeyValueCache
from companion.families import DecoderOnlyTransformer, EncoderOnlyTransformer
from companion.interop import (
    from_torch,
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    to_torch,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)
from companion.layers import DecoderLayer, EncoderLayer, FeedForward
from companion.masking import (
    causal_mask,
    combine_masks,
    from_additive_mask,
    padding_mask,
    to_additive_mask,
)
from companion.model import (
    Decoder,
    Encoder,
    TokenEmbedding,
    Transformer,
    TransformerConfig,
)
from companion.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_frequencies,
    sinusoidal_shift_matrix,
    sinusoidal_table,
)
from companion.utils import check_shape, count_parameters, set_seed

__version__ = "0.1.0"

#: The course's source repository; the notebooks' install cell uses the same URL.
REPOSITORY_URL = "https://github.com/transformer-step-by-step/transformer-step-by-step"

__all__ = [
    # attention
    "scaled_dot_product_attention",
    "AdditiveScore",
    "MultiHeadAttention",
    "KeyValueCache",
    # masking
    "padding_mask",
    "causal_mask",
    "combine_masks",
    "from_additive_mask",
    "to_additive_mask",
    # interop with torch.nn
    "to_torch",
    "from_torch",
    "from_torch_key_padding_mask",
    "to_torch_key_padding_mask",
    "from_torch_attn_mask",
    "to_torch_attn_mask",
    # positional
    "sinusoidal_frequencies",
    "sinusoidal_table",
    "sinusoidal_shift_matrix",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    # layers
    "FeedForward",
    "EncoderLayer",
    "DecoderLayer",
    # model
    "TokenEmbedding",
    "Encoder",
    "Decoder",
    "DecoderCache",
    "TransformerConfig",
    "Transformer",
    # the other families (companion.families)
    "DecoderOnlyTransformer",
    "EncoderOnlyTransformer",
    "DecoderOnlyCache",
    # utils
    "check_shape",
    "count_parameters",
    "set_seed",
    "REPOSITORY_URL",
]
