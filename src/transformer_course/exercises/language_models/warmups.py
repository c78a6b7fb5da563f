"""Lab 7's small exercises, checked on random inputs as in every lab: the causal mask in MIT's and
Turner's conventions (warm-up of part 2, and an optional exercise), the teacher-forcing loss (warm-up of
part 4), the temperature softmax (warm-up of part 8) and top-k filtering (optional). Every answer is
finite (the checker rejects NaN and inf), so the mask exercises return masked attention weights rather
than a matrix holding -inf; a mask that hides the diagonal leaves the first query without keys, and
the checker names it by its NaNs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import Mistake, exercise, randn


def _scores(gen: torch.Generator, *shape: int) -> Tensor:
    """Random scores or logits with a spread of 2 (so that softmax weights differ clearly)."""
    return 2.0 * randn(gen, *shape)


def _additive(keep: Tensor) -> Tensor:
    """0 where ``keep`` is True, -inf elsewhere (MIT's form of a mask)."""
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))


# --------------------------------------------------------------------------------------------------
# 1. MIT's additive causal mask on row-normalised scores (MIT 6.390 sec. 9.5.2)


WHY_MASKED_DIAGONAL = (
    "your mask also hides the diagonal (key m = n), so the first query has no key left: its row of "
    "scores is -inf everywhere and its softmax is 0/0, NaN. A token may attend to itself: M[n, m] = 0 "
    "for m <= n, -inf only for m > n (torch.triu(..., diagonal=1))."
)
WHY_KEEP_MASK_FILLED = (
    "you passed the mask of the keys to keep (torch.tril: True where m <= n) to masked_fill, which "
    "writes -inf where the mask is True: the past and the diagonal were hidden and the future kept, "
    "and the last query, with no later key, has a row of -inf everywhere (0/0, NaN). Fill where a key "
    "is hidden: S.masked_fill(~keep, float('-inf')), or torch.triu(..., diagonal=1) as the mask."
)
WHY_MASKED_DIAGONAL_COLUMNS = (
    "your mask also hides the diagonal (key n' = n), so the first column has no key left: it is -inf "
    "everywhere and its softmax is 0/0, NaN. A token may attend to itself: keep n' <= n."
)


