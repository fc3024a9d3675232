"""companion - the tested code behind the course "Transformer, Step by Step".

One module per concept: :mod:`companion.attention`, :mod:`companion.viz`,
:mod:`companion.exercises`, :mod:`companion.utils` (more arrive with later chapters).
"""

from companion.attention import scaled_dot_product_attention
from companion.utils import check_shape, count_parameters, set_seed

__version__ = "0.1.0"

#: The course's source repository; the notebooks' install cell uses the same URL.
REPOSITORY_URL = "https://github.com/transformer-step-by-step/transformer-step-by-step"

__all__ = [
    "scaled_dot_product_attention",
    "check_shape",
    "count_parameters",
    "set_seed",
    "REPOSITORY_URL",
]
