"""Relations: convolution as attention with fixed shift matrices."""

from __future__ import annotations

import torch
from torch import Tensor

from ..attention import convolution_as_attention
from ..runtime import shape_of as _shape
from ._checks import _check_conv, _check_size, _check_tokens


def shift_matrices(
    N: int,
    J: int,
    padding: str = "zeros",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The ``J`` shift matrices :math:`\Lambda_{j-j_0}` of a ``J``-tap convolution, book eq.
    ``eq-rel-shift``.

    .. math:: (\Lambda_\delta)_{nm} = \begin{cases} 1 & m = n + \delta \\ 0 & \text{otherwise,}
              \end{cases} \qquad \delta = j - j_0,\quad j_0 = \lfloor (J-1)/2 \rfloor

    Matrix ``j`` is the attention matrix of the one-hot kernel ``e_j``, built by
    :func:`.attention.convolution_as_attention`, so it follows the same padding rules: with
    ``"zeros"`` a row whose neighbour ``n + delta`` falls off the sequence is all zero, with
    ``"circular"`` the index wraps around, with ``"replicate"`` it is clamped to the ends.

    Args:
        N: tokens; J: taps.
        padding: ``"zeros"``, ``"circular"`` or ``"replicate"``.
        dtype, device: of the result (default: torch's default dtype, the CPU).

    Returns:
        ``(J, N, N)``: every row of every matrix holds at most one 1 (exactly one unless zero-padded).

    Raises:
        ValueError: for ``J < 1``, ``N < 1``, an unknown padding, and the kernel lengths that
            :func:`.attention.convolution_as_attention` refuses.

    Implements: eq-rel-shift
    """
    _check_size("J (taps)", J)
    eye = torch.eye(J, dtype=dtype or torch.get_default_dtype(), device=device)
    return torch.stack([convolution_as_attention(eye[j], N, padding) for j in range(J)])


def shift_matrices_2d(
    H_px: int,
    W_px: int,
    J_h: int,
    J_w: int,
    padding: str = "zeros",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The ``J_h * J_w`` shift matrices of a 2-D convolution on pixels as tokens, book eq.
    ``eq-rel-conv2d``.

    The pixels of an ``H_px x W_px`` image are the ``N = H_px W_px`` tokens, row by row (pixel
    ``(i, j)`` is token ``i W_px + j``). Moving ``delta_1`` rows and ``delta_2`` columns is a Kronecker
    product of two 1-D shifts,

    .. math:: \Lambda_{\delta_1, \delta_2} = \Lambda^{(H_\text{px})}_{\delta_1} \otimes
              \Lambda^{(W_\text{px})}_{\delta_2},

    so every matrix is block Toeplitz with Toeplitz blocks ("doubly block Toeplitz").

    Returns:
        ``(J_h * J_w, N, N)``, tap ``(p, q)`` at index ``p * J_w + q`` (the order of
        ``weight.flatten(2)``).

    Raises:
        ValueError: as :func:`shift_matrices`, for each axis.

    Implements: eq-rel-conv2d
    """
    rows = shift_matrices(H_px, J_h, padding, dtype, device)  # (J_h, H_px, H_px)
    cols = shift_matrices(W_px, J_w, padding, dtype, device)  # (J_w, W_px, W_px)
    return torch.stack([torch.kron(r, c) for r in rows for c in cols])  # (J_h J_w, N, N)


def _read(p: int, N: int, padding: str) -> int | None:
    """The token that position ``p`` reads under ``padding`` (``None``: a zero beyond the ends)."""
    if 0 <= p < N:
        return p
    if padding == "zeros":
        return None
    return p % N if padding == "circular" else min(max(p, 0), N - 1)


def conv1d_reference(
    X: Tensor, weight: Tensor, bias: Tensor | None = None, padding: str = "zeros"
) -> Tensor:
    r"""A 1-D convolution layer written as its sum over taps, book eq. ``eq-rel-conv1d`` (loops).

    .. math:: \mathbf{y}_n = \mathbf{b} + \sum_{j=0}^{J-1} F_j^\top\, \mathbf{x}_{n+j-j_0},
              \qquad F_j = \texttt{weight[:, :, j]}^\top \in \mathbb{R}^{C_\text{in}\times C_\text{out}}

    This is ``F.conv1d`` with ``padding="same"`` (stride 1, no dilation, no groups) on the tokens'
    features as channels. Turner (2023, footnote 4) states the one-channel case.

    Args:
        X: tokens ``(..., N, C_in)``, rows are positions.
        weight: ``(C_out, C_in, J)``, PyTorch's layout; bias: ``(C_out,)`` or ``None``.
        padding: what lies beyond the ends: ``"zeros"``, ``"circular"`` or ``"replicate"``.

    Returns:
        ``Y`` of shape ``(..., N, C_out)``.

    Raises:
        ValueError / TypeError: when ``X``, ``weight``, ``bias`` do not fit, or for an unknown padding.
    """
    _check_tokens(X)
    _check_conv(X, weight, bias, 1, padding)
    N, J = X.shape[-2], weight.shape[-1]
    j0 = (J - 1) // 2  # the centre tap
    Y = X.new_zeros(*X.shape[:-1], weight.shape[0])  # (..., N, C_out)
    for n in range(N):
        for j in range(J):
            m = _read(n + j - j0, N, padding)
            if m is not None:
                Y[..., n, :] += X[..., m, :] @ weight[:, :, j].T  # x_m^T F_j
    return Y if bias is None else Y + bias


def conv1d_as_attention(
    X: Tensor, weight: Tensor, bias: Tensor | None = None, padding: str = "zeros"
) -> Tensor:
    r"""A 1-D convolution as ``J`` fixed attention matrices, book eq. ``eq-rel-conv1d``.

    .. math:: Y = \sum_{j=0}^{J-1} \Lambda_{j-j_0}\, X F_j + \mathbf{1}_N \mathbf{b}^\top

    Each tap is a head whose weights are the one-hot shift matrix :math:`\Lambda_{j-j_0}` (see
    :func:`shift_matrices`) and whose value-and-output map is :math:`F_j`. Same arguments, result and
    errors as :func:`conv1d_reference` (tested equal, and equal to ``F.conv1d``). With
    ``padding="circular"`` the layer commutes with every cyclic shift :math:`\Pi`,
    :math:`f(\Pi X) = \Pi f(X)` (book eq. ``eq-rel-equivariance``, tested); for a generic kernel with
    ``J > 1`` taps with no other permutation (a kernel symmetric in its taps also commutes with the
    reflection ``n -> -n mod N``, a single tap with every permutation; both tested).

    Implements: eq-rel-conv1d
    """
    _check_tokens(X)
    _check_conv(X, weight, bias, 1, padding)
    Lam = shift_matrices(X.shape[-2], weight.shape[-1], padding, X.dtype, X.device)  # (J, N, N)
    F_taps = weight.permute(2, 1, 0)  # (J, C_in, C_out): F_j = weight[:, :, j]^T
    Y = torch.einsum("jnm,...mi,jio->...no", Lam, X, F_taps)  # (..., N, C_out)
    return Y if bias is None else Y + bias


def conv1d_attention_matrix(weight: Tensor, N: int, padding: str = "zeros") -> Tensor:
    r"""The attention matrix of every (output, input) channel pair of a 1-D convolution, book eq.
    ``eq-rel-conv-channels``.

    .. math:: A^{(o,i)} = \sum_{j=0}^{J-1} \kappa^{(o,i)}_j \Lambda_{j-j_0}, \qquad
              A^{(o,i)}_{nm} = \kappa^{(o,i)}_{m-n+j_0}, \qquad
              Y_{:,o} = b_o + \sum_i A^{(o,i)} X_{:,i}

    with :math:`\kappa^{(o,i)}` the kernel ``weight[o, i]`` (in code, channels count from 0): one
    Toeplitz matrix (chapter *Attention*, eq. ``eq-avg-toeplitz``) per pair of channels. A signed
    matrix whose rows need not sum to one, so in general no softmax head's weights.

    Args:
        weight: ``(C_out, C_in, J)``; N: tokens; padding: as :func:`shift_matrices`.

    Returns:
        ``(C_out, C_in, N, N)``.

    Raises:
        ValueError: for a weight that is not 3-D, and as :func:`shift_matrices`.

    Implements: eq-rel-conv-channels
    """
    if not isinstance(weight, Tensor) or weight.dim() != 3 or not weight.is_floating_point():
        got = _shape(weight) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(
            f"weight must be a float tensor (C_out, C_in, J) as for F.conv1d, got {got}"
        )
    Lam = shift_matrices(N, weight.shape[-1], padding, weight.dtype, weight.device)  # (J, N, N)
    return torch.einsum("oij,jnm->oinm", weight, Lam)


def conv1d_flat_matrix(weight: Tensor, N: int, padding: str = "zeros") -> Tensor:
    r"""A 1-D convolution as one ``(N C_out) x (N C_in)`` matrix on the flattened sequence, book eq.
    ``eq-rel-conv-kron``.

    .. math:: \mathrm{vec}(Y - \mathbf{1}_N\mathbf{b}^\top) = \Big(\sum_{j=0}^{J-1}
              \Lambda_{j-j_0} \otimes F_j^\top\Big)\, \mathrm{vec}(X)

    with ``vec`` stacking rows (``X.reshape(-1)``): block ``(n, m)`` is :math:`F_{m-n+j_0}^\top`, a
    block-Toeplitz matrix. One attention head with fixed weights ``A`` and value-output map
    :math:`W_\text{vo}` (``C_in x C_out``) is the single term :math:`A \otimes W_\text{vo}^\top`
    (chapter *The transformer block*), whose blocks are all multiples of one matrix. So a layer of
    fixed heads needs at least as many heads as the rank of the blocks,
    :math:`\min(J, C_\text{in} C_\text{out})` for a generic kernel: a lower bound for any fixed
    matrices, signed or not. Softmax heads (non-negative rows summing to one) reach it with ``J``
    heads masked to one tap each (the book's construction), provided each head's value-output map
    may be any ``C_in x C_out`` matrix (heads as wide as the channels); with
    :math:`C_\text{in} C_\text{out} \ge J` that is exactly the bound, with fewer channel pairs the
    bound is met by signed matrices that no softmax head computes.

    Implements: eq-rel-conv-kron

    Returns:
        ``(N * C_out, N * C_in)``; raises as :func:`conv1d_attention_matrix`.
    """
    A = conv1d_attention_matrix(weight, N, padding)  # (C_out, C_in, N, N)
    C_out, C_in = A.shape[:2]
    return A.permute(2, 0, 3, 1).reshape(N * C_out, N * C_in)  # [(n, o), (m, i)]


def _image_tokens(X_img: Tensor) -> Tensor:
    """``(..., C_in, H_px, W_px) -> (..., N, C_in)``: the pixels as tokens, row by row."""
    return X_img.flatten(-2).transpose(-2, -1)


def conv2d_reference(
    X_img: Tensor, weight: Tensor, bias: Tensor | None = None, padding: str = "zeros"
) -> Tensor:
    r"""A 2-D convolution layer written as its sum over pixels and taps, book eq. ``eq-rel-conv2d``.

    .. math:: \mathbf{y}_{(r,c)} = \mathbf{b} + \sum_{p=0}^{J_h-1}\sum_{q=0}^{J_w-1}
              F_{pq}^\top\, \mathbf{x}_{(r+p-p_0,\ c+q-q_0)}

    for the pixel in row ``r`` and column ``c``, with :math:`F_{pq} = \texttt{weight[:, :, p, q]}^\top`
    and the centres :math:`p_0 = \lfloor (J_h-1)/2 \rfloor`, :math:`q_0 = \lfloor (J_w-1)/2 \rfloor`:
    ``F.conv2d`` with ``padding="same"``.

    Args:
        X_img: images ``(..., C_in, H_px, W_px)``, PyTorch's layout.
        weight: ``(C_out, C_in, J_h, J_w)``; bias: ``(C_out,)`` or ``None``; padding: as
            :func:`conv1d_reference`, applied to both axes.

    Returns:
        ``(..., C_out, H_px, W_px)``.

    Raises:
        ValueError / TypeError: when the image, weight or bias do not fit, or for an unknown padding.
    """
    _check_tokens(X_img, "X_img", min_dim=3)
    _check_conv(X_img, weight, bias, 2, padding)
    H_px, W_px = X_img.shape[-2:]
    J_h, J_w = weight.shape[-2:]
    c_h, c_w = (J_h - 1) // 2, (J_w - 1) // 2
    Y = X_img.new_zeros(*X_img.shape[:-3], weight.shape[0], H_px, W_px)
    for r in range(H_px):  # the output pixel (r, c)
        for c in range(W_px):
            for p in range(J_h):
                for q in range(J_w):
                    r_src = _read(r + p - c_h, H_px, padding)  # the input pixel (r_src, c_src)
                    c_src = _read(c + q - c_w, W_px, padding)
                    if r_src is not None and c_src is not None:
                        Y[..., :, r, c] += X_img[..., :, r_src, c_src] @ weight[:, :, p, q].T
    return Y if bias is None else Y + bias[:, None, None]


def conv2d_as_attention(
    X_img: Tensor, weight: Tensor, bias: Tensor | None = None, padding: str = "zeros"
) -> Tensor:
    r"""A 2-D convolution as ``J_h J_w`` fixed attention matrices on the pixels, book eq.
    ``eq-rel-conv2d``.

    .. math:: Y = \sum_{p,q} \Lambda_{p-p_0,\,q-q_0}\, X F_{pq} + \mathbf{1}_N \mathbf{b}^\top,
              \qquad \Lambda_{\delta_1,\delta_2} = \Lambda^{(H_\text{px})}_{\delta_1} \otimes
              \Lambda^{(W_\text{px})}_{\delta_2}

    on the ``N = H_px W_px`` pixels as tokens (:func:`shift_matrices_2d`). Same arguments, result
    and errors as :func:`conv2d_reference` (tested equal, and equal to ``F.conv2d``).

    Implements: eq-rel-conv2d
    """
    _check_tokens(X_img, "X_img", min_dim=3)
    _check_conv(X_img, weight, bias, 2, padding)
    H_px, W_px = X_img.shape[-2:]
    C_out, _, J_h, J_w = weight.shape
    Lam = shift_matrices_2d(H_px, W_px, J_h, J_w, padding, X_img.dtype, X_img.device)  # (T, N, N)
    F_taps = weight.flatten(2).permute(2, 1, 0)  # (J_h J_w, C_in, C_out), tap (p, q) at p J_w + q
    X = _image_tokens(X_img)  # (..., N, C_in)
    Y = torch.einsum("tnm,...mi,tio->...no", Lam, X, F_taps)  # (..., N, C_out)
    if bias is not None:
        Y = Y + bias
    return Y.transpose(-2, -1).reshape(*X_img.shape[:-3], C_out, H_px, W_px)


def relative_shift_attention(
    N: int,
    delta: int,
    alpha: float,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Softmax attention whose scores depend only on the relative position, book eq.
    ``eq-rel-quadratic``.

    .. math:: A_{nm} = \operatorname{softmax}_m\big(-\alpha\, (m - n - \delta)^2\big)

    Cordonnier et al. (2020) use such scores (their quadratic relative encoding) to show that a head
    can learn to attend to one relative position: as :math:`\alpha \to \infty` row ``n`` puts all its
    weight on the position nearest to ``n + delta``, so ``A`` tends to the shift matrix
    :math:`\Lambda_\delta` with *replicate* padding (a softmax row cannot be zero, so zero padding is
    out of reach; Cordonnier et al. obtain it by padding the image with zero pixels as extra tokens
    and cropping the output). The limit is never reached at a finite ``alpha``.

    Args:
        N: tokens; delta: the offset to attend to; alpha: the sharpness, ``>= 0``.
        dtype, device: of the result.

    Returns:
        ``(N, N)`` weights, every row non-negative and summing to one.

    Raises:
        ValueError: for ``N < 1``, a non-integer ``delta`` or a negative ``alpha``.

    Implements: eq-rel-quadratic
    """
    _check_size("N", N)
    if isinstance(delta, bool) or not isinstance(delta, int):
        raise ValueError(f"delta (the relative position) must be an int, got {delta!r}")
    if not alpha >= 0:
        raise ValueError(
            f"alpha must be >= 0 (a larger alpha means sharper attention), got {alpha}"
        )
    pos = torch.arange(N, dtype=dtype or torch.get_default_dtype(), device=device)
    S = -alpha * (pos[None, :] - pos[:, None] - delta) ** 2  # (N, N): scores of m for query n
    return torch.softmax(S, dim=-1)
