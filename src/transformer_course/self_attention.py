"""Self-attention: scores, the softmax, scaled dot-product attention, masks and the single-head layer.

Chapter: *Self-attention* (the lecture notes on Bishop & Bishop's chapter 12, ``bishop2024notes``,
sec. 2.8-2.10 and Algorithm 1 in the notes' own numbering; Turner 2023 eq. 3; MIT 6.390 sec.
9.3-9.4.1 and 9.5.2); *Notation and conventions* previews the single-head form. Convention:
rows are tokens. Queries ``Q`` are ``(..., N, d_k)``, keys ``K`` are ``(..., M, d_k)``, values ``V`` are
``(..., M, d_v)``; scores ``S`` and weights ``A`` are ``(..., N, M)`` and each row of ``A`` sums to
one.

Masks are boolean with ``True`` meaning "query n may attend to key m", the convention of
``torch.nn.functional.scaled_dot_product_attention``. A query whose row of the mask is all ``False``
(it may attend to nothing) gets an all-zero row of weights and a zero output vector: a documented
choice, never NaN.

Every equation has a reference function that reads like the mathematics and an efficient one that
calls ``F.scaled_dot_product_attention``; ``tests/test_self_attention.py`` proves them equal.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .runtime import shape_of as _shape

__all__ = [
    "attend",
    "attention_weights",
    "causal_mask",
    "key_padding_mask",
    "saturation",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_reference",
    "single_head",
    "single_head_reference",
    "softmax_jacobian",
]


def _check_qkv(Q: Tensor, K: Tensor, V: Tensor | None, mask: Tensor | None) -> None:
    """Raise ``ValueError``/``TypeError`` naming the shapes when Q, K, V and mask do not fit."""
    named = {"Q": Q, "K": K} if V is None else {"Q": Q, "K": K, "V": V}
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(
                f"{name} has shape {_shape(t)}; it needs at least 2 dims (tokens, features): "
                "rows are tokens, so a single sequence is (N, d)"
            )
        if not t.is_floating_point():
            raise TypeError(f"{name} has dtype {t.dtype}; attention needs floating point inputs")
    if Q.dtype != K.dtype or (V is not None and V.dtype != Q.dtype):
        dtypes = ", ".join(f"{n}={t.dtype}" for n, t in named.items())
        raise TypeError(f"Q, K and V must share one dtype, got {dtypes}; cast them with .to()")
    if Q.shape[-1] != K.shape[-1]:
        raise ValueError(
            f"queries have d_k={Q.shape[-1]} (Q {_shape(Q)}) but keys have d_k={K.shape[-1]} "
            f"(K {_shape(K)}); a query and a key must have the same width to take their dot product"
        )
    if V is not None and V.shape[-2] != K.shape[-2]:
        raise ValueError(
            f"K has M={K.shape[-2]} tokens (K {_shape(K)}) but V has {V.shape[-2]} (V {_shape(V)}); "
            "every key needs exactly one value"
        )
    lead = Q.shape[:-2]
    for name, t in named.items():
        if t.shape[:-2] != lead:
            raise ValueError(
                f"batch dimensions differ: Q {_shape(Q)} but {name} {_shape(t)}; the leading "
                "dimensions must be equal (the course never broadcasts silently)"
            )
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(
                f"mask must be a bool tensor (True = may attend), got {got}; "
                "e.g. build it with torch.ones(N, M, dtype=torch.bool).tril()"
            )
        N, M = Q.shape[-2], K.shape[-2]
        if mask.shape != (N, M) and mask.shape != (*lead, N, M):
            raise ValueError(
                f"mask has shape {_shape(mask)} but must be (N, M) = ({N}, {M}) or the full "
                f"{(*lead, N, M)} for Q {_shape(Q)} and K {_shape(K)}"
            )


def causal_mask(N: int, M: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``(N, M)`` mask, ``True`` where query ``n`` may attend to key ``m <= n + (M - N)``.

    With ``M = N`` (the default) it is lower triangular: token ``n`` sees tokens ``0..n``. With
    ``M > N`` the queries are the last ``N`` of ``M`` positions (as when a cache holds earlier keys).
    Hiding the ``False`` entries before the softmax is the additive mask of book eq.
    ``eq-lm-mask-mit``.

    Implements: eq-lm-mask-mit
    """
    M = N if M is None else M
    if N < 0 or M < N:
        raise ValueError(f"a causal mask needs 0 <= N <= M, got N={N}, M={M}")
    return torch.ones(N, M, dtype=torch.bool, device=device).tril(diagonal=M - N)


