"""Exercises of the *Position* lab: the sinusoidal encoding, the rotation behind the relative shift,
concatenation as addition after linear maps, and a permutation-equivariance check.

Chapter: *Position* (Turner 2023 sec. 3 and footnote 19; the lecture notes on Bishop and Bishop's
chapter 12, ``bishop2024notes``, sec. 2.14 and exercises 7-10; MIT 6.390 sec. 9.5.1). Inputs are
float64 so the checkers can use tight tolerances. Notation as in the chapter and the glossary: the base
of the sinusoids is Omega (the argument ``base``, as in :func:`.position.sinusoidal_encoding`; the
notes call it L), the frequency of pair ``j`` is ``omega_j = Omega^(-2j/D)``, and ``k`` is kept for an
offset (``Phi_k``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..block import PostNormBlock, PreNormBlock
from ..position import LearnedPositionalEmbedding
from . import Mistake, exercise, randn

# ---------------------------------------------------------------------------------------------------
# 1. The sinusoidal encoding from scratch (Vaswani et al. 2017; the notes' eq. 25)


def _sinusoid(N: int, D: int, base: float, first: int = 0, exponent: float = 2.0) -> Tensor:
    n = torch.arange(first, first + N, dtype=torch.float64)[:, None]  # (N, 1)
    j = torch.arange(D // 2, dtype=torch.float64)  # (D/2,)
    return n * base ** (-exponent * j / D)  # (N, D/2) angles omega_j n


def _interleave(even: Tensor, odd: Tensor) -> Tensor:
    return torch.stack([even, odd], dim=-1).flatten(-2)  # (N, D/2, 2) -> (N, D): even, odd, ...


def _sinusoid_inputs(gen: torch.Generator, trial: int) -> tuple[int, int, float]:
    return ((6, 8, 100.0), (10, 4, 30.0), (7, 12, 10_000.0))[trial % 3]


@exercise(
    name="position.sinusoidal",
    prompt=(
        "Return the sinusoidal position encoding R (N, D) for an even D, positions n = 0..N-1: "
        "R[n, 2j] = sin(omega_j n), R[n, 2j+1] = cos(omega_j n), omega_j = Omega^(-2j/D), "
        "j = 0..D/2-1, where the base Omega is the argument base (float64, without tc.position)."
    ),
    make_inputs=_sinusoid_inputs,
    mistakes=[
        Mistake(
            "sine and cosine are swapped: the even columns 2j hold sin(omega_j n) and the odd columns "
            "2j+1 hold cos(omega_j n), so row 0 is [0, 1, 0, 1, ...].",
            lambda N, D, base: _interleave(
                torch.cos(_sinusoid(N, D, base)), torch.sin(_sinusoid(N, D, base))
            ),
        ),
        Mistake(
            "the exponent is j/D; the frequencies are omega_j = Omega^(-2j/D) (in the notes' eq. 25 the "
            "column index i = 2j appears, so i/D = 2j/D).",
            lambda N, D, base: _interleave(
                torch.sin(_sinusoid(N, D, base, exponent=1.0)),
                torch.cos(_sinusoid(N, D, base, exponent=1.0)),
            ),
        ),
        Mistake(
            "your positions start at 1; the first row is position n = 0 (all sines 0, all cosines "
            "1): use torch.arange(N).",
            lambda N, D, base: _interleave(
                torch.sin(_sinusoid(N, D, base, first=1)), torch.cos(_sinusoid(N, D, base, first=1))
            ),
        ),
        Mistake(
            "all sines come first and all cosines last; here they are interleaved: column 2j is a "
            "sine and column 2j+1 its cosine partner at the same frequency.",
            lambda N, D, base: torch.cat(
                [torch.sin(_sinusoid(N, D, base)), torch.cos(_sinusoid(N, D, base))], dim=-1
            ),
        ),
        Mistake(
            "each cosine column 2j+1 used the exponent (2j+1)/D; it shares the frequency of its sine "
            "partner, omega_j = Omega^(-2j/D) (the notes write (i-1)/D for odd i).",
            lambda N, D, base: _interleave(
                torch.sin(_sinusoid(N, D, base)),
                torch.cos(
                    torch.arange(N, dtype=torch.float64)[:, None]
                    * base ** (-(2 * torch.arange(D // 2, dtype=torch.float64) + 1) / D)
                ),
            ),
        ),
        Mistake(
            "you multiplied n by Omega^(+2j/D); divide instead: omega_j = Omega^(-2j/D), so the "
            "wavelengths grow with j from 2 pi towards 2 pi Omega.",
            lambda N, D, base: _interleave(
                torch.sin(_sinusoid(N, D, base, exponent=-2.0)),
                torch.cos(_sinusoid(N, D, base, exponent=-2.0)),
            ),
        ),
    ],
)
def sinusoidal(N: int, D: int, base: float) -> Tensor:
    n = torch.arange(N, dtype=torch.float64)[:, None]  # (N, 1): positions from 0
    j = torch.arange(D // 2, dtype=torch.float64)  # (D/2,): one frequency per sine/cosine pair j
    omega = base ** (-2 * j / D)  # (D/2,): omega_j = Omega^(-2j/D)
    R = torch.zeros(N, D, dtype=torch.float64)
    R[:, 0::2] = torch.sin(n * omega)  # (N, D/2) into the even columns
    R[:, 1::2] = torch.cos(n * omega)  # (N, D/2) into the odd columns
    return R


# ---------------------------------------------------------------------------------------------------
# 2. The 2x2 rotation Rot(omega k) that moves one sine/cosine pair by k positions (the notes' exercise 10)


def _rotation_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    omega = 0.05 + 1.2 * torch.rand((), generator=gen, dtype=torch.float64)
    return omega, (3, -4, 10)[trial % 3]


def _block(angle: Tensor, rows: list[list[int]]) -> Tensor:
    c, s = torch.cos(angle), torch.sin(angle)
    pick = {1: c, 2: s, -2: -s}
    return torch.stack([torch.stack([pick[e] for e in row]) for row in rows])  # (2, 2)


@exercise(
    name="position.rotation_block",
    prompt=(
        "Given a frequency omega (a 0-dim float64 tensor) and an integer offset k, return the 2x2 "
        "rotation Rot(omega k) (float64; one diagonal block of Phi_k) with [sin(omega (n+k)), "
        "cos(omega (n+k))] = Rot(omega k) @ [sin(omega n), cos(omega n)] for every position n. Use "
        "sin(alpha + beta) and cos(alpha + beta) with alpha = omega n, beta = omega k."
    ),
    make_inputs=_rotation_inputs,
    mistakes=[
        Mistake(
            "your matrix moves the pair from n to n - k: it is the transpose of Rot(omega k). Expand "
            "sin(alpha + beta) = sin alpha cos beta + cos alpha sin beta: the first row is "
            "[cos(omega k), sin(omega k)].",
            lambda omega, k: _block(omega * k, [[1, -2], [2, 1]]),
        ),
        Mistake(
            "the angle is omega, not omega * k: an offset of k positions turns the pair by omega k.",
            lambda omega, k: _block(omega, [[1, 2], [-2, 1]]),
        ),
        Mistake(
            "a sign is missing: cos(alpha + beta) = cos alpha cos beta - sin alpha sin beta, so the "
            "second row is [-sin(omega k), cos(omega k)].",
            lambda omega, k: _block(omega * k, [[1, 2], [2, 1]]),
        ),
    ],
)
def rotation_block(omega: Tensor, k: int) -> Tensor:
    c, s = torch.cos(omega * k), torch.sin(omega * k)
    # alpha = omega n, beta = omega k:
    # row 1: sin(alpha + beta) = sin alpha cos beta + cos alpha sin beta
    # row 2: cos(alpha + beta) = -sin alpha sin beta + cos alpha cos beta
    return torch.stack([torch.stack([c, s]), torch.stack([-s, c])])  # (2, 2)


# ---------------------------------------------------------------------------------------------------
# 3. Concatenate, then a linear map = add after separate linear maps (the notes' ex. 9; Turner fn. 19)


def _concat_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    D, D_r, D_out = ((4, 4, 3), (5, 3, 6), (2, 6, 4))[trial % 3]  # trial 0: D = D_r
    return randn(gen, D, D_out), randn(gen, D_r, D_out)


def _if_widths_match(wrong):
    """A mistake that only runs when ``D = D_r`` (trial 0, where the checker meets it first); on the
    other trials an empty tensor, which matches no answer, so the checker can try every mistake."""
    return lambda W_1, W_2: wrong(W_1, W_2) if W_1.shape == W_2.shape else W_1.new_empty(0)


@exercise(
    name="position.concat_weight",
    prompt=(
        "Given W_1 (D, D_out), which acts on the token features X (N, D), and W_2 (D_r, D_out), "
        "which acts on the position features R (N, D_r), return the single matrix W "
        "(D + D_r, D_out) with torch.cat([X, R], dim=1) @ W == X @ W_1 + R @ W_2 for all X, R."
    ),
    make_inputs=_concat_inputs,
    mistakes=[
        Mistake(
            "the blocks are in the wrong order: the first D rows of W multiply the first D features "
            "of [X, R], which are X's, so W = [W_1; W_2] (torch.cat([W_1, W_2], dim=0)).",
            lambda W_1, W_2: torch.cat([W_2, W_1], dim=0),
        ),
        Mistake(
            "you added the two maps, W_1 + W_2: that is the map of X + R, which needs D = D_r; "
            "the concatenation [X, R] has D + D_r features, so W stacks W_1 on top of W_2, "
            "(D + D_r, D_out).",
            _if_widths_match(lambda W_1, W_2: W_1 + W_2),
        ),
        Mistake(
            "you joined the maps side by side (dim=1), a (D, 2 D_out) matrix: concatenating R adds "
            "input features, not outputs, so W stacks W_1 on top of W_2: "
            "torch.cat([W_1, W_2], dim=0).",
            _if_widths_match(lambda W_1, W_2: torch.cat([W_1, W_2], dim=1)),
        ),
    ],
)
def concat_weight(W_1: Tensor, W_2: Tensor) -> Tensor:
    # [X, R] W = X W[:D] + R W[D:]: stack the two maps on top of each other.
    return torch.cat([W_1, W_2], dim=0)  # (D + D_r, D_out)


# ---------------------------------------------------------------------------------------------------
# 4. Measure permutation equivariance (the notes' exercise 7)


class _WithPositions(nn.Module):
    """A block that first adds learned positions: no longer permutation equivariant."""

    def __init__(self, d_model: int, H: int) -> None:
        super().__init__()
        self.pos = LearnedPositionalEmbedding(16, d_model)
        self.block = PreNormBlock(d_model, H)

    def forward(self, X: Tensor) -> Tensor:
        return self.block(self.pos(X))


class _Causal(nn.Module):
    """A block with a causal mask: the mask itself encodes order (Turner fn. 21)."""

    def __init__(self, d_model: int, H: int) -> None:
        super().__init__()
        self.block = PostNormBlock(d_model, H)

    def forward(self, X: Tensor) -> Tensor:
        N = X.shape[-2]
        return self.block(X, mask=torch.ones(N, N, dtype=torch.bool, device=X.device).tril())


class _Named:
    """A module behind a short name, so the checker's messages stay one line long."""

    def __init__(self, module: nn.Module, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self, X: Tensor) -> Tensor:
        return self.module(X)

    def __repr__(self) -> str:
        return self.name


