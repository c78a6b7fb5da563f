"""Image patches and windows of a series as tokens: :func:`patchify`, :func:`patchify_1d`,
:func:`unpatchify` and :class:`PatchEmbedding` (Turner 2023, fig. 2; Dosovitskiy et al. 2021).

Convention: rows are tokens, so a batch of images becomes ``(B, N, d_model)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..runtime import shape_of as _shape


def _check_patch_size(patch_size: int, name: str = "patch_size") -> int:
    if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
        raise ValueError(f"{name} must be a positive int, got {patch_size!r}")
    return patch_size


def patchify(images: Tensor, patch_size: int, stride: int | None = None) -> Tensor:
    r"""Cut images into ``P x P`` patches and flatten each, the ``vec`` of Turner fig. 2: the rows
    :math:`\mathbf{p}_n` of the book's :math:`X_\text{pix}` in eqs. ``eq-tok-patch`` and ``eq-vit-patch``
    (:class:`PatchEmbedding` adds the linear map).

    .. math:: \text{row } n \text{ of the output} = \operatorname{vec}(\text{patch}_n)
              \in \mathbb{R}^{C P^2}

    Args:
        images: ``(B, C, H, W)``, ``H`` and ``W`` multiples of ``P``.
        patch_size: ``P``.
        stride: ``S``, the step between patches (the book's :math:`\Delta`); ``None`` means
            ``S = P`` (non-overlapping patches, the ViT's). With ``S < P`` the patches overlap (book
            eq. ``eq-vit-overlap``): the image is padded with ``(P - S) / 2`` zeros on every side and
            patch ``(i, j)`` starts at pixel ``(S i, S j)`` of the padded image, so
            ``N = (H / S) * (W / S)`` as with ``P = S``.

    Returns:
        ``(B, N, C*P*P)`` with ``N = (H/S) * (W/S)``. Patches are in row-major order (left to right
        along the top row of patches, then the next row down); each patch is flattened in
        ``(C, P, P)`` order, channel first, then pixel row, then pixel column.

    Raises:
        ValueError: for a 3-D image (add the batch dimension with ``unsqueeze(0)``), any other
            number of dimensions, ``H``/``W`` not divisible by ``S``, or ``P - S`` odd or negative.
    """
    P = _check_patch_size(patch_size)
    S = P if stride is None else _check_patch_size(stride, "stride")
    if not isinstance(images, Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.dim() == 3:
        raise ValueError(
            f"images has shape {_shape(images)}, one image (C, H, W); patchify takes a batch "
            "(B, C, H, W): add the batch dimension with images.unsqueeze(0)"
        )
    if images.dim() != 4:
        raise ValueError(f"images has shape {_shape(images)}; patchify takes (B, C, H, W)")
    if S != P:
        return _overlapping_patches(images, P, S)
    B, C, H, W = images.shape
    if H % P or W % P:
        raise ValueError(
            f"image size H x W = {H} x {W} is not divisible by patch_size={P}; crop or pad the "
            f"images to multiples of {P}, or choose a patch size that divides both"
        )
    x = images.reshape(B, C, H // P, P, W // P, P)  # (B, C, rows of patches, P, cols, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H/P, W/P, C, P, P)
    return x.reshape(B, (H // P) * (W // P), C * P * P)


def _overlapping_patches(images: Tensor, P: int, S: int) -> Tensor:
    if S > P or (P - S) % 2:
        raise ValueError(
            f"overlapping patches need a stride S <= P with P - S even (the padding (P - S) / 2 "
            f"is split evenly), got patch_size={P}, stride={S}"
        )
    H, W = images.shape[-2:]
    if H % S or W % S:
        raise ValueError(f"image size H x W = {H} x {W} is not divisible by stride={S}")
    pad = (P - S) // 2
    cols = F.unfold(images, kernel_size=P, stride=S, padding=pad)  # (B, C*P*P, N), vec in (C, P, P)
    return cols.transpose(1, 2)  # (B, N, C*P*P), patches row-major


def patchify_1d(series: Tensor, window: int) -> Tensor:
    r"""Cut sequences of vectors into non-overlapping windows and flatten each: 1-D patches.

    The time-series analogue of :func:`patchify`: ``C`` channels (the book's :math:`C_\text{in}`)
    over ``T`` time steps become ``N = T / P`` rows, row ``n`` holding steps ``n P .. n P + P - 1`` of
    every channel; the window ``P`` is a one-dimensional patch. The rows are the
    :math:`\mathbf{f}_n` of book eq. ``eq-tok-linear``, which an ``nn.Linear`` maps to tokens.

    Implements: eq-tok-linear

    Args:
        series: ``(B, C, T)``, ``T`` a multiple of ``P``.
        window: ``P``, the number of time steps per token.

    Returns:
        ``(B, N, C*P)``; each window is flattened in ``(C, P)`` order, channel first, then time
        (the layout of a ``Conv1d`` weight, so ``Conv1d(C, D, kernel_size=P, stride=P)`` with copied
        weights equals a linear map of these rows).

    Raises:
        ValueError: for a 2-D series (add the batch dimension with ``unsqueeze(0)``), any other
            number of dimensions, or ``T`` not divisible by ``P``.
    """
    L = _check_patch_size(window, "window")
    if not isinstance(series, Tensor):
        raise TypeError(f"series must be a torch.Tensor, got {type(series).__name__}")
    if series.dim() == 2:
        raise ValueError(
            f"series has shape {_shape(series)}, one series (C, T); patchify_1d takes a batch "
            "(B, C, T): add the batch dimension with series.unsqueeze(0)"
        )
    if series.dim() != 3:
        raise ValueError(f"series has shape {_shape(series)}; patchify_1d takes (B, C, T)")
    B, C, T = series.shape
    if T % L:
        raise ValueError(
            f"series length T={T} is not divisible by window={L}; crop or pad it to a multiple "
            f"of {L}, or choose a window that divides {T}"
        )
    x = series.reshape(B, C, T // L, L)  # (B, C, N, L)
    return x.permute(0, 2, 1, 3).reshape(B, T // L, C * L)  # (B, N, C*L)


def unpatchify(
    patches: Tensor, patch_size: int, image_size: int | tuple[int, int], channels: int
) -> Tensor:
    """The inverse of :func:`patchify`: ``(B, N, C*P*P)`` back to images ``(B, C, H, W)``.

    Args:
        patches: ``(B, N, C*P*P)`` in the layout :func:`patchify` returns.
        patch_size: ``P``.
        image_size: ``(H, W)``, or one int for square images.
        channels: ``C``.

    Raises:
        ValueError: if ``H`` or ``W`` is not divisible by ``P`` or ``patches`` is not
            ``(B, (H/P)*(W/P), C*P*P)``.
    """
    P = _check_patch_size(patch_size)
    H, W = (image_size, image_size) if isinstance(image_size, int) else image_size
    if H % P or W % P:
        raise ValueError(f"image size H x W = {H} x {W} is not divisible by patch_size={P}")
    N, D = (H // P) * (W // P), channels * P * P
    if not isinstance(patches, Tensor) or patches.dim() != 3 or patches.shape[1:] != (N, D):
        got = _shape(patches) if isinstance(patches, Tensor) else type(patches).__name__
        raise ValueError(
            f"patches has shape {got} but {channels}-channel {H} x {W} images in {P} x {P} "
            f"patches need (B, N, C*P*P) = (B, {N}, {D})"
        )
    x = patches.reshape(patches.shape[0], H // P, W // P, channels, P, P)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(patches.shape[0], channels, H, W)


class PatchEmbedding(nn.Module):
    r"""Image to tokens: flatten each ``P x P`` patch and map it linearly to ``d_model``, book eq.
    ``eq-tok-patch``.

    .. math:: \mathbf{x}_n = W \operatorname{vec}(\text{patch}_n) + \mathbf{b}, \qquad
              W \in \mathbb{R}^{d_\text{model} \times C P^2}

    (Turner 2023, fig. 2; Dosovitskiy et al. 2021, eq. 1; the book's :math:`W_p`.) In row form for a
    batch: ``X = patchify(images) @ W^T + b``, shape ``(B, N, d_model)``.

    Implements: eq-tok-patch, eq-vit-patch, eq-vit-overlap

    Args:
        patch_size: ``P``.
        channels: ``C``, e.g. 3 for RGB.
        d_model: width of each token.
        bias: whether to add ``b``.
        stride: ``S`` of :func:`patchify` (the book's :math:`\Delta`); ``None`` (the ViT's choice)
            gives non-overlapping patches, a smaller ``S`` overlapping ones (book eq.
            ``eq-vit-overlap``).
    """

    def __init__(
        self,
        patch_size: int,
        channels: int,
        d_model: int,
        bias: bool = True,
        stride: int | None = None,
    ) -> None:
        super().__init__()
        self.patch_size = _check_patch_size(patch_size)
        self.stride = self.patch_size if stride is None else _check_patch_size(stride, "stride")
        self.channels = channels
        self.d_model = d_model
        # nn.Linear stores W as (out, in) = (d_model, C*P*P) and computes x @ W^T + b.
        self.proj = nn.Linear(channels * patch_size * patch_size, d_model, bias=bias)

    def forward(self, images: Tensor) -> Tensor:
        """``images`` ``(B, C, H, W)`` to tokens ``(B, N, d_model)``, ``N = (H/P) * (W/P)``.

        Raises:
            ValueError: if ``C`` differs from ``channels`` or the shape does not suit
                :func:`patchify`.
        """
        if isinstance(images, Tensor) and images.dim() == 4 and images.shape[1] != self.channels:
            raise ValueError(
                f"images has shape {_shape(images)} with C={images.shape[1]} channels but this "
                f"PatchEmbedding was built for channels={self.channels}"
            )
        return self.proj(patchify(images, self.patch_size, self.stride))  # (B, N, C*P*P) @ W^T + b

    def as_conv2d(self) -> nn.Conv2d:
        """The same map as a convolution with ``kernel_size = P`` and ``stride = S`` (weights copied).

        ``conv(images).flatten(2).transpose(1, 2)`` equals ``self(images)``: a strided convolution
        applies one linear map to each patch, which is how ViTs are usually coded.
        """
        P, S, w = self.patch_size, self.stride, self.proj.weight
        conv = nn.Conv2d(
            self.channels,
            self.d_model,
            kernel_size=P,
            stride=S,
            padding=(P - S) // 2,
            bias=self.proj.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            conv.weight.copy_(w.reshape(self.d_model, self.channels, P, P))  # vec is (C, P, P)
            if self.proj.bias is not None:
                conv.bias.copy_(self.proj.bias)
        return conv

    def extra_repr(self) -> str:
        overlap = f", stride={self.stride}" if self.stride != self.patch_size else ""
        return f"patch_size={self.patch_size}{overlap}, channels={self.channels}, d_model={self.d_model}"
