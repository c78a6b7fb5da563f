"""Extensions: features of newer PyTorch versions, for the comparisons only."""

from __future__ import annotations

import torch
from torch import nn

_FEATURES = {
    "nn.RMSNorm": ((2, 4), lambda: hasattr(nn, "RMSNorm")),
    "enable_gqa": ((2, 5), None),  # a keyword of F.scaled_dot_product_attention: known by version
}


def _torch_version() -> tuple[int, int]:
    major, minor = str(torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def torch_lacks(feature: str) -> str | None:
    """``None`` when the installed torch has ``feature`` (``"nn.RMSNorm"``, added in 2.4, or
    ``"enable_gqa"`` of ``F.scaled_dot_product_attention``, added in 2.5); otherwise a sentence saying
    that the comparison with it is skipped, and why. The package never needs either feature."""
    if feature not in _FEATURES:
        raise ValueError(f"unknown feature {feature!r}; known: {sorted(_FEATURES)}")
    since, probe = _FEATURES[feature]
    has = probe() if probe is not None else _torch_version() >= since
    if has:
        return None
    return (
        f"torch {torch.__version__} has no {feature} (added in {since[0]}.{since[1]}); the comparison "
        "with it is skipped, and the package's own implementation is checked against the formula"
    )
