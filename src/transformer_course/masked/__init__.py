"""Masked models: encoders trained by hiding part of their input and predicting it.

Chapter: *Masked models*, the third family after the decoder-only language model (chapter 7) and the
encoder-decoder (chapter 8). One file per part:

* :mod:`.mlm`: masked language modelling (Devlin et al. 2019): the 80/10/10 corruption
  (:func:`mask_tokens`), the loss on the chosen positions (:func:`mlm_loss`), the encoder-only
  :class:`MaskedLM`, its recipe :data:`MLM_CPU_RECIPE` and :func:`train_char_mlm`;
* :mod:`.mae`: the masked auto-encoder for images (He et al. 2022): random patch masking
  (:func:`random_patch_mask`), an encoder that reads only the visible patches and a light decoder
  (:class:`MAE`), the loss on the hidden patches (:func:`mae_loss`), :data:`MAE_DIGITS_RECIPE` with
  :func:`train_mae_digits`, and the linear probe of the encoder (:func:`linear_probe`).
"""

from __future__ import annotations

from . import mae, mlm
from .mae import (
    DIGITS_ENCODER,
    MAE,
    MAE_DIGITS_RECIPE,
    MAEConfig,
    MAERecipe,
    MAERun,
    PatchMask,
    ProbeResult,
    encoder_features,
    fit_linear_probe,
    linear_probe,
    mae_loss,
    patch_targets,
    random_patch_mask,
    train_mae_digits,
)
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
    "DIGITS_ENCODER",
    "IGNORE_INDEX",
    "KEEP_FRAC",
    "MAE",
    "MAE_DIGITS_RECIPE",
    "MASK_FRAC",
    "MLM_CPU_RECIPE",
    "RANDOM_FRAC",
    "MAEConfig",
    "MAERecipe",
    "MAERun",
    "MLMRecipe",
    "MLMRun",
    "MaskedLM",
    "PatchMask",
    "ProbeResult",
    "corrupt",
    "encoder_features",
    "fit_linear_probe",
    "linear_probe",
    "lm_scores",
    "mae",
    "mae_loss",
    "mask_tokens",
    "mlm",
    "mlm_loss",
    "mlm_scores",
    "patch_targets",
    "random_patch_mask",
    "train_char_mlm",
    "train_mae_digits",
]
