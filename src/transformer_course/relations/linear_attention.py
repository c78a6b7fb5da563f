"""Relations: linear attention: a recurrent network with a matrix-valued state; its kernel view with
positive random features (Choromanski et al. 2021); and a decayed or gated state (Sun et al. 2023;
Yang et al. 2024; Dao and Gu 2024), in parallel and recurrent form."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..runtime import shape_of as _shape
from ._checks import _check_tokens


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
    matrix :math:`\psi(Q)\psi(K)^\top`, with no softmax. Causal, this function forms the masked
    ``(N, N)`` matrix, cost :math:`O(N^2 (d_\psi + d_v))` (``2 N^2 (d_psi + d_v)`` FLOPs of matrix
    products), simple and fast for short sequences; the same causal outputs cost
    :math:`O(N d_\psi d_v)` as running sums (:func:`linear_attention_recurrent`). With
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
# The kernel view: positive random features (Choromanski et al. 2021)


def positive_random_features(x: Tensor, omega: Tensor) -> Tensor:
    r"""Positive random features, book eq. ``eq-rel-prf``:

    .. math:: \psi(\mathbf{x})_j = \frac{1}{\sqrt{d_\psi}}
              \exp\!\big(\boldsymbol\omega_j^\top\mathbf{x} - \tfrac12\lVert\mathbf{x}\rVert^2\big),
              \qquad j = 1, \dots, d_\psi .

    With :math:`\boldsymbol\omega_j \sim \mathcal{N}(\mathbf{0}, I)` independent,
    :math:`\psi(\mathbf{q})^\top\psi(\mathbf{k})` is an unbiased estimate of
    :math:`\exp(\mathbf{q}^\top\mathbf{k})` whose variance falls as :math:`1/d_\psi`, and every
    feature is positive (Choromanski et al. 2021, the positive features of FAVOR+).

    Args:
        x: ``(..., d_k)``, the vectors (rows) to map.
        omega: ``(d_psi, d_k)``, the random directions :math:`\boldsymbol\omega_j`, one per row.

    Returns:
        ``(..., d_psi)``, positive.

    Raises:
        ValueError: when ``omega`` is not a matrix whose rows have ``x``'s width.

    Implements: eq-rel-prf
    """
    if not isinstance(omega, Tensor) or omega.dim() != 2:
        got = _shape(omega) if isinstance(omega, Tensor) else type(omega).__name__
        raise ValueError(f"omega must be a (d_psi, d_k) matrix of random directions, got {got}")
    if x.shape[-1] != omega.shape[-1]:
        raise ValueError(
            f"x {_shape(x)} has width {x.shape[-1]} but omega {_shape(omega)} holds directions of "
            f"width {omega.shape[-1]}: draw omega with d_k = x.shape[-1]"
        )
    proj = x @ omega.transpose(-2, -1)  # (..., d_psi): omega_j . x
    sq = (x * x).sum(dim=-1, keepdim=True) / 2  # (..., 1): |x|^2 / 2
    return torch.exp(proj - sq) / math.sqrt(omega.shape[0])


@dataclass(frozen=True)
class PositiveRandomFeatures:
    r"""A feature map :math:`\mathbf{x} \mapsto \psi(c\,\mathbf{x})` with fixed random directions
    ``omega`` ``(d_psi, d_k)`` and a scale ``c``: with :math:`c = d_k^{-1/4}`,
    :math:`\psi(c\mathbf{q})^\top\psi(c\mathbf{k})` estimates softmax attention's
    :math:`\exp(\mathbf{q}^\top\mathbf{k}/\sqrt{d_k})`. Build it with
    :func:`positive_random_feature_map`; pass it as ``feature_map`` to the linear attention
    functions."""

    omega: Tensor  # (d_psi, d_k)
    scale: float

    def __call__(self, x: Tensor) -> Tensor:
        return positive_random_features(
            x * self.scale, self.omega.to(device=x.device, dtype=x.dtype)
        )


def positive_random_feature_map(
    d_k: int,
    d_psi: int,
    seed: int = 0,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> PositiveRandomFeatures:
    r"""Draw ``d_psi`` directions :math:`\boldsymbol\omega_j \sim \mathcal{N}(\mathbf{0}, I_{d_k})`
    from a generator seeded with ``seed`` and return the feature map of eq. ``eq-rel-prf`` on the
    scaled input ``scale * x``. The default ``scale = d_k ** -0.25`` puts softmax attention's
    :math:`1/\sqrt{d_k}` into the features, so that linear attention with this map approaches softmax
    attention as ``d_psi`` grows (Choromanski et al. 2021).

    Raises:
        ValueError: ``d_k`` or ``d_psi`` not a positive int, or ``scale`` not positive.
    """
    for name, value in (("d_k", d_k), ("d_psi", d_psi)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if scale is None:
        scale = d_k**-0.25
    if not scale > 0:
        raise ValueError(
            f"scale must be > 0 (it multiplies q and k before the features), got {scale}"
        )
    gen = torch.Generator().manual_seed(seed)
    omega = torch.randn(d_psi, d_k, generator=gen, dtype=dtype).to(device)
    return PositiveRandomFeatures(omega, float(scale))


# ---------------------------------------------------------------------------------------------------
# A decayed or gated state (RetNet, GLA, Mamba-2)


def _check_gamma(gamma: Tensor | float, Q: Tensor) -> Tensor:
    """gamma as a tensor of shape Q.shape[:-1] = (..., N), each entry in (0, 1]."""
    if not isinstance(gamma, Tensor):
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
            raise ValueError(
                f"gamma must be a float or a tensor (..., N), got {type(gamma).__name__}"
            )
        gamma = torch.full(Q.shape[-2:-1], float(gamma), dtype=Q.dtype, device=Q.device)
    if not gamma.is_floating_point():
        raise ValueError(
            f"gamma has dtype {gamma.dtype}; use floating point decays, e.g. gamma.double()"
        )
    try:
        shape = torch.broadcast_shapes(gamma.shape, Q.shape[:-1])
    except RuntimeError:
        shape = None
    if gamma.dim() < 1 or shape != Q.shape[:-1]:
        raise ValueError(
            f"gamma {_shape(gamma)} must hold one decay per token, shape (..., N) broadcastable to "
            f"Q.shape[:-1] = {tuple(Q.shape[:-1])}; a constant decay can be a float"
        )
    if not ((gamma > 0) & (gamma <= 1)).all():
        raise ValueError(
            f"every decay gamma_t must lie in (0, 1], got values in [{gamma.min().item():.3g}, "
            f"{gamma.max().item():.3g}]: above 1 the old tokens grow without bound, and 0 is excluded "
            "so the parallel form's products can be taken in log space (squash a gate with a sigmoid)"
        )
    return gamma.to(Q.dtype).expand(Q.shape[:-1])


def decay_matrix(gamma: Tensor) -> Tensor:
    r"""The decay mask of gated linear attention, book eq. ``eq-rel-decay``:

    .. math:: \mathcal{D}_{nm} = \prod_{t=m+1}^{n} \gamma_t \quad (m \le n), \qquad
              \mathcal{D}_{nm} = 0 \quad (m > n),

    so :math:`\mathcal{D}_{nn} = 1`. For a constant :math:`\gamma` it is
    :math:`\gamma^{n-m}`, RetNet's mask (Sun et al. 2023); Mamba-2 calls the general one a
    1-semiseparable matrix (Dao and Gu 2024). Computed as :math:`\exp(g_n - g_m)` with the running
    sums :math:`g_n = \sum_{t \le n} \log\gamma_t`.

    Args:
        gamma: ``(..., N)``, every entry in ``(0, 1]``.

    Returns:
        ``(..., N, N)``, lower triangular.

    Raises:
        ValueError: ``gamma`` is not a floating tensor with values in ``(0, 1]``.

    Implements: eq-rel-decay
    """
    if not isinstance(gamma, Tensor) or gamma.dim() < 1:
        raise ValueError("gamma must be a tensor (..., N) of decays, one per token")
    gamma = _check_gamma(gamma, gamma[..., None])  # (..., N), in (0, 1]
    g = torch.log(gamma).cumsum(dim=-1)  # (..., N): g_n = sum_{t <= n} log gamma_t
    N = gamma.shape[-1]
    below = torch.ones(N, N, dtype=torch.bool, device=gamma.device).tril()  # m <= n
    logs = (g[..., :, None] - g[..., None, :]).masked_fill(~below, float("-inf"))  # g_n - g_m
    return torch.exp(logs)  # (..., N, N)


def gated_linear_attention_parallel(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    gamma: Tensor | float,
    feature_map: Callable[[Tensor], Tensor] | None = elu_feature_map,
    normalise: bool = True,
) -> Tensor:
    r"""Causal linear attention with a decayed or gated state, all tokens at once, book eq.
    ``eq-rel-gated``:

    .. math:: \mathbf{y}_n = \frac{\sum_{m \le n} \mathcal{D}_{nm}\,
              \psi(\mathbf{q}_n)^\top\psi(\mathbf{k}_m)\, \mathbf{v}_m}
              {\sum_{m \le n} \mathcal{D}_{nm}\, \psi(\mathbf{q}_n)^\top\psi(\mathbf{k}_m)},
              \qquad\text{i.e.}\qquad
              Y = \frac{\big(\psi(Q)\psi(K)^\top \odot \mathcal{D}\big) V}{\text{its row sums}},

    with the decay mask :math:`\mathcal{D}` of :func:`decay_matrix`. ``gamma = 1`` is
    :func:`linear_attention_parallel`; a constant ``gamma < 1`` is RetNet's decay (Sun et al. 2023);
    a ``gamma`` computed from each token is a scalar gate as in Mamba-2 (Dao and Gu 2024), and a
    special case of GLA's gate (Yang et al. 2024), which gives each feature its own.
    ``normalise=False`` returns the numerator only, the form of those three papers (which normalise
    the output afterwards instead; RetNet with a group norm), usually with ``feature_map=None``
    (identity; RetNet also rotates its queries and keys by their positions, left out here).

    Args:
        Q, K: ``(..., N, d_k)``; V: ``(..., N, d_v)``.
        gamma: a float, or ``(..., N)`` (one decay per token, broadcastable to ``Q.shape[:-1]``),
            in ``(0, 1]``; :math:`\gamma_n` multiplies the state when token ``n`` arrives.
        feature_map: :math:`\psi`, or ``None`` for the identity.
        normalise: divide by the decayed normaliser (the default) or not.

    Returns:
        ``Y`` of shape ``(..., N, d_v)``; equal to :func:`gated_linear_attention_recurrent`.

    Raises:
        ValueError: shapes that do not fit, or a decay outside ``(0, 1]``.

    Implements: eq-rel-gated
    """
    _check_linear(Q, K, V)
    gamma = _check_gamma(gamma, Q)  # (..., N)
    psi = feature_map if feature_map is not None else (lambda x: x)
    A = (psi(Q) @ psi(K).transpose(-2, -1)) * decay_matrix(gamma)  # (..., N, N), zero above
    num = A @ V  # (..., N, d_v)
    return num / A.sum(dim=-1, keepdim=True) if normalise else num


def gated_linear_attention_step(
    Gamma: Tensor,
    zeta: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: Tensor | float,
    feature_map: Callable[[Tensor], Tensor] | None = elu_feature_map,
    normalise: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""One step of gated linear attention as a recurrent network, book eq. ``eq-rel-gated-rnn``:
    first decay the state, then add the new token, then read it,

    .. math:: \Gamma_t = \gamma_t\,\Gamma_{t-1} + \psi(\mathbf{k}_t)\,\mathbf{v}_t^\top, \qquad
              \boldsymbol{\zeta}_t = \gamma_t\,\boldsymbol{\zeta}_{t-1} + \psi(\mathbf{k}_t), \qquad
              \mathbf{y}_t = \frac{\Gamma_t^\top \psi(\mathbf{q}_t)}{\boldsymbol{\zeta}_t^\top
              \psi(\mathbf{q}_t)}

    (without the division when ``normalise=False``). ``gamma = 1`` is :func:`linear_attention_step`.

    Args:
        Gamma: ``(..., d_psi, d_v)``; zeta: ``(..., d_psi)`` (zeros before the first token).
        q, k: ``(..., d_k)``; v: ``(..., d_v)``: the new token's query, key and value.
        gamma: a float or a tensor of shape ``(...)``: this token's decay, in ``(0, 1]``.
        feature_map, normalise: as in :func:`gated_linear_attention_parallel`.

    Returns:
        ``(Gamma_t, zeta_t, y_t)`` with ``y_t`` of shape ``(..., d_v)``.

    Implements: eq-rel-gated-rnn
    """
    psi = feature_map if feature_map is not None else (lambda x: x)
    g = torch.as_tensor(gamma, dtype=Gamma.dtype, device=Gamma.device)  # (...) or ()
    pk, pq = psi(k), psi(q)  # (..., r)
    Gamma = g[..., None, None] * Gamma + pk[..., :, None] @ v[..., None, :]  # decay, then add
    zeta = g[..., None] * zeta + pk  # (..., r)
    num = (pq[..., None, :] @ Gamma)[..., 0, :]  # (..., d_v)
    if not normalise:
        return Gamma, zeta, num
    den = (pq[..., None, :] @ zeta[..., :, None])[..., 0, :]  # (..., 1)
    return Gamma, zeta, num / den