def key_padding_mask(
    lengths: Tensor | list[int], N: int, device: torch.device | str | None = None
) -> Tensor:
    """Boolean ``(B, N, N)`` mask for a batch padded to ``N`` tokens: ``True`` where key ``m`` is real.

    Implements: eq-sa-padding

    Sequence ``i`` of the batch has ``lengths[i]`` real tokens followed by placeholders, and
    ``mask[i, n, m] = m < lengths[i]`` for every query ``n``: no query attends to a placeholder, so
    the outputs on the real tokens are those of the sequence run on its own, whatever finite values
    the placeholders hold (an infinite or NaN placeholder still gives NaN: its weight is 0, and
    ``0 * inf`` is NaN in ``A @ V``). Combine it with :func:`causal_mask` by ``&`` for a decoder.
    The rows of padded queries are not all ``False`` (they attend to the real keys) and their
    outputs are simply discarded.

    Raises:
        ValueError: for a length below 1 or above ``N`` (a sequence with no real token would leave
            its queries nothing to attend to).
    """
    lengths = torch.as_tensor(lengths, device=device)
    if lengths.dim() != 1 or lengths.is_floating_point():
        raise ValueError(f"lengths must be a 1-D list of ints, got {lengths.tolist()!r}")
    if lengths.numel() and (int(lengths.min()) < 1 or int(lengths.max()) > N):
        raise ValueError(
            f"every length must be between 1 and N={N} (the padded length), got {lengths.tolist()}"
        )
    real = torch.arange(N, device=lengths.device)[None, :] < lengths[:, None]  # (B, N) real keys
    return real[:, None, :].expand(len(lengths), N, N)  # (B, N, N): the same for every query