def _equivariance_inputs(gen: torch.Generator, trial: int) -> tuple[_Named, Tensor, Tensor]:
    B, N, D, H = ((2, 6, 8, 2), (3, 7, 8, 4), (2, 8, 12, 3))[trial % 3]
    make = (PreNormBlock, _Causal, _WithPositions)[trial % 3]
    with torch.random.fork_rng(devices=[]):  # building modules must not move the learner's RNG
        f = make(D, H).double().eval()
    with torch.no_grad():
        for p in f.parameters():
            p.copy_(0.5 * randn(gen, *p.shape))
    perm = torch.randperm(N, generator=gen)
    while bool((perm[perm] == torch.arange(N)).all()):  # avoid a self-inverse permutation
        perm = torch.randperm(N, generator=gen)
    name = ("a pre-norm block", "a causal post-norm block", "learned positions + a block")[
        trial % 3
    ]
    return _Named(f, f"<f: {name}, D={D}, H={H}>"), randn(gen, B, N, D), perm


def _gap(f, X: Tensor, perm: Tensor, out_perm: Tensor | None, how: str = "max") -> Tensor:
    Y = f(X)
    diff = f(X[:, perm]) - (Y if out_perm is None else Y[:, out_perm])
    return {"max": diff.abs().max(), "mean": diff.abs().mean(), "signed": diff.max()}[how]