def _row_scores(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    B, N = ((2, 5), (3, 7), (1, 4))[trial % 3]
    return (_scores(gen, B, N, N),)


@exercise(
    name="language_models.mit_causal_weights",
    prompt=(
        "S is a (B, N, N) tensor of row-form scores, S[b, n, m] = q_n . k_m / sqrt(d_k). Build MIT's "
        "additive causal mask M (N, N): M[n, m] = 0 where key m may be seen by query n (m <= n) and "
        "-inf where it may not (m > n). Return A = softmax(S + M) over each row, shape (B, N, N)."
    ),
    make_inputs=_row_scores,
    rows_sum_to_one=True,
    mistakes=[
        Mistake(
            "your mask lets each query see the future (keys m > n) and hides the past: the keys a "
            "query may see form the lower triangle (torch.tril, not triu), so MIT's M is 0 on and "
            "below the diagonal and -inf strictly above it.",
            lambda S: torch.softmax(S + _additive(torch.ones(S.shape[-2:]).bool().triu()), dim=-1),
        ),
        Mistake(
            "you multiplied the scores by a 0/1 mask: a score of 0 still gets weight exp(0) > 0. "
            "Add -inf to the masked scores instead (exp(-inf) = 0).",
            lambda S: torch.softmax(S * torch.ones(S.shape[-2:]).tril(), dim=-1),
        ),
        Mistake(
            "you zeroed the weights after the softmax, so rows no longer sum to one; add M to the "
            "scores before the softmax.",
            lambda S: torch.softmax(S, dim=-1) * torch.ones(S.shape[-2:]).tril(),
        ),
        Mistake(
            WHY_MASKED_DIAGONAL,
            lambda S: torch.softmax(
                S + _additive(torch.ones(S.shape[-2:]).bool().tril(-1)), dim=-1
            ),
            fails_by="nan",
        ),
        Mistake(
            WHY_KEEP_MASK_FILLED,
            lambda S: torch.softmax(
                S.masked_fill(torch.ones(S.shape[-2:]).bool().tril(), float("-inf")), dim=-1
            ),
            fails_by="nan",
        ),
    ],
)
def mit_causal_weights(S: Tensor) -> Tensor:
    N = S.shape[-1]
    keep = torch.ones(N, N, dtype=torch.bool).tril()  # (N, N): key m <= query n
    M = torch.zeros(N, N, dtype=S.dtype).masked_fill(~keep, float("-inf"))  # MIT's additive mask
    return torch.softmax(S + M, dim=-1)  # (B, N, N), rows sum to one


# --------------------------------------------------------------------------------------------------
# 2. The same mask in Turner's column convention (Turner 2023 sec. 4.1)


def _column_scores(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    N = (5, 7, 4)[trial % 3]
    return (_scores(gen, N, N),)


@exercise(
    name="language_models.turner_causal_weights",
    prompt=(
        "S_cols is Turner's (N, N) score matrix, S_cols[n', n] = k_{n'} . q_n (key n' first, query n "
        "second). Return his causal attention matrix A_cols (N, N): each column n is a softmax over "
        "n' restricted to n' <= n, so A_cols[n', n] = 0 for n' > n (upper triangular) and every "
        "column sums to one."
    ),
    make_inputs=_column_scores,
    mistakes=[
        Mistake(
            "you kept the row form's lower-triangular pattern on Turner's [n', n] indices, so "
            "column n sees the future (n' >= n). Turner's matrix is the transpose: keep the upper "
            "triangle (n' <= n).",
            lambda S: torch.softmax(S + _additive(torch.ones(S.shape).bool().tril()), dim=0),
        ),
        Mistake(
            "you normalised the rows (dim=1); in Turner's convention each column n sums to one over "
            "the keys n' (dim=0).",
            lambda S: torch.softmax(S + _additive(torch.ones(S.shape).bool().triu()), dim=1),
        ),
        Mistake(
            WHY_MASKED_DIAGONAL_COLUMNS,
            lambda S: torch.softmax(S + _additive(torch.ones(S.shape).bool().triu(1)), dim=0),
            fails_by="nan",
        ),
    ],
)
def turner_causal_weights(S_cols: Tensor) -> Tensor:
    N = S_cols.shape[0]
    keep = torch.ones(N, N, dtype=torch.bool).triu()  # [n', n]: key n' <= query n
    M_cols = torch.zeros(N, N, dtype=S_cols.dtype).masked_fill(~keep, float("-inf"))  # = M.T
    return torch.softmax(S_cols + M_cols, dim=0)  # (N, N), columns sum to one


# --------------------------------------------------------------------------------------------------
# 3. The temperature softmax


def _temperature_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, float]:
    B, V, tau = ((3, 10, 0.5), (2, 17, 2.0), (4, 8, 0.7))[trial % 3]
    return _scores(gen, B, V), tau


@exercise(
    name="language_models.temperature_probs",
    prompt=(
        "z is a (B, V) tensor of logits (one row per sequence, one column per vocabulary entry) and "
        "tau > 0 a temperature. Return the sampling distribution softmax(z / tau) over the "
        "vocabulary, shape (B, V); each row sums to one."
    ),
    make_inputs=_temperature_inputs,
    rows_sum_to_one=True,
    rows_of="the sampling distribution",
    row_axis="the vocabulary",
    mistakes=[
        Mistake(
            "you multiplied the logits by tau (or raised the probabilities to the power tau); the "
            "logits are divided by the temperature, softmax(z / tau), so tau < 1 sharpens the "
            "distribution.",
            lambda z, tau: torch.softmax(z * tau, dim=-1),
        ),
        Mistake(
            "you divided the probabilities by tau after the softmax, so the rows no longer sum to one; "
            "divide the logits before the softmax.",
            lambda z, tau: torch.softmax(z, dim=-1) / tau,
        ),
        Mistake(
            "the temperature is missing: you returned softmax(z).",
            lambda z, tau: torch.softmax(z, dim=-1),
        ),
    ],
)
def temperature_probs(z: Tensor, tau: float) -> Tensor:
    return torch.softmax(z / tau, dim=-1)  # (B, V): the same as p**(1/tau), renormalised


# --------------------------------------------------------------------------------------------------
# 4. Top-k filtering


def _top_k_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    B, V, k = ((3, 10, 3), (2, 12, 5), (4, 7, 1))[trial % 3]
    return _scores(gen, B, V), k  # continuous random logits: no ties


def _keep_top(z: Tensor, k: int, largest: bool = True) -> Tensor:
    idx = torch.topk(z, k, dim=-1, largest=largest).indices  # (B, k)
    return torch.zeros_like(z, dtype=torch.bool).scatter(-1, idx, True)  # (B, V)


WHY_TOP_K_PLUS_ONE = (
    "you kept k + 1 tokens: your threshold is the (k + 1)-th largest logit, e.g. index k of a "
    "descending sort (torch.sort(z, descending=True).values[..., k], counting from 0). The k-th "
    "largest is index k - 1, torch.topk(z, k).values[..., -1:]; keep z >= it."
)
WHY_TOP_K_MINUS_ONE = (
    "you kept k - 1 tokens: z > kth drops the k-th largest logit itself, the last one to keep. Keep "
    "z >= kth (or drop z < kth), with kth = torch.topk(z, k).values[..., -1:]."
)


@exercise(
    name="language_models.top_k_probs",
    prompt=(
        "z is a (B, V) tensor of logits without ties and k >= 1. Return the top-k sampling "
        "distribution (B, V): the softmax over the k largest logits of each row, and exactly 0 for "
        "every other vocabulary entry; each row sums to one. (With ties, tc.language_models.next_token keeps "
        "every logit equal to the k-th largest.)"
    ),
    make_inputs=_top_k_inputs,
    rows_sum_to_one=True,
    rows_of="the sampling distribution",
    row_axis="the vocabulary",
    mistakes=[
        Mistake(
            WHY_TOP_K_PLUS_ONE,
            lambda z, k: torch.softmax(
                z.masked_fill(~_keep_top(z, min(k + 1, z.shape[-1])), float("-inf")), dim=-1
            ),
        ),
        Mistake(
            WHY_TOP_K_MINUS_ONE,
            lambda z, k: torch.softmax(  # with k = 1 nothing is kept: rows of -inf, NaN
                z.masked_fill(~_keep_top(z, k - 1), float("-inf")), dim=-1
            ),
        ),
        Mistake(
            "you did not renormalise: after zeroing all but the top k probabilities, divide by their "
            "sum (or mask the logits with -inf before the softmax).",
            lambda z, k: torch.softmax(z, dim=-1) * _keep_top(z, k),
        ),
        Mistake(
            "you kept the k smallest logits; keep the k largest (torch.topk's default, largest=True).",
            lambda z, k: torch.softmax(
                z.masked_fill(~_keep_top(z, k, largest=False), float("-inf")), dim=-1
            ),
        ),
    ],
)
def top_k_probs(z: Tensor, k: int) -> Tensor:
    kth = torch.topk(z, k, dim=-1).values[..., -1:]  # (B, 1): the k-th largest logit
    z = z.masked_fill(z < kth, float("-inf"))  # drop everything below it
    return torch.softmax(z, dim=-1)  # (B, V); zeroing probabilities and renormalising is the same


# --------------------------------------------------------------------------------------------------
# 5. The teacher-forcing loss (Williams & Zipser 1989; Dramko 2025 sec. 5.2.1)


def _teacher_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    B, N, V = ((2, 5, 7), (3, 4, 11), (1, 8, 5))[trial % 3]
    logits = _scores(gen, B, N, V)
    tokens = torch.randint(0, V, (B, N + 1), generator=gen)
    return logits, tokens


def _nll(logits: Tensor, targets: Tensor) -> Tensor:
    """-log p of each target, (B, N)."""
    return -torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]


