"""Masked models: encoders trained by hiding part of their input and predicting it.

Chapter: *Masked models*, the third family after the decoder-only language model (chapter 7) and the
encoder-decoder (chapter 8). One file per part:

* :mod:`.mlm`: masked language modelling (Devlin et al. 2019): the 80/10/10 corruption
  (:func:`mask_tokens`), the loss on the chosen positions (:func:`mlm_loss`), the encoder-only
  :class:`MaskedLM`, its recipe :data:`MLM_CPU_RECIPE` and :func:`train_char_mlm`.
"""

from __future__ import annotations

from . import mlm
from .mlm import (
    IGNORE_INDEX,
    KEEP_FRAC,
    MASK_FRAC,
    MLM_CPU_RECIPE,
    RANDOM_FRAC,
    MaskedLM,
    MLMRecipe,
    MLMRun,
    corrupt,
    lm_scores,
    mask_tokens,
    mlm_loss,
    mlm_scores,
    train_char_mlm,
)

__all__ = [
    "IGNORE_INDEX",
    "KEEP_FRAC",
    "MASK_FRAC",
    "MLM_CPU_RECIPE",
    "RANDOM_FRAC",
    "MLMRecipe",
    "MLMRun",
    "MaskedLM",
    "corrupt",
    "lm_scores",
    "mask_tokens",
    "mlm",
    "mlm_loss",
    "mlm_scores",
    "train_char_mlm",
]
