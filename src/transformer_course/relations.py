"""Relations to CNNs, RNNs and GNNs: convolution as attention with fixed shift matrices, what recursion
does with distance, linear attention as a recurrent network, and attention as message passing on a graph.

Chapter: *Relations to CNNs, RNNs and GNNs* (Turner 2023, footnotes 4, 10 and 15; Cordonnier et al.
2020; Katharopoulos et al. 2020; Velickovic et al. 2018; Child et al. 2019). It builds on
:func:`.attention.convolution_as_attention` (one kernel, one channel: a Toeplitz matrix) and on the
message-passing section of chapter *The transformer block*.

Conventions: rows are tokens. A sequence ``X`` is ``(..., N, C_in)`` (a convolution's input channels are
the token's features); PyTorch's convolution weights keep their own layout, ``(C_out, C_in, J)`` in 1-D
and ``(C_out, C_in, J_h, J_w)`` in 2-D. Tap ``j`` of a 1-D kernel, ``F_j = weight[:, :, j].T``, is a
``(C_in, C_out)`` matrix and reads the token ``delta = j - j_0`` places away, ``j_0 = (J - 1) // 2`` (the
offsets of ``padding="same"``; no kernel flip: a cross-correlation, as in every deep-learning library).
The shift matrix ``Lambda_delta`` ``(N, N)`` has ``Lambda[n, m] = 1`` where ``m = n + delta`` (zero padding:
rows whose neighbour falls off the sequence are zero).

Graphs are lists of directed edges ``(E, 2)``, one row ``(m, n)`` per edge, read "node ``m`` sends a
message to node ``n``". Node ``n`` attends to its in-neighbours, so the attention mask (``True`` = query
``n`` may attend to key ``m``, the package's convention) is the *transpose* of the adjacency matrix
``Adj[m, n] = 1``: :func:`adjacency_mask` builds it from the edges. A node without incoming edges gets a
zero output, the package's rule for a query that may attend to nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import PADDINGS, convolution_as_attention
from .runtime import shape_of as _shape
from .self_attention import single_head

__all__ = [
    "TanhRNN",
    "adjacency_mask",
    "autograd_depth",
    "conv1d_as_attention",
    "conv1d_attention_matrix",
    "conv1d_flat_matrix",
    "conv1d_reference",
    "conv2d_as_attention",
    "conv2d_reference",
    "edges_of",
    "elu_feature_map",
    "gat_attention",
    "gat_attention_loop",
    "gat_scores",
    "graph_attention",
    "graph_attention_edges",
    "graph_attention_loop",
    "influence",
    "influence_vs_distance",
    "influence_vs_length",
    "linear_attention_parallel",
    "linear_attention_recurrent",
    "linear_attention_step",
    "output_jacobian",
    "relative_shift_attention",
    "rnn_state_jacobian",
    "shift_matrices",
    "shift_matrices_2d",
    "strided_edges",
    "tanh_rnn_reference",
    "window_edge_count",
    "window_edges",
]


# ---------------------------------------------------------------------------------------------------
# Argument checks


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


# ---------------------------------------------------------------------------------------------------
# Convolution as attention with fixed shift matrices


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
    c = (J - 1) // 2
    Y = X.new_zeros(*X.shape[:-1], weight.shape[0])  # (..., N, C_out)
    for n in range(N):
        for j in range(J):
            m = _read(n + j - c, N, padding)
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
    ``padding="circular"`` the layer commutes with the cyclic shift :math:`\Pi`,
    :math:`f(\Pi X) = \Pi f(X)` (book eq. ``eq-rel-equivariance``, tested), and with no other
    permutation.

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

    .. math:: A^{(o,i)} = \sum_{j=0}^{J-1} k^{(o,i)}_j \Lambda_{j-j_0}, \qquad
              A^{(o,i)}_{nm} = k^{(o,i)}_{m-n+j_0}, \qquad
              Y_{:,o} = b_o + \sum_i A^{(o,i)} X_{:,i}

    with :math:`k^{(o,i)} = \texttt{weight[o, i]}`: one Toeplitz matrix (chapter *Attention*, eq.
    ``eq-avg-toeplitz``) per pair of channels.

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
    block-Toeplitz matrix. One attention head with fixed weights ``A`` and value-output map ``W`` is
    the single term :math:`A \otimes W^\top` (chapter *The transformer block*), whose blocks are all
    multiples of one matrix. So a layer of fixed heads needs at least as many heads as the rank of the
    blocks, :math:`\min(J, C_\text{in} C_\text{out})` for a generic kernel: a lower bound for any
    fixed matrices, signed or not. Softmax heads (non-negative rows summing to one) reach it with
    ``J`` heads masked to one tap each (the book's construction); with
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

    .. math:: \mathbf{y}_{(i,j)} = \mathbf{b} + \sum_{p=0}^{J_h-1}\sum_{q=0}^{J_w-1}
              F_{pq}^\top\, \mathbf{x}_{(i+p-p_0,\ j+q-q_0)}

    with :math:`F_{pq} = \texttt{weight[:, :, p, q]}^\top` and the centres
    :math:`p_0 = \lfloor (J_h-1)/2 \rfloor`, :math:`q_0 = \lfloor (J_w-1)/2 \rfloor`: ``F.conv2d``
    with ``padding="same"``.

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
    for i in range(H_px):
        for j in range(W_px):
            for p in range(J_h):
                for q in range(J_w):
                    r, s = _read(i + p - c_h, H_px, padding), _read(j + q - c_w, W_px, padding)
                    if r is not None and s is not None:
                        Y[..., :, i, j] += X_img[..., :, r, s] @ weight[:, :, p, q].T
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
    out of reach).

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


# ---------------------------------------------------------------------------------------------------
# Recurrent networks


def tanh_rnn_reference(
    X: Tensor, W_x: Tensor, W_s: Tensor, b: Tensor, s_0: Tensor | None = None
) -> Tensor:
    r"""An Elman (tanh) recurrent network, one step after the other, book eq. ``eq-rel-rnn``.

    .. math:: \mathbf{s}_n = \tanh\big(W_\text{x}^\top \mathbf{x}_n + W_\text{s}^\top \mathbf{s}_{n-1}
              + \mathbf{b}_\text{s}\big), \qquad \mathbf{s}_0 = \mathbf{0}

    Turner (2023, footnote 10) writes it :math:`x^{(1)}_n = f(x^{(1)}_{n-1}; x^{(0)}_n)`.

    Args:
        X: tokens ``(..., N, D)``.
        W_x: ``(D, D_s)``; W_s: ``(D_s, D_s)``; b: ``(D_s,)`` (``nn.RNN``'s ``b_ih + b_hh``).
        s_0: the initial state ``(..., D_s)``; default zeros.

    Returns:
        The states ``(..., N, D_s)``, row ``n`` being :math:`\mathbf{s}_n`.

    Raises:
        ValueError: when the weights do not fit ``X`` or each other.

    Implements: eq-rel-rnn
    """
    _check_tokens(X)
    D = X.shape[-1]
    if W_x.dim() != 2 or W_x.shape[0] != D:
        hint = (
            "; it looks transposed (nn.RNN stores weight_ih as (D_s, D))"
            if W_x.shape[-1] == D
            else ""
        )
        raise ValueError(f"W_x has shape {_shape(W_x)} but must be (D, D_s) with D={D}{hint}")
    D_s = W_x.shape[1]
    if W_s.shape != (D_s, D_s) or b.shape != (D_s,):
        raise ValueError(
            f"W_s {_shape(W_s)} must be (D_s, D_s) and b {_shape(b)} must be (D_s,) with D_s={D_s}"
        )
    s = X.new_zeros(*X.shape[:-2], D_s) if s_0 is None else s_0  # (..., D_s)
    states = []
    for n in range(X.shape[-2]):  # N steps, each waiting for the previous one
        s = torch.tanh(X[..., n, :] @ W_x + s @ W_s + b)
        states.append(s)
    return torch.stack(states, dim=-2)  # (..., N, D_s)


class TanhRNN(nn.Module):
    """An Elman (tanh) recurrent layer, book eq. ``eq-rel-rnn``, computed by PyTorch's ``nn.RNN``.

    ``forward(X (B, N, D) or (N, D)) -> states (B, N, D_s) or (N, D_s)``. :attr:`weights` gives
    ``W_x``, ``W_s``, ``b`` in the course's ``x @ W`` convention for :func:`tanh_rnn_reference`
    (tested equal). ``nn.RNN`` stores ``weight_ih (D_s, D) = W_x^T`` and two biases that it adds.

    Implements: eq-rel-rnn
    """

    def __init__(self, d_in: int, d_state: int) -> None:
        super().__init__()
        _check_size("d_in", d_in)
        _check_size("d_state", d_state)
        self.rnn = nn.RNN(d_in, d_state, nonlinearity="tanh", batch_first=True)

    def forward(self, X: Tensor) -> Tensor:
        _check_tokens(X)
        if X.dim() not in (2, 3) or X.shape[-1] != self.rnn.input_size:
            raise ValueError(
                f"X has shape {_shape(X)} but TanhRNN(d_in={self.rnn.input_size}) expects "
                f"(B, N, {self.rnn.input_size}) or (N, {self.rnn.input_size})"
            )
        single = X.dim() == 2
        states, _ = self.rnn(X[None] if single else X)  # (B, N, D_s)
        return states[0] if single else states

    @property
    def weights(self) -> dict[str, Tensor]:
        """``W_x (D, D_s)``, ``W_s (D_s, D_s)`` and ``b (D_s,)`` for :func:`tanh_rnn_reference`."""
        r = self.rnn
        return {
            "W_x": r.weight_ih_l0.detach().T,
            "W_s": r.weight_hh_l0.detach().T,
            "b": (r.bias_ih_l0 + r.bias_hh_l0).detach(),
        }


def rnn_state_jacobian(X: Tensor, W_x: Tensor, W_s: Tensor, b: Tensor) -> Tensor:
    r"""How the last state of a tanh RNN depends on every token, by the chain rule, book eq.
    ``eq-rel-rnn-jacobian``.

    .. math:: \frac{\partial \mathbf{s}_N}{\partial \mathbf{x}_n} =
              \Big(\prod_{k=N}^{n+1} \mathcal{T}_k W_\text{s}^\top\Big)\, \mathcal{T}_n W_\text{x}^\top,
              \qquad \mathcal{T}_k = \operatorname{diag}\big(1 - \mathbf{s}_k^2\big)

    (the product ordered from ``k = N`` on the left down to ``n + 1``). Every factor has norm at most
    :math:`\lVert W_\text{s}\rVert_2`, so the block is at most
    :math:`\lVert W_\text{s}\rVert_2^{N-n}\lVert W_\text{x}\rVert_2` (Bengio et al. 1994; Pascanu
    et al. 2013).

    Args:
        X: one sequence ``(N, D)``; W_x, W_s, b: as :func:`tanh_rnn_reference`.

    Returns:
        ``(N, D_s, D)``: block ``n`` is :math:`\partial\mathbf{s}_N/\partial\mathbf{x}_n`.

    Raises:
        ValueError: for a batched ``X`` (pass one sequence) and as :func:`tanh_rnn_reference`.

    Implements: eq-rel-rnn-jacobian
    """
    if not isinstance(X, Tensor) or X.dim() != 2:
        got = _shape(X) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X must be one sequence (N, D), got {got}; loop over a batch yourself")
    with torch.no_grad():
        S = tanh_rnn_reference(X, W_x, W_s, b)  # (N, D_s)
    N, D_s = S.shape
    G = torch.eye(D_s, dtype=X.dtype, device=X.device)  # d s_N / d s_k, from k = N down
    blocks = [None] * N
    for n in range(N - 1, -1, -1):
        G_n = G * (1 - S[n] ** 2)  # (D_s, D_s): G T_n (scales the columns)
        blocks[n] = G_n @ W_x.T  # (D_s, D)
        G = G_n @ W_s.T  # one more step back
    return torch.stack(blocks)


def output_jacobian(f: Callable[[Tensor], Tensor], X: Tensor, n: int = -1) -> Tensor:
    r"""The blocks :math:`\partial \mathbf{y}_n / \partial \mathbf{x}_m` of a
    sequence map ``Y = f(X)`` for one output ``n`` and every input ``m``, by autograd.

    Args:
        f: maps one sequence ``(N, D)`` to ``(N, D_out)``.
        X: ``(N, D)``; n: the output token (default: the last).

    Returns:
        ``(N, D_out, D)``: block ``m`` is :math:`\partial \mathbf{y}_n / \partial \mathbf{x}_m`.

    Raises:
        ValueError: for a batched ``X`` or an ``f`` that does not return ``(N, D_out)``.
    """
    if not isinstance(X, Tensor) or X.dim() != 2:
        got = _shape(X) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X must be one sequence (N, D), got {got}")
    Y = f(X)
    if not isinstance(Y, Tensor) or Y.dim() != 2 or Y.shape[0] != X.shape[0]:
        got = _shape(Y) if isinstance(Y, Tensor) else type(Y).__name__
        raise ValueError(f"f must map (N, D) = {_shape(X)} to (N, D_out), got {got}")
    J = torch.autograd.functional.jacobian(lambda Z: f(Z)[n], X)  # (D_out, N, D)
    return J.permute(1, 0, 2)


def influence(f: Callable[[Tensor], Tensor], X: Tensor, n: int = -1) -> Tensor:
    r"""How strongly output ``n`` depends on each input token, book eq. ``eq-rel-influence``.

    .. math:: \iota_{nm} = \Big\lVert \frac{\partial \mathbf{y}_n}{\partial \mathbf{x}_m}\Big\rVert_F

    Returns ``(N,)``, entry ``m`` being :math:`\iota_{nm}`; arguments and errors as
    :func:`output_jacobian`.

    Implements: eq-rel-influence
    """
    return output_jacobian(f, X, n).flatten(1).norm(dim=-1)


def influence_vs_length(
    make_layer: Callable[[], nn.Module],
    lengths: Sequence[int],
    D: int,
    trials: int = 8,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    r"""The influence of the first token on the last output, :math:`\iota_{N1}`, for several lengths.

    For each trial a fresh layer is built by ``make_layer()`` (its parameters drawn from torch's
    generator seeded with ``seed + trial`` inside :func:`torch.random.fork_rng`, so the caller's
    random state is untouched) and one random sequence of ``max(lengths)`` tokens is drawn; for each
    ``N`` the layer reads the first ``N`` tokens and :func:`influence` measures
    :math:`\lVert\partial\mathbf{y}_N/\partial\mathbf{x}_1\rVert_F`.

    Args:
        make_layer: builds a module mapping ``(B, N, D)`` to ``(B, N, D_out)``, e.g.
            ``lambda: TanhRNN(D, D)`` or ``lambda: SelfAttention(D, H)``.
        lengths: the sequence lengths ``N`` (each ``>= 1``).
        D: token width; trials: independent layers and sequences; seed: of the first trial.
        dtype: of the tokens and the layers (float64 keeps tiny influences above underflow).

    Returns:
        ``(trials, len(lengths))`` influences.
    """
    lengths = [int(N) for N in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be a non-empty list of ints >= 1, got {lengths}")
    _check_size("trials", trials)
    out = torch.empty(trials, len(lengths), dtype=dtype)
    for t in range(trials):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + t)
            layer = make_layer().to(dtype)
            X = torch.randn(max(lengths), D, dtype=dtype)
        for i, N in enumerate(lengths):
            f = lambda Z, layer=layer: layer(Z[None])[0]  # noqa: E731  (one sequence at a time)
            out[t, i] = influence(f, X[:N])[0]
    return out


def influence_vs_distance(
    make_layer: Callable[[], nn.Module],
    N: int,
    D: int,
    trials: int = 8,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    r"""The influence :math:`\iota_{Nm}` of every token ``m`` on the last output of one sequence of ``N``
    tokens, for ``trials`` fresh layers and sequences (built and drawn as in
    :func:`influence_vs_length`).

    Returns:
        ``(trials, N)``; column ``m`` (from 0) is the influence of token ``m + 1``, at distance
        ``N - 1 - m`` from the output.
    """
    _check_size("N", N)
    _check_size("trials", trials)
    out = torch.empty(trials, N, dtype=dtype)
    for t in range(trials):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + t)
            layer = make_layer().to(dtype)
            X = torch.randn(N, D, dtype=dtype)
        f = lambda Z, layer=layer: layer(Z[None])[0]  # noqa: E731  (one sequence at a time)
        out[t] = influence(f, X)
    return out


def autograd_depth(y: Tensor) -> int:
    """The longest chain of operations autograd recorded from the leaves to ``y``.

    Operations on one chain must run one after the other, so this counts the *sequential* steps of a
    computation: it grows with ``N`` for a recurrence and stays fixed for attention.

    Raises:
        ValueError: when ``y`` was not computed from a tensor that requires gradients.
    """
    if not isinstance(y, Tensor) or y.grad_fn is None:
        raise ValueError("y has no autograd graph: compute it from inputs with requires_grad=True")
    depth: dict[object, int] = {}
    stack = [(y.grad_fn, False)]
    while stack:  # iterative post-order walk: a recursion would overflow on long chains
        node, expanded = stack.pop()
        if node in depth:
            continue
        parents = [p for p, _ in node.next_functions if p is not None]
        if expanded:
            depth[node] = 1 + max((depth[p] for p in parents), default=0)
        else:
            stack.append((node, True))
            stack.extend((p, False) for p in parents if p not in depth)
    return depth[y.grad_fn]


# ---------------------------------------------------------------------------------------------------
# Linear attention: a recurrent network with a matrix-valued state


def elu_feature_map(x: Tensor) -> Tensor:
    r"""The feature map :math:`\psi(\mathbf{x}) = \operatorname{elu}(\mathbf{x}) + 1` of Katharopoulos
    et al. (2020): positive, so every weight :math:`\psi(\mathbf{q})^\top\psi(\mathbf{k})` is too."""
    return F.elu(x) + 1


def _check_linear(Q: Tensor, K: Tensor, V: Tensor) -> None:
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        _check_tokens(t, name)
    if Q.shape != K.shape or V.shape[:-1] != K.shape[:-1]:
        raise ValueError(
            f"Q {_shape(Q)} and K {_shape(K)} must have one shape (..., N, d_k) and V {_shape(V)} "
            "the shape (..., N, d_v): linear attention here is self-attention, one key per query"
        )


def linear_attention_parallel(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    feature_map: Callable[[Tensor], Tensor] = elu_feature_map,
    causal: bool = True,
) -> Tensor:
    r"""Linear attention, all tokens at once, book eq. ``eq-rel-linear``.

    .. math:: \mathbf{y}_n = \frac{\sum_{m \le n} \psi(\mathbf{q}_n)^\top\psi(\mathbf{k}_m)\,
              \mathbf{v}_m}{\sum_{m \le n} \psi(\mathbf{q}_n)^\top\psi(\mathbf{k}_m)}

    (Katharopoulos et al. 2020): attention whose weights are the normalised rows of the masked
    matrix :math:`\psi(Q)\psi(K)^\top`, with no softmax. Causal: an ``(N, N)`` matrix, cost
    :math:`O(N^2 (d_\psi + d_v))` (``2 N^2 (d_psi + d_v)`` FLOPs of matrix products). With
    ``causal=False`` the sums run over all ``m`` and associativity, :math:`\psi(Q)\,(\psi(K)^\top V)`,
    gives cost :math:`O(N d_\psi d_v)` (``4 N d_psi d_v + 2 N d_psi``), linear in ``N``.

    Args:
        Q, K: ``(..., N, d_k)``; V: ``(..., N, d_v)``.
        feature_map: :math:`\psi`, applied row by row; it must give positive features.
        causal: token ``n`` reads tokens ``m <= n`` only.

    Returns:
        ``Y`` of shape ``(..., N, d_v)``; equal to :func:`linear_attention_recurrent` when causal.

    Raises:
        ValueError: when the shapes do not fit.

    Implements: eq-rel-linear
    """
    _check_linear(Q, K, V)
    PQ, PK = feature_map(Q), feature_map(K)  # (..., N, r)
    if not causal:
        num = PQ @ (PK.transpose(-2, -1) @ V)  # (..., N, d_v): the (r, d_v) sum first
        den = PQ @ PK.sum(dim=-2, keepdim=True).transpose(-2, -1)  # (..., N, 1)
        return num / den
    A = (PQ @ PK.transpose(-2, -1)).tril()  # (..., N, N): psi(q_n).psi(k_m) for m <= n, else 0
    return (A @ V) / A.sum(dim=-1, keepdim=True)  # each row normalised


def linear_attention_step(
    Gamma: Tensor,
    zeta: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map: Callable[[Tensor], Tensor] = elu_feature_map,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""One step of linear attention as a recurrent network, book eq. ``eq-rel-linear-rnn``.

    .. math:: \Gamma_t = \Gamma_{t-1} + \psi(\mathbf{k}_t)\,\mathbf{v}_t^\top, \qquad
              \boldsymbol{\zeta}_t = \boldsymbol{\zeta}_{t-1} + \psi(\mathbf{k}_t), \qquad
              \mathbf{y}_t = \frac{\Gamma_t^\top \psi(\mathbf{q}_t)}{\boldsymbol{\zeta}_t^\top
              \psi(\mathbf{q}_t)}

    The state :math:`(\Gamma_t, \boldsymbol\zeta_t)` has ``d_psi (d_v + 1)`` numbers whatever ``t`` is,
    so a step costs the same at every position (Katharopoulos et al. 2020).

    Args:
        Gamma: ``(..., d_psi, d_v)``; zeta: ``(..., d_psi)`` (zeros before the first token).
        q, k: ``(..., d_k)``; v: ``(..., d_v)``: the new token's query, key and value.
        feature_map: :math:`\psi` (``d_psi`` features of a ``d_k``-vector).

    Returns:
        ``(Gamma_t, zeta_t, y_t)`` with ``y_t`` of shape ``(..., d_v)``.

    Implements: eq-rel-linear-rnn
    """
    pk, pq = feature_map(k), feature_map(q)  # (..., r)
    Gamma = Gamma + pk[..., :, None] @ v[..., None, :]  # (..., r, d_v): add the outer product
    zeta = zeta + pk  # (..., r)
    num = (pq[..., None, :] @ Gamma)[..., 0, :]  # (..., d_v)
    den = (pq[..., None, :] @ zeta[..., :, None])[..., 0, :]  # (..., 1)
    return Gamma, zeta, num / den


def linear_attention_recurrent(
    Q: Tensor, K: Tensor, V: Tensor, feature_map: Callable[[Tensor], Tensor] = elu_feature_map
) -> Tensor:
    r"""Causal linear attention one token after the other, book eq. ``eq-rel-linear-rnn``: the loop
    of :func:`linear_attention_step` from :math:`\Gamma_0 = 0`, :math:`\boldsymbol\zeta_0 = 0`.

    Same arguments, result and errors as :func:`linear_attention_parallel` with ``causal=True``
    (tested equal).

    Implements: eq-rel-linear-rnn
    """
    _check_linear(Q, K, V)
    r = feature_map(K[..., :1, :]).shape[-1]
    Gamma = Q.new_zeros(*Q.shape[:-2], r, V.shape[-1])  # (..., r, d_v)
    zeta = Q.new_zeros(*Q.shape[:-2], r)  # (..., r)
    ys = []
    for t in range(Q.shape[-2]):
        Gamma, zeta, y = linear_attention_step(
            Gamma, zeta, Q[..., t, :], K[..., t, :], V[..., t, :], feature_map
        )
        ys.append(y)
    return torch.stack(ys, dim=-2)  # (..., N, d_v)


# ---------------------------------------------------------------------------------------------------
# Graphs: attention restricted to the edges


def _check_edges(edges: Tensor, N: int) -> Tensor:
    _check_size("N (nodes)", N)
    if not isinstance(edges, Tensor) or edges.dim() != 2 or edges.shape[1] != 2:
        got = _shape(edges) if isinstance(edges, Tensor) else type(edges).__name__
        raise ValueError(f"edges must be an (E, 2) tensor of (source m, target n) rows, got {got}")
    if edges.is_floating_point() or edges.dtype == torch.bool:
        raise TypeError(f"edges must hold integer node indices, got dtype {edges.dtype}")
    if edges.numel() and (edges.min() < 0 or edges.max() >= N):
        raise ValueError(
            f"edges name nodes {int(edges.min())}..{int(edges.max())} but the graph has N={N} "
            f"nodes 0..{N - 1}"
        )
    return edges.long()


def adjacency_mask(edges: Tensor, N: int) -> Tensor:
    r"""The attention mask of a graph, book eq. ``eq-rel-graph``: ``mask[n, m]`` is ``True`` when
    there is an edge ``m -> n``.

    .. math:: \mathsf{mask}_{nm} = [\, (m, n) \in \mathcal{E}\,] = \mathrm{Adj}_{mn}

    Query ``n`` attends to the nodes that send it messages, so the mask is the *transpose* of the
    adjacency matrix (``Adj[m, n] = 1`` for an edge ``m -> n``); for an undirected graph (every edge
    listed both ways) the two agree.

    Args:
        edges: ``(E, 2)`` integer tensor, one row ``(m, n)`` per directed edge ``m -> n``.
        N: nodes.

    Returns:
        bool ``(N, N)`` on the edges' device.

    Raises:
        ValueError / TypeError: for a malformed edge list or a node index outside ``0..N-1``.

    Implements: eq-rel-graph
    """
    edges = _check_edges(edges, N)
    mask = torch.zeros(N, N, dtype=torch.bool, device=edges.device)
    mask[edges[:, 1], edges[:, 0]] = True  # row = target (query), column = source (key)
    return mask


def edges_of(mask: Tensor) -> Tensor:
    """The edge list ``(E, 2)`` of rows ``(m, n)`` of an attention mask (the inverse of
    :func:`adjacency_mask`): every ``mask[n, m] == True`` is an edge ``m -> n``."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        got = _shape(mask) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a bool (N, N) tensor, got {got}")
    return mask.nonzero().flip(1)  # nonzero gives (n, m) rows


def window_edges(N: int, w: int, causal: bool = False) -> Tensor:
    r"""The graph of local (sliding-window) attention: an edge ``m -> n`` whenever
    :math:`|n - m| \le w` (and :math:`m \le n` if ``causal``), self-loops included. Here ``w`` is the
    reach, the tokens on each side; the book's window width is ``w + 1`` (book eq. ``eq-rel-window``
    and chapter *Extensions*, whose width counts the token itself).

    Built offset by offset, never as an ``N x N`` matrix, so long sequences are cheap. The number of
    edges is :func:`window_edge_count`.

    Implements: eq-rel-window

    Returns:
        ``(E, 2)`` long tensor of ``(m, n)`` rows.
    """
    _check_size("N", N)
    _check_size("w (window half-width)", w, least=0)
    n = torch.arange(N)
    parts = []
    for d in range(-w if not causal else 0, w + 1):  # m = n - d
        keep = (n - d >= 0) & (n - d < N)
        parts.append(torch.stack([n[keep] - d, n[keep]], dim=1))
    return torch.cat(parts)


def window_edge_count(N: int, w: int, causal: bool = False) -> int:
    r"""Edges of :func:`window_edges` for the reach ``w`` (book eq. ``eq-rel-window`` with the width
    ``w + 1``), with :math:`w' = \min(w, N-1)`:

    .. math:: |\mathcal{E}| = N(2w'+1) - w'(w'+1) \quad\text{or, causal,}\quad
              N(w'+1) - \tfrac{1}{2} w'(w'+1)

    Implements: eq-rel-window
    """
    _check_size("N", N)
    _check_size("w (window half-width)", w, least=0)
    w = min(w, N - 1)
    return N * (w + 1) - w * (w + 1) // 2 if causal else N * (2 * w + 1) - w * (w + 1)


def strided_edges(N: int, stride: int) -> Tensor:
    r"""The causal graph of the strided sparse attention of Child et al. (2019), both of its heads
    together: node ``n`` reads the ``stride`` nodes before it and every ``stride``-th node before
    those, an edge ``m -> n`` whenever :math:`0 \le n - m \le \text{stride}` or ``stride`` divides
    :math:`n - m`. With ``stride`` about :math:`\sqrt N` a node has about :math:`2\sqrt N`
    in-neighbours, :math:`O(N\sqrt N)` edges in all.

    Returns:
        ``(E, 2)`` long tensor of ``(m, n)`` rows, each edge once.
    """
    _check_size("N", N)
    _check_size("stride", stride)
    offsets = sorted(set(range(min(stride, N - 1) + 1)) | set(range(0, N, stride)))
    n = torch.arange(N)
    return torch.cat([torch.stack([n[d:] - d, n[d:]], dim=1) for d in offsets])


def _check_graph_weights(X: Tensor, **W: Tensor) -> None:
    _check_tokens(X)
    D = X.shape[-1]
    for name, w in W.items():
        if not isinstance(w, Tensor) or w.dim() != 2 or w.shape[0] != D:
            got = _shape(w) if isinstance(w, Tensor) else type(w).__name__
            raise ValueError(f"{name} must be (D, d) = ({D}, d) for X {_shape(X)}, got {got}")


def graph_attention_loop(X: Tensor, edges: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor) -> Tensor:
    r"""Dot-product attention as message passing, node by node and edge by edge, book eq.
    ``eq-rel-graph``.

    .. math:: e_{nm} = \frac{(W_q^\top\mathbf{x}_n)^\top(W_k^\top\mathbf{x}_m)}{\sqrt{d_k}},\quad
              a_{nm} = \frac{\exp e_{nm}}{\sum_{m' \in \mathcal{N}(n)} \exp e_{nm'}},\quad
              \mathbf{y}_n = \sum_{m\in\mathcal{N}(n)} a_{nm} W_v^\top\mathbf{x}_m

    with :math:`\mathcal{N}(n) = \{m : (m, n) \in \mathcal{E}\}` the in-neighbours of ``n``
    (chapter *The transformer block*, eq. ``eq-block-gnn``). A node with no in-neighbour gets zeros.

    Args:
        X: node features ``(N, D)``; edges: ``(E, 2)`` rows ``(m, n)``.
        W_q, W_k: ``(D, d_k)``; W_v: ``(D, d_v)``.

    Returns:
        ``(N, d_v)``.

    Raises:
        ValueError / TypeError: for malformed edges or weights that do not fit ``X``.
    """
    _check_graph_weights(X, W_q=W_q, W_k=W_k, W_v=W_v)
    if X.dim() != 2:
        raise ValueError(f"X must be the features of one graph (N, D), got {_shape(X)}")
    N = X.shape[0]
    edges = _check_edges(edges, N)
    Y = X.new_zeros(N, W_v.shape[1])
    for n in range(N):
        sources = sorted({int(m) for m, t in edges.tolist() if t == n})  # in-neighbours of n
        if not sources:
            continue
        q = X[n] @ W_q  # (d_k,)
        e = torch.stack([q @ (X[m] @ W_k) for m in sources]) / math.sqrt(W_q.shape[1])
        a = torch.exp(e - e.max())
        a = a / a.sum()  # softmax over n's in-neighbours
        for a_nm, m in zip(a, sources, strict=True):
            Y[n] += a_nm * (X[m] @ W_v)  # the message from m
    return Y


def graph_attention(X: Tensor, edges: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor) -> Tensor:
    r"""Dot-product graph attention as masked self-attention, book eq. ``eq-rel-graph``:
    :func:`.self_attention.single_head` with the mask :func:`adjacency_mask`. Cost :math:`O(N^2)`
    whatever the number of edges. Same arguments, result and errors as :func:`graph_attention_loop`
    (tested equal); ``X`` may carry leading batch dimensions (one graph for all).

    Implements: eq-rel-graph
    """
    _check_graph_weights(X, W_q=W_q, W_k=W_k, W_v=W_v)
    return single_head(X, W_q, W_k, W_v, adjacency_mask(edges, X.shape[-2]))


def graph_attention_edges(
    X: Tensor, edges: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor
) -> Tensor:
    r"""Dot-product graph attention computed on the edge list, book eq. ``eq-rel-graph``: one score per
    edge and a softmax grouped by target node, cost :math:`O(|\mathcal{E}|\,(d_k + d_v))` instead of
    :math:`O(N^2)`. Same arguments, result and errors as :func:`graph_attention_loop` (tested equal);
    duplicate edges count once.

    Implements: eq-rel-graph
    """
    _check_graph_weights(X, W_q=W_q, W_k=W_k, W_v=W_v)
    if X.dim() != 2:
        raise ValueError(f"X must be the features of one graph (N, D), got {_shape(X)}")
    N = X.shape[0]
    edges = torch.unique(_check_edges(edges, N).to(X.device), dim=0)  # (E, 2)
    src, dst = edges[:, 0], edges[:, 1]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v  # per node
    e = (Q[dst] * K[src]).sum(-1) / math.sqrt(W_q.shape[1])  # (E,): one score per edge
    top = torch.full((N,), float("-inf"), dtype=X.dtype, device=X.device)
    top = top.scatter_reduce(0, dst, e, reduce="amax")  # each target's largest score
    p = torch.exp(e - top[dst])  # (E,)
    z = X.new_zeros(N).index_add(0, dst, p)  # (N,): the softmax denominators
    a = p / z[dst]  # (E,): a_nm, summing to one over each target's edges
    return X.new_zeros(N, W_v.shape[1]).index_add(0, dst, a[:, None] * V[src])


def gat_scores(
    X: Tensor, W: Tensor, u_dst: Tensor, u_src: Tensor, negative_slope: float = 0.2
) -> Tensor:
    r"""The score of a graph-attention (GAT) layer for every pair, book eq. ``eq-rel-gat``.

    .. math:: e_{nm} = \operatorname{LeakyReLU}\big(\mathbf{u}^\top [W^\top\mathbf{x}_n \,\Vert\,
              W^\top\mathbf{x}_m]\big) = \operatorname{LeakyReLU}\big(\mathbf{u}_1^\top W^\top
              \mathbf{x}_n + \mathbf{u}_2^\top W^\top \mathbf{x}_m\big)

    (Velickovic et al. 2018, with :math:`\mathbf{u} = [\mathbf{u}_1; \mathbf{u}_2]` their vector
    :math:`\vec a`): one map ``W`` for scores and messages, an additive score, no :math:`\sqrt{d_k}`.

    Args:
        X: ``(..., N, D)``; W: ``(D, d_v)``; u_dst, u_src: ``(d_v,)`` (:math:`\mathbf{u}_1`, for the
            receiving node, and :math:`\mathbf{u}_2`, for the sender); negative_slope: of LeakyReLU.

    Returns:
        ``(..., N, N)``, row ``n`` the scores of the senders ``m`` for receiver ``n``.

    Implements: eq-rel-gat
    """
    _check_graph_weights(X, W=W)
    for name, u in (("u_dst", u_dst), ("u_src", u_src)):
        if not isinstance(u, Tensor) or u.shape != (W.shape[1],):
            got = _shape(u) if isinstance(u, Tensor) else type(u).__name__
            raise ValueError(
                f"{name} must be (d_v,) = ({W.shape[1]},) for W {_shape(W)}, got {got}"
            )
    Z = X @ W  # (..., N, d_v)
    return F.leaky_relu((Z @ u_dst)[..., :, None] + (Z @ u_src)[..., None, :], negative_slope)


def gat_attention(
    X: Tensor,
    edges: Tensor,
    W: Tensor,
    u_dst: Tensor,
    u_src: Tensor,
    negative_slope: float = 0.2,
) -> Tensor:
    r"""A single-head GAT layer before its output nonlinearity, book eq. ``eq-rel-gat``:
    :math:`\mathbf{y}_n = \sum_{m\in\mathcal{N}(n)} \operatorname{softmax}_m(e_{nm})\, W^\top\mathbf{x}_m`,
    the scores :func:`gat_scores` masked by :func:`adjacency_mask` (nodes with no in-neighbour get
    zeros). Arguments as :func:`gat_scores` plus ``edges (E, 2)``; returns ``(..., N, d_v)``; tested
    equal to :func:`gat_attention_loop`.

    Implements: eq-rel-gat
    """
    e = gat_scores(X, W, u_dst, u_src, negative_slope)  # (..., N, N)
    mask = adjacency_mask(edges, X.shape[-2]).to(X.device)
    has = mask.any(dim=-1, keepdim=True)  # (N, 1)
    A = torch.softmax(e.masked_fill(~mask, float("-inf")).masked_fill(~has, 0.0), dim=-1) * has
    return A @ (X @ W)


def gat_attention_loop(
    X: Tensor,
    edges: Tensor,
    W: Tensor,
    u_dst: Tensor,
    u_src: Tensor,
    negative_slope: float = 0.2,
) -> Tensor:
    r"""The GAT layer of :func:`gat_attention` node by node, with the score written as the paper's
    concatenation :math:`\mathbf{u}^\top[W^\top\mathbf{x}_n \Vert W^\top\mathbf{x}_m]`, book eq.
    ``eq-rel-gat``. ``X`` is one graph ``(N, D)``."""
    _check_graph_weights(X, W=W)
    if X.dim() != 2:
        raise ValueError(f"X must be the features of one graph (N, D), got {_shape(X)}")
    N = X.shape[0]
    edges = _check_edges(edges, N)
    u = torch.cat([u_dst, u_src])  # (2 d_v,): the paper's vector a
    Y = X.new_zeros(N, W.shape[1])
    for n in range(N):
        sources = sorted({int(m) for m, t in edges.tolist() if t == n})
        if not sources:
            continue
        e = torch.stack(
            [F.leaky_relu(u @ torch.cat([X[n] @ W, X[m] @ W]), negative_slope) for m in sources]
        )
        a = torch.softmax(e, dim=0)
        for a_nm, m in zip(a, sources, strict=True):
            Y[n] += a_nm * (X[m] @ W)
    return Y
