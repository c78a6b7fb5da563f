"""Part 1 of lab 7: the token and position embedding, ``X[b, n] = E[idx[b, n]] + R[n]``. The reference
solution is ``scratch/gpt.py``'s :class:`Embedding`; the wrong variants below each change one thing."""

from __future__ import annotations

import math
from typing import Any

import torch

from ...scratch.gpt import Embedding
from .. import Mistake
from .checking import (
    _CONFIGS,
    CapstoneExercise,
    Output,
    _build,
    _part,
    _register,
    _sizes_of,
    _tensor,
    _variant,
    lab_state_dict,
    package_gpt,
)


class _Embedding(Embedding):
    """Wrong embeddings: one attribute per mistake."""

    offset, positions, scaled, concatenated, table = 0, True, False, False, "pos_emb"
    ids_as_positions = False

    def forward(self, idx):
        N, D = idx.shape[1], self.tok_emb.embedding_dim
        positions = torch.arange(self.offset, self.offset + N, device=idx.device)
        if self.ids_as_positions:
            return self.tok_emb(idx) + self.pos_emb(idx)  # ids >= C: IndexError
        R = getattr(self, self.table)(positions)  # (N, D)
        X = self.tok_emb(idx) * (math.sqrt(D) if self.scaled else 1.0)  # (B, N, D)
        if self.concatenated:
            return torch.cat([X, R.expand_as(X)], dim=-1)  # (B, N, 2D)
        return X + R if self.positions else X


WHY_POSITIONS_OFF_BY_ONE = (
    "your positions are off by one: the first token sits at position 0, so the positions are "
    "torch.arange(N), not 1, ..., N."
)
WHY_NO_POSITIONS = (
    "you left out the position embedding: add R[n] (self.pos_emb of the positions) to each token "
    "vector, or the model cannot tell in which order the tokens came."
)
WHY_EMBEDDING_SCALED = (
    "you multiplied the token vectors by sqrt(D), as the original transformer does with its shared "
    "embeddings; GPT adds them as they are: X = E[idx] + R[positions]."
)
WHY_EMBEDDING_CONCATENATED = (
    "you concatenated the token and position vectors (width 2D); they are added, so X stays "
    "(B, N, D)."
)
WHY_POSITIONS_FROM_TOKEN_TABLE = (
    "you looked the positions up in the token table (self.tok_emb); positions have their own table, "
    "self.pos_emb = nn.Embedding(C, D): X = tok_emb(idx) + pos_emb(torch.arange(N))."
)
WHY_POSITIONS_FROM_TOKEN_IDS = (
    "you looked the position table up with the token ids, pos_emb(idx): a token's position is where "
    "it sits, 0, ..., N - 1, not its id (ids up to V - 1 do not even fit in a table of C rows, hence "
    "the IndexError). Look the positions up: pos_emb(torch.arange(N, device=idx.device))."
)
_OffByOne = _variant(_Embedding, "_OffByOne", offset=1)
_NoPositions = _variant(_Embedding, "_NoPositions", positions=False)
_ScaledTokens = _variant(_Embedding, "_ScaledTokens", scaled=True)
_Concatenated = _variant(_Embedding, "_Concatenated", concatenated=True)
_TokenTable = _variant(_Embedding, "_TokenTable", table="tok_emb")
_IdsAsPositions = _variant(_Embedding, "_IdsAsPositions", ids_as_positions=True)
EMBEDDING_MISTAKES = [
    Mistake(WHY_POSITIONS_OFF_BY_ONE, _OffByOne),
    Mistake(WHY_NO_POSITIONS, _NoPositions),
    Mistake(WHY_EMBEDDING_SCALED, _ScaledTokens),
    Mistake(WHY_EMBEDDING_CONCATENATED, _Concatenated),
    Mistake(WHY_POSITIONS_FROM_TOKEN_TABLE, _TokenTable),
    Mistake(WHY_POSITIONS_FROM_TOKEN_IDS, _IdsAsPositions, "raises"),
]


def _embedding_cases() -> list:
    cases = []
    for k, config in enumerate(_CONFIGS):
        g = torch.Generator().manual_seed(10 + k)
        cases.append(
            (config, torch.randint(config.vocab_size, (2, config.block_size - 1), generator=g))
        )
    return cases


def _observe_embedding(answer: Any, case: tuple) -> Output:
    config, idx = case
    embed = _build(
        answer, config, _part(lab_state_dict(package_gpt(config)), "embed."), "Embedding"
    )
    with torch.no_grad():
        return {"embed(idx)": _tensor(embed(idx), "Embedding.forward")}


def _expected_embedding(case: tuple) -> Output:
    config, idx = case
    model = package_gpt(config)
    with torch.no_grad():
        return {"embed(idx)": model.pos_emb(model.tok_emb(idx))}


def _describe_tokens(case: tuple) -> str:
    return f"case: {_sizes_of(case[0])}; idx {tuple(case[1].shape)}"


_register(
    CapstoneExercise(
        name="language_models.embedding",
        prompt=(
            "Write the class Embedding(config): the token table tok_emb = nn.Embedding(V, D) and the "
            "learned positions pos_emb = nn.Embedding(C, D); forward(idx (B, N)) returns "
            "E[idx] + R[0 : N], shape (B, N, D)."
        ),
        solution=Embedding,
        mistakes=EMBEDDING_MISTAKES,
        cases=_embedding_cases,
        observe=_observe_embedding,
        expected=_expected_embedding,
        describe=_describe_tokens,
        atol=1e-6,
        rtol=1e-6,
        passed="matches the package's embedding",
        registered_by=__name__,
    )
)
