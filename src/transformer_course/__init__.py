"""transformer_course: the one tested implementation behind the course.

Every chapter of the book and every lab imports its equations from here (``import transformer_course
as tc``); nothing is copied into a page. Modules are named after the concept they implement and each
docstring names the chapter it serves.
"""

from importlib.metadata import PackageNotFoundError, version

from . import (
    attention,
    block,
    conventions,
    data,
    exercises,
    generate,
    models,
    multihead,
    plots,
    position,
    project,
    relations,
    runtime,
    tasks,
    tokens,
    train,
)
from .attention import (
    attention_weights,
    scaled_dot_product_attention,
    scaled_dot_product_attention_reference,
    self_attention,
    self_attention_reference,
)
from .runtime import default_device, seed_everything

try:
    __version__ = version("transformer-course")
except PackageNotFoundError:  # pragma: no cover - only when run from a source tree without install
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "attention",
    "attention_weights",
    "block",
    "conventions",
    "data",
    "default_device",
    "exercises",
    "generate",
    "models",
    "multihead",
    "plots",
    "position",
    "project",
    "relations",
    "runtime",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_reference",
    "seed_everything",
    "self_attention",
    "self_attention_reference",
    "tasks",
    "tokens",
    "train",
]
