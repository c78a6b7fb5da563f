"""Attention as a weighted average: the constraints on the weights, and convolution as a fixed weighting.

Chapter: *Attention as a weighted average* (the lecture notes on Bishop & Bishop's chapter 12,
``bishop2024notes``, in the notes' own numbering: sec. 2.1-2.7, with sec. 2.2 and 2.9.3 on fixed
versus data-dependent weights, eq. 5-6 for the dot-product weights of the chapter's example and
sec. 2.13 for the cost; Turner 2023 sec. 2.1, eq. 1-2 and footnotes 4-5). The weights themselves,
computed from the data, are chapter *Self-attention*'s (:mod:`.self_attention`).

Convention: rows are tokens. A sequence ``X`` is ``(..., N, D)``; an attention matrix ``A`` is
``(N, N)`` with row ``n`` holding the weights of output token ``n`` (``A[n, m]`` is how much output
``n`` takes from input ``m``), so that ``Y = A @ X``.

A 1-D convolution layer of a CNN (``torch.nn.functional.conv1d``) computes, with ``J`` taps and the
kernel's centre at tap ``j0 = (J - 1) // 2``,

.. math:: y_n = \\sum_{j=0}^{J-1} \\kappa_j \\, x_{n + j - j_0},

which is a *cross-correlation* (no kernel flip), as in every deep-learning library. Written as a
weighted sum of the tokens it is ``Y = A X`` with the Toeplitz matrix ``A[n, m] = kernel[m - n + j0]``
(zero outside the kernel): each row is the same kernel shifted by one position. Turner (2023,
footnote 4) writes the same fact in his column form as :math:`A_{n',n} = A_{n'-n}`; his matrix is the
transpose of ours, ``A_Turner[n', n] = A[n, n'] = kernel[n' - n + j0]``, a function of ``n' - n``
only.

Whether ``A`` is a valid matrix of attention weights (:func:`constraint_violations`) depends on the
kernel and the padding. With circular padding, and with replicate padding when ``J <= N``, every row
sums to the kernel's sum and some row holds every tap on its own, so exactly the averaging kernels
qualify (taps non-negative, summing to one). With zero padding and ``J <= N`` the rows at the ends
lose taps, and only the identity's kernel (a single tap 1 at the centre) keeps every row valid.
Longer kernels need not sum to one: ``2N - 1`` taps that repeat with period ``N`` give a valid
circulant matrix whatever their sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "PADDINGS",
    "constraint_violations",
    "contraction_coefficient",
    "convolution_as_attention",
    "convolve_tokens",
    "moving_average_kernel",
]

PADDINGS = ("zeros", "circular", "replicate")
"""How a convolution treats positions outside ``0..N-1``: read zeros, wrap around, or repeat the
end token (the names of ``torch.nn.Conv1d``'s ``padding_mode``)."""


def _as_kernel(kernel: Tensor | Sequence[float]) -> Tensor:
    if not isinstance(kernel, Tensor):
        try:
            kernel = torch.as_tensor(kernel, dtype=torch.get_default_dtype())
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                f"kernel must be a 1-D torch.Tensor or a sequence of numbers, got "
                f"{type(kernel).__name__}"
            ) from err
    if not kernel.is_floating_point():
        raise TypeError(
            f"kernel has dtype {kernel.dtype}; use a floating point kernel, e.g. kernel.float()"
        )
    if kernel.dim() != 1:
        hint = (
            "; a conv1d weight of shape (out, in, J) holds several kernels: pass one, weight[o, i]"
            if kernel.dim() == 3
            else ""
        )
        raise ValueError(f"kernel must be 1-D with J taps, got shape {tuple(kernel.shape)}{hint}")
    if kernel.numel() == 0:
        raise ValueError("kernel is empty; a convolution needs at least one tap (J >= 1)")
    return kernel


def _check_size(J: int, N: int, padding: str) -> None:
    if isinstance(N, bool) or not isinstance(N, int):
        raise TypeError(f"N (the number of tokens) must be an int, got {type(N).__name__}")
    if N < 1:
        raise ValueError(f"N (the number of tokens) must be at least 1, got {N}")
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    if padding == "zeros" and J > 2 * N - 1:
        raise ValueError(
            f"the kernel has J={J} taps but N={N} tokens only have 2N-1={2 * N - 1} relative "
            f"offsets (-{N - 1}..{N - 1}); taps beyond them would never touch the sequence. "
            f"Use at most {2 * N - 1} taps or a longer sequence."
        )
    if padding == "circular" and J > N:
        raise ValueError(
            f"circular padding wraps the sequence around once, so the kernel (J={J} taps) may be "
            f"at most as long as the sequence (N={N} tokens)"
        )