@exercise(
    name="language_models.teacher_forcing_loss",
    prompt=(
        "tokens is a (B, N + 1) tensor of token ids; logits is (B, N, V), where logits[b, n] is the "
        "model's prediction after reading tokens[b, 0..n] (one forward pass over tokens[:, :N]). "
        "Return the teacher-forcing loss: the mean over all B * N predictions of "
        "-log softmax(logits[b, n])[tokens[b, n + 1]], a scalar tensor. (GPT.forward takes targets "
        "already shifted: do not call this function there.)"
    ),
    make_inputs=_teacher_inputs,
    mistakes=[
        Mistake(
            "your targets are not shifted: the prediction at position n is scored against tokens[:, n] "
            "(the token it has just read) instead of the next one, tokens[:, n + 1].",
            lambda logits, tokens: _nll(logits, tokens[:, :-1]).mean(),
        ),
        Mistake(
            "you averaged over the batch only (summing over the N positions); the loss is the mean "
            "over all B * N predictions.",
            lambda logits, tokens: _nll(logits, tokens[:, 1:]).sum(dim=1).mean(),
        ),
        Mistake(
            "the softmax ran over the positions (dim=1) instead of the vocabulary (dim=-1).",
            lambda logits, tokens: (
                -torch.log_softmax(logits, dim=1).gather(-1, tokens[:, 1:, None]).mean()
            ),
        ),
    ],
)
def teacher_forcing_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """The mean cross-entropy of the next tokens: logits (B, N, V) from one pass over tokens[:, :N],
    tokens (B, N + 1) **unshifted**, shifted here (targets = tokens[:, 1:]). GPT.forward(idx, targets)
    takes targets already shifted (the y of get_batch, targets[b, n] = the token after idx[b, n]):
    calling this function there shifts them twice."""
    B, N, V = logits.shape
    targets = tokens[:, 1:]  # (B, N): the next token after each position
    return F.cross_entropy(logits.reshape(B * N, V), targets.reshape(B * N))  # mean over B * N
