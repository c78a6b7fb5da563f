"""Relations: argument checks."""

from __future__ import annotations

from torch import Tensor

from ..attention import PADDINGS
from ..runtime import shape_of as _shape


def _check_tokens(X: Tensor, name: str = "X", min_dim: int = 2) -> None:
    if not isinstance(X, Tensor) or X.dim() < min_dim:
        got = _shape(X) if isinstance(X, Tensor) else type(X).__name__
        want = "(..., N, D)" if min_dim == 2 else "(..., C_in, H_px, W_px)"
        raise ValueError(f"{name} must be a tensor of shape {want}, got {got}")
    if not X.is_floating_point():
        raise TypeError(
            f"{name} has dtype {X.dtype}; use floating point tokens, e.g. {name}.double()"
        )


def _check_size(name: str, value: int, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def _check_conv(X: Tensor, weight: Tensor, bias: Tensor | None, dims: int, padding: str) -> None:
    """Shapes, dtypes and padding of a convolution given as (tokens or image, PyTorch weight, bias)."""
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    layout = "(C_out, C_in, J)" if dims == 1 else "(C_out, C_in, J_h, J_w)"
    fn = "F.conv1d" if dims == 1 else "F.conv2d"
    if not isinstance(weight, Tensor) or weight.dim() != dims + 2:
        got = _shape(weight) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must have {fn}'s layout {layout}, got {got}")
    C_in = X.shape[-1] if dims == 1 else X.shape[-3]
    where = "features (last dim)" if dims == 1 else "channels (dim -3)"
    if weight.shape[1] != C_in:
        raise ValueError(
            f"weight {_shape(weight)} expects C_in={weight.shape[1]} input channels but X "
            f"{_shape(X)} has {C_in} {where}"
            + ("; rows are tokens, so a (C_in, N) signal must be transposed to (N, C_in)"
               if dims == 1 and X.shape[-2] == weight.shape[1] else "")
        )  # fmt: skip
    if weight.dtype != X.dtype:
        raise TypeError(f"X has dtype {X.dtype} but weight has {weight.dtype}; cast one with .to()")
    if bias is not None and (not isinstance(bias, Tensor) or bias.shape != (weight.shape[0],)):
        got = _shape(bias) if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(f"bias must be (C_out,) = ({weight.shape[0]},) or None, got {got}")