def convolution_as_attention(
    kernel: Tensor | Sequence[float], N: int, padding: str = "zeros"
) -> Tensor:
    r"""The ``(N, N)`` attention matrix of a 1-D convolution, book eq. ``eq-avg-toeplitz``.

    Implements: eq-avg-toeplitz

    .. math:: a_{nm} = \kappa_{m - n + j_0}, \qquad j_0 = \lfloor (J-1)/2 \rfloor,

    and ``A[n, m] = 0`` where ``m - n + j0`` is not a tap ``0..J-1``. Then ``A @ X`` equals
    ``F.conv1d`` of every column of ``X`` with ``kernel`` and ``padding="same"`` (a
    cross-correlation: the kernel is *not* flipped). For an even ``J`` the centre is the left one of
    the two middle taps, so output ``n`` reads inputs ``n - j0 .. n + j0 + 1``, exactly as PyTorch
    pads for ``"same"`` (one more zero on the right).

    Every row is the kernel shifted by one place (a Toeplitz matrix). Turner (2023, fn. 4) writes
    this as :math:`A_{n',n} = A_{n'-n}` in his column form, whose matrix is the transpose of ours.

    Args:
        kernel: the ``J`` taps ``kappa_0 .. kappa_{J-1}`` (a 1-D floating tensor or a list of
            numbers); the result has its dtype and device.
        N: the number of tokens.
        padding: what lies beyond the ends: ``"zeros"`` (rows near the ends lose the taps that fall
            off the sequence), ``"circular"`` (they wrap around: a circulant matrix) or
            ``"replicate"`` (they reread the end token).

    Returns:
        ``A`` of shape ``(N, N)``; with ``"circular"`` or ``"replicate"`` every row sums to
        ``kernel.sum()``; with ``"zeros"`` the rows whose window lies inside the sequence do, and the
        others lose the taps that fall off it.

    Raises:
        TypeError: for a non-float kernel or a non-integer ``N``.
        ValueError: for an empty or multi-dimensional kernel, an unknown padding, ``N < 1``, more
            than ``2N - 1`` taps with zero padding (the extra taps could never touch the sequence),
            or more than ``N`` taps with circular padding.
    """
    kernel = _as_kernel(kernel)
    J = kernel.numel()
    _check_size(J, N, padding)
    j0 = (J - 1) // 2  # the centre tap
    n = torch.arange(N, device=kernel.device)[:, None]  # (N, 1) output positions
    j = torch.arange(J, device=kernel.device)[None, :]  # (1, J) taps
    p = n + j - j0  # (N, J): the input position that tap j of output n reads
    w = kernel.expand(N, J)  # (N, J): the weight it reads with
    if padding == "zeros":
        w = w * ((p >= 0) & (p < N))  # taps that fall off the sequence read zeros
        p = p.clamp(0, N - 1)  # (their weight is 0, so any valid index will do)
    elif padding == "circular":
        p = p % N
    else:  # replicate
        p = p.clamp(0, N - 1)
    A = torch.zeros(N, N, dtype=kernel.dtype, device=kernel.device)
    return A.scatter_add(1, p, w)  # A[n, p[n, j]] += w[n, j]; several taps may share one input


def convolve_tokens(X: Tensor, kernel: Tensor | Sequence[float], padding: str = "zeros") -> Tensor:
    """Convolve every feature column of ``X`` with ``kernel`` using ``F.conv1d``, book eq. ``eq-avg-conv``.

    Implements: eq-avg-conv

    The efficient counterpart of ``convolution_as_attention(kernel, N, padding) @ X`` (tested
    equal): the same kernel is applied to each of the ``D`` features separately, as attention
    applies the same weights to every feature (Turner 2023, sec. 2.1).

    Args:
        X: tokens ``(..., N, D)``, one per row.
        kernel: ``J`` taps, as in :func:`convolution_as_attention`.
        padding: ``"zeros"``, ``"circular"`` or ``"replicate"``.

    Returns:
        ``Y`` of shape ``(..., N, D)``.

    Raises:
        ValueError / TypeError: as :func:`convolution_as_attention`, and when ``X`` is not
        ``(..., N, D)`` or its dtype differs from the kernel's.
    """
    if not isinstance(X, Tensor) or X.dim() < 2:
        got = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X must be a tensor of shape (..., N, D) with rows as tokens, got {got}")
    kernel = _as_kernel(
        kernel if isinstance(kernel, Tensor) else torch.as_tensor(kernel, dtype=X.dtype)
    )
    if kernel.dtype != X.dtype:
        raise TypeError(
            f"X has dtype {X.dtype} but the kernel has {kernel.dtype}; cast one with .to()"
        )
    *lead, N, D = X.shape
    J = kernel.numel()
    _check_size(J, N, padding)
    j0 = (J - 1) // 2  # the centre tap
    x = X.transpose(-2, -1).reshape(-1, 1, N)  # (B*D, 1, N): one channel per feature column
    mode = {"zeros": "constant", "circular": "circular", "replicate": "replicate"}[padding]
    x = F.pad(x, (j0, J - 1 - j0), mode=mode)  # (B*D, 1, N + J - 1)
    y = F.conv1d(x, kernel.view(1, 1, J))  # (B*D, 1, N)
    return y.reshape(*lead, D, N).transpose(-2, -1)  # (..., N, D)