def _default_scale(Q: Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(Q.shape[-1]) if scale is None else float(scale)


def attention_weights(
    Q: Tensor, K: Tensor, mask: Tensor | None = None, scale: float | None = None
) -> Tensor:
    r"""Attention weights :math:`A = \operatorname{softmax}_\text{row}(S)`, book eq. ``eq-self-attention``
    (with a mask, eq. ``eq-sa-masked``).

    Implements: eq-sa-masked

    .. math:: S = \frac{Q K^\top}{\sqrt{d_k}}, \qquad
              A_{nm} = \frac{\exp S_{nm}}{\sum_{m'} \exp S_{nm'}}

    Args:
        Q: queries ``(..., N, d_k)``.
        K: keys ``(..., M, d_k)``.
        mask: optional bool ``(N, M)`` or ``(..., N, M)``; ``False`` entries get weight exactly 0.
        scale: multiplies the scores; default ``1/sqrt(d_k)`` (the notes' eq. 14, Vaswani et al.).

    Returns:
        ``A`` of shape ``(..., N, M)``; each row sums to one, except rows whose mask is all
        ``False``, which are all zero.

    Raises:
        ValueError: when widths, token counts, batch dimensions or the mask shape disagree.
        TypeError: for non-tensor, integer, mixed-dtype inputs, or a non-boolean mask.
    """
    _check_qkv(Q, K, None, mask)
    S = (Q @ K.transpose(-2, -1)) * _default_scale(Q, scale)  # (..., N, M) scores
    if mask is None:
        return torch.softmax(S, dim=-1)
    can_attend = mask.any(dim=-1, keepdim=True)  # (..., N, 1): False for fully masked rows
    S = S.masked_fill(~mask, float("-inf"))
    S = torch.where(can_attend, S, torch.zeros_like(S))  # keep softmax finite on empty rows
    return torch.softmax(S, dim=-1) * can_attend


def softmax_jacobian(a: Tensor) -> Tensor:
    r"""The derivative of the softmax's output ``a`` ``(..., M)`` with respect to its scores,
    :math:`\mathcal{J} = \operatorname{diag}(\mathbf{a}) - \mathbf{a}\mathbf{a}^\top`, ``(..., M, M)``.

    Implements: eq-sa-softmax-jacobian
    """
    return torch.diag_embed(a) - a[..., :, None] * a[..., None, :]


def saturation(
    d_ks: list[int], M: int = 16, draws: int = 400, seed: int = 1, scaled: bool = True
) -> dict[str, Tensor]:
    """How peaked the weights of one query over ``M`` random keys are, for each key width in ``d_ks``
    (entries of queries and keys standard normal; ``draws`` queries per width, seeded).

    Returns ``{"sorted": (len(d_ks), M) the mean weights from the largest down, "max": the mean largest
    weight, "entropy": the mean entropy (nats), "jacobian": the mean Frobenius norm of
    :func:`softmax_jacobian`}`` (each ``(len(d_ks),)``), with the scale ``1/sqrt(d_k)`` when ``scaled``
    and without it otherwise.
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    for d in d_ks:
        q = torch.randn(draws, 1, d, generator=g)  # (draws, 1, d_k): one query per draw
        k = torch.randn(draws, M, d, generator=g)  # (draws, M, d_k)
        a = attention_weights(q, k, scale=None if scaled else 1.0)[:, 0]  # (draws, M)
        entropy = -(a * torch.log(a.clamp_min(1e-30))).sum(dim=1)
        rows.append(
            (
                a.sort(dim=1, descending=True).values.mean(dim=0),
                entropy.mean(),
                torch.linalg.matrix_norm(softmax_jacobian(a)).mean(),
            )
        )
    ordered = torch.stack([r[0] for r in rows])
    return {
        "sorted": ordered,
        "max": ordered[:, 0],
        "entropy": torch.stack([r[1] for r in rows]),
        "jacobian": torch.stack([r[2] for r in rows]),
    }


def scaled_dot_product_attention_reference(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    r"""Scaled dot-product attention written as its equation, book eq. ``eq-sa-scaled``; with ``V = X`` it
    is the weighted average of eqs. ``eq-avg-output`` and ``eq-avg-matrix``.

    Implements: eq-sa-scaled, eq-avg-output, eq-avg-matrix

    .. math:: \operatorname{Attention}(Q, K, V) = \operatorname{softmax}_\text{row}
              \left(\frac{Q K^\top}{\sqrt{d_k}}\right) V

    (The notes on Bishop & Bishop, eq. 14 and Algorithm 1; Vaswani et al. 2017, eq. 1; MIT 6.390
    sec. 9.4.1.)

    Args:
        Q: ``(..., N, d_k)``; K: ``(..., M, d_k)``; V: ``(..., M, d_v)``.
        mask: optional bool ``(N, M)`` or ``(..., N, M)``, ``True`` = may attend.
        scale: default ``1/sqrt(d_k)``.

    Returns:
        ``Y`` of shape ``(..., N, d_v)``: row n is the average of the rows of ``V`` weighted by row n of
        :func:`attention_weights`; a query that may attend to nothing gets zeros.
    """
    _check_qkv(Q, K, V, mask)
    A = attention_weights(Q, K, mask, scale)  # (..., N, M)
    return A @ V  # (..., N, d_v)


def scaled_dot_product_attention(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    causal: bool = False,
) -> Tensor:
    r"""Efficient scaled dot-product attention, book eq. ``eq-sa-scaled``, via PyTorch's fused
    ``F.scaled_dot_product_attention``.

    Implements: eq-sa-scaled, eq-sa-masked

    Same arguments, result and errors as :func:`scaled_dot_product_attention_reference` (tested equal to
    1e-10 in float64 and 1e-5 in float32). For a query whose mask row is all ``False``, PyTorch before
    2.5 returned NaN and newer versions return zeros on some backends; here such a row is unmasked for
    the fused kernel and its output is then set to zero, so the documented behaviour (zeros, finite
    gradients) holds on every version and backend. ``dropout_p`` drops
    attention weights during training (the reference has no dropout; compare with ``dropout_p=0``).
    ``causal=True`` (with ``mask=None`` and ``N == M``) applies :func:`causal_mask` through PyTorch's
    ``is_causal`` fast path.
    """
    _check_qkv(Q, K, V, mask)
    if causal and (mask is not None or Q.shape[-2] != K.shape[-2]):
        raise ValueError(
            "causal=True needs mask=None and as many queries as keys "
            f"(got N={Q.shape[-2]}, M={K.shape[-2]}); pass mask=causal_mask(N, M) instead"
        )
    if mask is not None and mask.dim() == 2 and Q.dim() > 2:
        mask = mask.expand(*Q.shape[:-2], *mask.shape)  # (..., N, M), explicit, never silent
    return attend(Q, K, V, mask, _default_scale(Q, scale), dropout_p, causal)


def attend(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    causal: bool = False,
) -> Tensor:
    """The fused kernel behind :func:`scaled_dot_product_attention` and the multi-head layers, without
    the argument checks (callers check once): ``mask`` must broadcast against ``(..., N, M)``.

    A query row whose mask is all ``False`` gives zeros (never NaN), as the module docstring states.
    """
    if causal:
        return F.scaled_dot_product_attention(
            Q, K, V, is_causal=True, scale=scale, dropout_p=dropout_p
        )
    if mask is None:
        return F.scaled_dot_product_attention(Q, K, V, scale=scale, dropout_p=dropout_p)
    can_attend = mask.any(dim=-1, keepdim=True)  # (..., N, 1)
    safe_mask = mask | ~can_attend  # empty rows attend everywhere, then get zeroed below
    Y = F.scaled_dot_product_attention(
        Q, K, V, attn_mask=safe_mask, scale=scale, dropout_p=dropout_p
    )
    return Y * can_attend


def _check_weights(X: Tensor, **W: Tensor) -> None:
    if not isinstance(X, Tensor) or X.dim() < 2:
        got = _shape(X) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X must be a tensor of shape (..., N, D) with rows as tokens, got {got}")
    D = X.shape[-1]
    for name, w in W.items():
        if not isinstance(w, Tensor) or w.dim() != 2:
            got = _shape(w) if isinstance(w, Tensor) else type(w).__name__
            raise ValueError(f"{name} must be a 2-D weight matrix (D, d), got {got}")
        if w.shape[0] != D:
            hint = (
                f"; it looks transposed: use {name}.T (the course multiplies X @ {name})"
                if w.shape[1] == D
                else ""
            )
            raise ValueError(
                f"{name} has shape {_shape(w)} but X {_shape(X)} has D={D} features, "
                f"so {name} must be ({D}, d){hint}"
            )
    if W["W_q"].shape[1] != W["W_k"].shape[1]:
        raise ValueError(
            f"W_q {_shape(W['W_q'])} and W_k {_shape(W['W_k'])} must give queries and keys of the "
            "same width d_k"
        )


def single_head_reference(
    X: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor, mask: Tensor | None = None
) -> Tensor:
    r"""Single-head scaled dot-product self-attention, book eq. ``eq-self-attention`` (the notes'
    Algorithm 1),
    with the projections of eqs. ``eq-row-projection`` and ``eq-sa-qkv``.

    Implements: eq-self-attention, eq-row-projection, eq-sa-qkv

    .. math:: Q = X W_q,\quad K = X W_k,\quad V = X W_v,\qquad
              Y = \operatorname{softmax}_\text{row}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V

    Args:
        X: tokens ``(..., N, D)``, one token per row.
        W_q: ``(D, d_k)``; W_k: ``(D, d_k)``; W_v: ``(D, d_v)``. (``nn.Linear`` stores the transpose,
            ``(out, in)``, and computes ``x @ weight.T``.)
        mask: optional bool ``(N, N)`` or ``(..., N, N)``, ``True`` = may attend: a causal mask, a
            key-padding mask ``mask[b, n, m] = m < N_b`` for a batch padded to a common length
            (book eq. ``eq-sa-padding``), or both combined with ``&``.

    Returns:
        ``Y`` of shape ``(..., N, d_v)``.

    Raises:
        ValueError: naming the shapes when a weight does not fit ``X`` (and saying when it looks
            transposed).
    """
    _check_weights(X, W_q=W_q, W_k=W_k, W_v=W_v)
    Q, K, V = X @ W_q, X @ W_k, X @ W_v  # (..., N, d_k), (..., N, d_k), (..., N, d_v)
    return scaled_dot_product_attention_reference(Q, K, V, mask)


def single_head(
    X: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor, mask: Tensor | None = None
) -> Tensor:
    r"""Efficient single-head self-attention, book eq. ``eq-self-attention``; same contract as
    :func:`single_head_reference`, computed with one fused projection and
    :func:`scaled_dot_product_attention`.

    Implements: eq-self-attention, eq-row-projection, eq-sa-qkv
    """
    _check_weights(X, W_q=W_q, W_k=W_k, W_v=W_v)
    d_k = W_q.shape[1]
    QKV = X @ torch.cat([W_q, W_k, W_v], dim=1)  # (..., N, 2 d_k + d_v), one matmul
    Q, K, V = QKV.split([d_k, d_k, W_v.shape[1]], dim=-1)
    return scaled_dot_product_attention(Q, K, V, mask)
