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
              \in \mathbb{R}^{C_\text{in} P^2}

    Args:
        images: ``(B, C_in, H_px, W_px)``, ``H_px`` and ``W_px`` multiples of ``P``.
        patch_size: ``P``.
        stride: ``S``, the step between patches (the book's :math:`\Delta`); ``None`` means
            ``S = P`` (non-overlapping patches, the ViT's). With ``S < P`` the patches overlap (book
            eq. ``eq-vit-overlap``): the image is padded with ``(P - S) / 2`` zeros on every side and
            patch ``(i, j)`` starts at pixel ``(S i, S j)`` of the padded image, so
            ``N = (H_px / S) * (W_px / S)`` as with ``P = S``.

    Returns:
        ``(B, N, C_in*P*P)`` with ``N = (H_px/S) * (W_px/S)``. Patches are in row-major order (left
        to right along the top row of patches, then the next row down); each patch is flattened in
        ``(C_in, P, P)`` order, channel first, then pixel row, then pixel column.

    Raises:
        ValueError: for a 3-D image (add the batch dimension with ``unsqueeze(0)``), any other
            number of dimensions, ``H_px``/``W_px`` not divisible by ``S``, or ``P - S`` odd or
            negative.
    """
    P = _check_patch_size(patch_size)
    S = P if stride is None else _check_patch_size(stride, "stride")
    if not isinstance(images, Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.dim() == 3:
        raise ValueError(
            f"images has shape {_shape(images)}, one image (C_in, H_px, W_px); patchify takes a "
            "batch (B, C_in, H_px, W_px): add the batch dimension with images.unsqueeze(0)"
        )
    if images.dim() != 4:
        raise ValueError(f"images has shape {_shape(images)}; patchify takes (B, C_in, H_px, W_px)")
    if S != P:
        return _overlapping_patches(images, P, S)
    B, C_in, H_px, W_px = images.shape
    if H_px % P or W_px % P:
        raise ValueError(
            f"image size H_px x W_px = {H_px} x {W_px} is not divisible by patch_size={P}; crop or "
            f"pad the images to multiples of {P}, or choose a patch size that divides both"
        )
    x = images.reshape(B, C_in, H_px // P, P, W_px // P, P)  # (B, C_in, patch rows, P, cols, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H_px/P, W_px/P, C_in, P, P)
    return x.reshape(B, (H_px // P) * (W_px // P), C_in * P * P)


def _overlapping_patches(images: Tensor, P: int, S: int) -> Tensor:
    if S > P or (P - S) % 2:
        raise ValueError(
            f"overlapping patches need a stride S <= P with P - S even (the padding (P - S) / 2 "
            f"is split evenly), got patch_size={P}, stride={S}"
        )
    H_px, W_px = images.shape[-2:]
    if H_px % S or W_px % S:
        raise ValueError(f"image size H_px x W_px = {H_px} x {W_px} is not divisible by stride={S}")
    pad = (P - S) // 2
    cols = F.unfold(
        images, kernel_size=P, stride=S, padding=pad
    )  # (B, C_in*P*P, N), vec (C_in, P, P)
    return cols.transpose(1, 2)  # (B, N, C_in*P*P), patches row-major


def patchify_1d(series: Tensor, window: int) -> Tensor:
    r"""Cut sequences of vectors into non-overlapping windows and flatten each: 1-D patches.

    The time-series analogue of :func:`patchify`: ``C_in`` channels over ``T`` time steps become
    ``N = T / P`` rows, row ``n`` holding steps ``n P .. n P + P - 1`` of every channel; the window
    ``P`` is a one-dimensional patch. The rows are the
    :math:`\mathbf{f}_n` of book eq. ``eq-tok-linear``, which an ``nn.Linear`` maps to tokens.

    Implements: eq-tok-linear

    Args:
        series: ``(B, C_in, T)``, ``T`` a multiple of ``P``.
        window: ``P``, the number of time steps per token.

    Returns:
        ``(B, N, C_in*P)``; each window is flattened in ``(C_in, P)`` order, channel first, then
        time (the layout of a ``Conv1d`` weight, so ``Conv1d(C_in, D, kernel_size=P, stride=P)``
        with copied weights equals a linear map of these rows).

    Raises:
        ValueError: for a 2-D series (add the batch dimension with ``unsqueeze(0)``), any other
            number of dimensions, or ``T`` not divisible by ``P``.
    """
    L = _check_patch_size(window, "window")
    if not isinstance(series, Tensor):
        raise TypeError(f"series must be a torch.Tensor, got {type(series).__name__}")
    if series.dim() == 2:
        raise ValueError(
            f"series has shape {_shape(series)}, one series (C_in, T); patchify_1d takes a batch "
            "(B, C_in, T): add the batch dimension with series.unsqueeze(0)"
        )
    if series.dim() != 3:
        raise ValueError(f"series has shape {_shape(series)}; patchify_1d takes (B, C_in, T)")
    B, C_in, T = series.shape
    if T % L:
        raise ValueError(
            f"series length T={T} is not divisible by window={L}; crop or pad it to a multiple "
            f"of {L}, or choose a window that divides {T}"
        )
    x = series.reshape(B, C_in, T // L, L)  # (B, C_in, N, L)
    return x.permute(0, 2, 1, 3).reshape(B, T // L, C_in * L)  # (B, N, C_in*L)


def unpatchify(
    patches: Tensor, patch_size: int, image_size: int | tuple[int, int], channels: int
) -> Tensor:
    """The inverse of :func:`patchify`: ``(B, N, C_in*P*P)`` back to images ``(B, C_in, H_px, W_px)``.

    Args:
        patches: ``(B, N, C_in*P*P)`` in the layout :func:`patchify` returns.
        patch_size: ``P``.
        image_size: ``(H_px, W_px)``, or one int for square images.
        channels: ``C_in``.

    Raises:
        ValueError: if ``H_px`` or ``W_px`` is not divisible by ``P`` or ``patches`` is not
            ``(B, (H_px/P)*(W_px/P), C_in*P*P)``.
    """
    P = _check_patch_size(patch_size)
    H_px, W_px = (image_size, image_size) if isinstance(image_size, int) else image_size
    if H_px % P or W_px % P:
        raise ValueError(
            f"image size H_px x W_px = {H_px} x {W_px} is not divisible by patch_size={P}"
        )
    N, d = (H_px // P) * (W_px // P), channels * P * P
    if not isinstance(patches, Tensor) or patches.dim() != 3 or patches.shape[1:] != (N, d):
        got = _shape(patches) if isinstance(patches, Tensor) else type(patches).__name__
        raise ValueError(
            f"patches has shape {got} but {channels}-channel {H_px} x {W_px} images in {P} x {P} "
            f"patches need (B, N, C_in*P*P) = (B, {N}, {d})"
        )
    x = patches.reshape(patches.shape[0], H_px // P, W_px // P, channels, P, P)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(patches.shape[0], channels, H_px, W_px)


class PatchEmbedding(nn.Module):
    r"""Image to tokens: flatten each ``P x P`` patch and map it linearly to ``d_model``, book eq.
    ``eq-tok-patch``.

    .. math:: \mathbf{x}_n = W_p \operatorname{vec}(\text{patch}_n) + \mathbf{b}_p, \qquad
              W_p \in \mathbb{R}^{d_\text{model} \times C_\text{in} P^2}

    (Turner 2023, fig. 2 and fn. 19, where the map is :math:`W`; Dosovitskiy et al. 2021, eq. 1.) In
    row form for a batch: ``X = patchify(images) @ W_p^T + b_p``, shape ``(B, N, d_model)``; ``W_p``
    is ``self.proj.weight``, in ``nn.Linear``'s ``(out, in)`` layout, and ``b_p`` is
    ``self.proj.bias``.

    Implements: eq-tok-patch, eq-vit-patch, eq-vit-overlap

    Args:
        patch_size: ``P``.
        channels: ``C_in``, e.g. 3 for RGB.
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
        # nn.Linear stores W_p as (out, in) = (d_model, C_in*P*P) and computes x @ W_p^T + b.
        self.proj = nn.Linear(channels * patch_size * patch_size, d_model, bias=bias)

    def forward(self, images: Tensor) -> Tensor:
        """``images`` ``(B, C_in, H_px, W_px)`` to tokens ``(B, N, d_model)``,
        ``N = (H_px/P) * (W_px/P)``.

        Raises:
            ValueError: if ``C_in`` differs from ``channels`` or the shape does not suit
                :func:`patchify`.
        """
        if isinstance(images, Tensor) and images.dim() == 4 and images.shape[1] != self.channels:
            raise ValueError(
                f"images has shape {_shape(images)} with C_in={images.shape[1]} channels but this "
                f"PatchEmbedding was built for channels={self.channels}"
            )
        return self.proj(
            patchify(images, self.patch_size, self.stride)
        )  # (B, N, C_in P^2) W_p^T + b

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
            conv.weight.copy_(w.reshape(self.d_model, self.channels, P, P))  # vec is (C_in, P, P)
            if self.proj.bias is not None:
                conv.bias.copy_(self.proj.bias)
        return conv

    def extra_repr(self) -> str:
        overlap = f", stride={self.stride}" if self.stride != self.patch_size else ""
        return f"patch_size={self.patch_size}{overlap}, channels={self.channels}, d_model={self.d_model}"