def moving_average_kernel(
    width: int, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    """The ``width`` taps ``1/width``: non-negative and summing to one, a valid row of attention."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}")
    return torch.full((width,), 1.0 / width, dtype=dtype, device=device)


def constraint_violations(A: Tensor, atol: float = 1e-6) -> list[str]:
    r"""Which constraints on attention weights (book eq. ``eq-avg-constraints``) ``A`` breaks.

    Implements: eq-avg-constraints

    .. math:: a_{nm} \ge 0, \qquad \sum_m a_{nm} = 1 \quad \text{for every } n

    (The lecture notes on Bishop & Bishop, ``bishop2024notes``, eq. 3-4: the constraints hold
    separately for every output ``n``.)

    Args:
        A: weights ``(..., N, M)``, rows are outputs.
        atol: tolerance for a negative entry and for a row sum's distance from one.

    Returns:
        An empty list when ``A`` is a valid matrix of attention weights, else one sentence per
        broken constraint, naming how many rows break it and by how much.
    """
    if not isinstance(A, Tensor) or A.dim() < 2:
        got = tuple(A.shape) if isinstance(A, Tensor) else type(A).__name__
        raise ValueError(f"A must be a tensor of shape (..., N, M), rows are outputs; got {got}")
    A = A.detach()
    problems = []
    if not torch.isfinite(A).all():
        problems.append("some weights are NaN or infinite")
        return problems
    negative_rows = (A < -atol).any(dim=-1)  # (..., N)
    if negative_rows.any():
        problems.append(
            f"{int(negative_rows.sum())} of {negative_rows.numel()} rows have negative weights "
            f"(smallest {float(A.min()):.4g}); weights must be >= 0"
        )
    row_sums = A.sum(dim=-1)  # (..., N)
    off = (row_sums - 1).abs() > atol
    if off.any():
        problems.append(
            f"{int(off.sum())} of {off.numel()} rows do not sum to one (row sums from "
            f"{float(row_sums.min()):.4g} to {float(row_sums.max()):.4g})"
        )
    return problems


def contraction_coefficient(A: Tensor) -> Tensor:
    r"""Dobrushin's coefficient of ergodicity of attention weights, book eq. ``eq-avg-contraction``.

    Implements: eq-avg-contraction

    .. math:: \tau(A) = 1 - \min_{n_1, n_2} \sum_m \min(a_{n_1 m}, a_{n_2 m})

    For weights that satisfy eq. ``eq-avg-constraints`` (rows non-negative, summing to one) it lies in
    ``[0, 1]`` and bounds how much ``Y = A X`` shrinks the range of every feature over the tokens:
    ``max_n y_nd - min_n y_nd <= tau(A) (max_m x_md - min_m x_md)`` (Seneta 2006). An unmasked
    softmax makes every weight positive (in exact arithmetic), so ``tau(A) < 1`` and ``Y = A X``
    strictly contracts; repeated averages pull the tokens together when the product of their
    coefficients goes to zero.

    Args:
        A: weights ``(..., N, M)``, rows are outputs.

    Returns:
        ``tau`` of shape ``(...)``: one coefficient per matrix. It is ``0`` when all rows are equal
        and ``1`` when two rows share no input (e.g. the identity matrix with ``N >= 2``).

    Raises:
        ValueError: if ``A`` is not ``(..., N, M)`` or breaks the constraints (the bound needs them;
            :func:`constraint_violations` says which).
    """
    problems = constraint_violations(A)
    if problems:
        raise ValueError(
            "contraction_coefficient needs valid attention weights (rows >= 0, summing to one): "
            + "; ".join(problems)
        )
    overlap = torch.minimum(A[..., :, None, :], A[..., None, :, :]).sum(dim=-1)  # (..., N, N)
    return 1 - overlap.amin(dim=(-2, -1))
