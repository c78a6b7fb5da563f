"""transformer_course: the one tested implementation behind the course.

Every chapter of the book and every lab imports its equations from here (``import transformer_course
as tc``); nothing is copied into a page. Each chapter has one module of the same name (``tc.notation``,
``tc.tokens``, ``tc.attention``, ``tc.self_attention``, ``tc.multihead``, ``tc.block``, ``tc.position``,
``tc.language_models``, ``tc.encoder_decoder``, ``tc.vision``, ``tc.training``, ``tc.claims``,
``tc.relations``, ``tc.extensions``, ``tc.masked``; the long ones are subpackages with one file per
part); ``data``, ``train``, ``checkpoint``, ``kv_cache``, ``plots``,
``runtime``, ``results``, ``project``, ``interactive`` (figures a reader moves; the chapters' own are
in ``figures``) and ``checks`` (the book's one check helper,
:func:`checks.verify`) are shared infrastructure. The exercises of the labs,
``tc.exercises``, are imported only when first used.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version

from . import (
    attention,
    block,
    checkpoint,
    checks,
    claims,
    data,
    encoder_decoder,
    extensions,
    figures,
    interactive,
    kv_cache,
    language_models,
    masked,
    multihead,
    notation,
    plots,
    position,
    project,
    relations,
    results,
    runtime,
    self_attention,
    tokens,
    train,
    training,
    vision,
)
from .runtime import default_device, seed_everything
from .self_attention import (
    attention_weights,
    scaled_dot_product_attention,
    scaled_dot_product_attention_reference,
)

try:
    __version__ = version("transformer-course")
except PackageNotFoundError:  # pragma: no cover - only when run from a source tree without install
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "attention",
    "attention_weights",
    "block",
    "checkpoint",
    "checks",
    "claims",
    "data",
    "default_device",
    "encoder_decoder",
    "exercises",
    "extensions",
    "figures",
    "interactive",
    "kv_cache",
    "language_models",
    "masked",
    "multihead",
    "notation",
    "plots",
    "position",
    "project",
    "relations",
    "results",
    "runtime",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_reference",
    "seed_everything",
    "self_attention",
    "tokens",
    "train",
    "training",
    "vision",
]


def __getattr__(name: str):
    """``tc.exercises`` is imported on first use, so importing the package stays light."""
    if name == "exercises":
        return importlib.import_module(f"{__name__}.exercises")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
