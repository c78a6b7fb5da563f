"""Relations: recurrent networks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..runtime import shape_of as _shape
from ._checks import _check_size, _check_tokens


def tanh_rnn_reference(
    X: Tensor, W_x: Tensor, W_z: Tensor, b_z: Tensor, z_0: Tensor | None = None
) -> Tensor:
    r"""An Elman (tanh) recurrent network, one step after the other, book eq. ``eq-rel-rnn``.

    .. math:: \mathbf{z}_n = \tanh\big(W_\text{x}^\top \mathbf{x}_n + W_\text{z}^\top \mathbf{z}_{n-1}
              + \mathbf{b}_\text{z}\big), \qquad \mathbf{z}_0 = \mathbf{0}

    Turner (2023, footnote 10) writes it :math:`x^{(1)}_n = f(x^{(1)}_{n-1}; x^{(0)}_n)`.

    Args:
        X: tokens ``(..., N, D)``.
        W_x: ``(D, D_z)``; W_z: ``(D_z, D_z)``; b_z: ``(D_z,)`` (``nn.RNN``'s ``b_ih + b_hh``).
        z_0: the initial state ``(..., D_z)``; default zeros.

    Returns:
        The states ``(..., N, D_z)``, row ``n`` being :math:`\mathbf{z}_n`.

    Raises:
        ValueError: when the weights do not fit ``X`` or each other.

    Implements: eq-rel-rnn
    """
    _check_tokens(X)
    D = X.shape[-1]
    if W_x.dim() != 2 or W_x.shape[0] != D:
        hint = (
            "; it looks transposed (nn.RNN stores weight_ih as (D_z, D))"
            if W_x.shape[-1] == D
            else ""
        )
        raise ValueError(f"W_x has shape {_shape(W_x)} but must be (D, D_z) with D={D}{hint}")
    D_z = W_x.shape[1]
    if W_z.shape != (D_z, D_z) or b_z.shape != (D_z,):
        raise ValueError(
            f"W_z {_shape(W_z)} must be (D_z, D_z) and b_z {_shape(b_z)} must be (D_z,) with "
            f"D_z={D_z}"
        )
    z = X.new_zeros(*X.shape[:-2], D_z) if z_0 is None else z_0  # (..., D_z)
    states = []
    for n in range(X.shape[-2]):  # N steps, each waiting for the previous one
        z = torch.tanh(X[..., n, :] @ W_x + z @ W_z + b_z)
        states.append(z)
    return torch.stack(states, dim=-2)  # (..., N, D_z)


class TanhRNN(nn.Module):
    """An Elman (tanh) recurrent layer, book eq. ``eq-rel-rnn``, computed by PyTorch's ``nn.RNN``.

    ``forward(X (B, N, D) or (N, D)) -> states (B, N, D_z) or (N, D_z)``. :attr:`weights` gives
    ``W_x``, ``W_z``, ``b_z`` in the course's ``x @ W`` convention for :func:`tanh_rnn_reference`
    (tested equal). ``nn.RNN`` stores ``weight_ih (D_z, D) = W_x^T`` and two biases that it adds.

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
        states, _ = self.rnn(X[None] if single else X)  # (B, N, D_z)
        return states[0] if single else states

    @property
    def weights(self) -> dict[str, Tensor]:
        """``W_x (D, D_z)``, ``W_z (D_z, D_z)`` and ``b_z (D_z,)`` for :func:`tanh_rnn_reference`."""
        r = self.rnn
        return {
            "W_x": r.weight_ih_l0.detach().T,
            "W_z": r.weight_hh_l0.detach().T,
            "b_z": (r.bias_ih_l0 + r.bias_hh_l0).detach(),
        }


def rnn_state_jacobian(X: Tensor, W_x: Tensor, W_z: Tensor, b_z: Tensor) -> Tensor:
    r"""How the last state of a tanh RNN depends on every token, by the chain rule, book eq.
    ``eq-rel-rnn-jacobian``.

    .. math:: \frac{\partial \mathbf{z}_N}{\partial \mathbf{x}_n} =
              \Big(\prod_{t=N}^{n+1} \mathcal{T}_t W_\text{z}^\top\Big)\, \mathcal{T}_n W_\text{x}^\top,
              \qquad \mathcal{T}_t = \operatorname{diag}\big(1 - \mathbf{z}_t^2\big)

    (the product ordered from ``t = N`` on the left down to ``n + 1``: :math:`N - n + 1` factors).
    Each factor :math:`\mathcal{T}_t W_\text{z}^\top` has norm at most
    :math:`\lVert W_\text{z}\rVert_2` and the last at most :math:`\lVert W_\text{x}\rVert_2`, since
    :math:`|\tanh'| \le 1`, so the block is at most
    :math:`\lVert W_\text{z}\rVert_2^{N-n}\lVert W_\text{x}\rVert_2` (Bengio et al. 1994; Pascanu
    et al. 2013).

    Args:
        X: one sequence ``(N, D)``; W_x, W_z, b_z: as :func:`tanh_rnn_reference`.

    Returns:
        ``(N, D_z, D)``: block ``n`` is :math:`\partial\mathbf{z}_N/\partial\mathbf{x}_n`.

    Raises:
        ValueError: for a batched ``X`` (pass one sequence) and as :func:`tanh_rnn_reference`.

    Implements: eq-rel-rnn-jacobian
    """
    if not isinstance(X, Tensor) or X.dim() != 2:
        got = _shape(X) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X must be one sequence (N, D), got {got}; loop over a batch yourself")
    with torch.no_grad():
        Z = tanh_rnn_reference(X, W_x, W_z, b_z)  # (N, D_z)
    N, D_z = Z.shape
    G = torch.eye(D_z, dtype=X.dtype, device=X.device)  # d z_N / d z_t, from t = N down
    blocks = [None] * N
    for n in range(N - 1, -1, -1):
        G_n = G * (1 - Z[n] ** 2)  # (D_z, D_z): G T_n (scales the columns)
        blocks[n] = G_n @ W_x.T  # (D_z, D)
        G = G_n @ W_z.T  # one more step back
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
    computation as written: it grows with ``N`` for a recurrence computed step by step (for a
    nonlinear one such as the tanh RNN there is no other way; a linear recurrence also has a parallel
    form) and stays fixed for attention.

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