def gated_linear_attention_recurrent(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    gamma: Tensor | float,
    feature_map: Callable[[Tensor], Tensor] | None = elu_feature_map,
    normalise: bool = True,
) -> Tensor:
    r"""Causal gated linear attention one token after the other, book eq. ``eq-rel-gated-rnn``: the
    loop of :func:`gated_linear_attention_step` from :math:`\Gamma_0 = 0`,
    :math:`\boldsymbol\zeta_0 = 0`.

    Same arguments, result and errors as :func:`gated_linear_attention_parallel` (tested equal).

    Implements: eq-rel-gated-rnn
    """
    _check_linear(Q, K, V)
    gamma = _check_gamma(gamma, Q)  # (..., N)
    psi = feature_map if feature_map is not None else (lambda x: x)
    r = psi(K[..., :1, :]).shape[-1]
    Gamma = Q.new_zeros(*Q.shape[:-2], r, V.shape[-1])  # (..., r, d_v)
    zeta = Q.new_zeros(*Q.shape[:-2], r)  # (..., r)
    ys = []
    for t in range(Q.shape[-2]):
        Gamma, zeta, y = gated_linear_attention_step(
            Gamma, zeta, Q[..., t, :], K[..., t, :], V[..., t, :], gamma[..., t], psi, normalise
        )
        ys.append(y)
    return torch.stack(ys, dim=-2)  # (..., N, d_v)