@exercise(
    name="position.equivariance_gap",
    prompt=(
        "f maps tokens X (B, N, D) to (B, N, D); perm is a permutation of 0..N-1 (a LongTensor), "
        "so X[:, perm] reorders the tokens. Return the largest absolute difference between "
        "f(X[:, perm]) and f(X)[:, perm], as a 0-dim tensor: about 1e-15 when f is permutation "
        "equivariant, large when it is not."
    ),
    make_inputs=_equivariance_inputs,
    mistakes=[
        Mistake(
            "you compared f(X[:, perm]) with f(X) itself; equivariance says the OUTPUT is reordered "
            "too: compare with f(X)[:, perm].",
            lambda f, X, perm: _gap(f, X, perm, None),
        ),
        Mistake(
            "you reordered the output with the inverse permutation; reorder f(X) exactly as you "
            "reordered X: f(X)[:, perm].",
            lambda f, X, perm: _gap(f, X, perm, torch.argsort(perm)),
        ),
        Mistake(
            "you returned the MEAN absolute difference; the check needs the largest one, "
            "(...).abs().max().",
            lambda f, X, perm: _gap(f, X, perm, perm, "mean"),
        ),
        Mistake(
            "you returned the largest signed difference; take the absolute value first, "
            "(...).abs().max().",
            lambda f, X, perm: _gap(f, X, perm, perm, "signed"),
        ),
    ],
)
def equivariance_gap(f, X: Tensor, perm: Tensor) -> Tensor:
    permuted_then_f = f(X[:, perm])  # (B, N, D): reorder the tokens, then apply f
    f_then_permuted = f(X)[:, perm]  # (B, N, D): apply f, then reorder its output rows
    return (permuted_then_f - f_then_permuted).abs().max()
