"""Claims: the model every claim trains."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..block import PreNormBlock, TransformerStack
from ..language_models import gpt2_init
from ..multihead import SelfAttention
from .positions import AddedPositions

EMBEDDING_STD = 2**-0.5
"""Initial standard deviation of every learned embedding table (tokens, positions): the root mean
square of a sinusoidal code's entries, so every kind of position code meets token vectors of its own
size at initialisation."""


@dataclass(frozen=True)
class ClaimsConfig:
    """Sizes of a :class:`ClaimsLM`: ``vocab_size`` :math:`|\\mathcal V|`, ``block_size`` the
    training windows' length :math:`C`, ``max_len`` the longest sequence it must take (default
    :math:`C`; the length claim evaluates on longer ones), ``n_layers`` :math:`L`, ``H`` heads, width
    ``d_model`` :math:`D`, ``d_pos`` the width of a concatenated position code, and
    ``embedding_std`` the initial standard deviation of every embedding table."""

    vocab_size: int = 65
    block_size: int = 64
    max_len: int | None = None
    n_layers: int = 2
    H: int = 4
    d_model: int = 64
    d_pos: int = 16
    embedding_std: float = EMBEDDING_STD

    def __post_init__(self) -> None:
        if self.d_model % self.H:
            raise ValueError(f"d_model={self.d_model} must be divisible by H={self.H}")
        if min(self.vocab_size, self.block_size, self.n_layers, self.H, self.d_pos) < 1:
            raise ValueError(f"every size must be positive: {self}")
        if self.max_len is not None and self.max_len < self.block_size:
            raise ValueError(f"max_len={self.max_len} is shorter than block_size={self.block_size}")

    @property
    def context(self) -> int:
        """The longest sequence the model takes: ``max_len``, or ``block_size`` when not set."""
        return self.max_len or self.block_size


class ClaimsLM(nn.Module):
    r"""The small causal character model of every claim: :math:`X^{(0)} = \mathrm{pos}(E[\mathbf s])`,
    then :math:`L` causal ``block``s (:class:`.block.TransformerStack`, GELU MLPs of width
    :math:`4D`, a final norm for pre-norm blocks), then a linear head to :math:`|\mathcal V|` logits.

    ``forward(idx (B, N), targets (B, N) | None) -> (logits (B, N, |V|), loss | None)``, the loss being
    the mean next-token cross-entropy (book eq. ``eq-lm-loss``).

    Args:
        config: the sizes (:class:`ClaimsConfig`).
        block: the block class (``PreNormBlock`` by default, or a variant); a class attribute ``Norm``
            also replaces the stack's final LayerNorm.
        positions: a position layer (default: :class:`AddedPositions` of ``config.context`` rows);
            its ``d_extra`` features are taken from the token table's width.

    Initialisation: GPT-2's (:func:`.language_models.gpt2_init`, residual projections scaled by
    :math:`1/\sqrt{2L}`), except that every embedding table starts at ``config.embedding_std``
    (:data:`EMBEDDING_STD` unless changed; GPT-2 uses 0.02). The head
    is not tied to the token table (whose width may be less than :math:`D`).
    """

    def __init__(
        self, config: ClaimsConfig, block: type = PreNormBlock, positions: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.config = c = config
        self.positions = (
            positions if positions is not None else AddedPositions(c.context, c.d_model)
        )
        d_tok = c.d_model - getattr(self.positions, "d_extra", 0)
        if d_tok < 1:
            raise ValueError(f"the position code takes all {c.d_model} features; widen d_model")
        self.tok_emb = nn.Embedding(c.vocab_size, d_tok)
        self.stack = TransformerStack(
            block, c.n_layers, c.d_model, c.H, activation="gelu", causal=True
        )
        Norm = getattr(block, "Norm", None)
        if Norm is not None and block.final_norm:
            self.stack.final_norm = Norm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(gpt2_init)
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))
        for m in self.modules():
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=c.embedding_std)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if idx.dim() != 2:
            raise ValueError(f"idx must be token ids of shape (B, N), got {tuple(idx.shape)}")
        X = self.positions(self.tok_emb(idx))  # (B, N, D)
        logits = self.lm_head(self.stack(X))  # (B, N, |V|)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def unit_variance_qk_(model: nn.Module) -> nn.Module:
    r"""Re-initialise every self-attention layer's query and key maps with entries
    :math:`\mathcal N(0, 1/D)`, in place: for tokens normalised to unit variance, queries and keys then
    have entries of unit variance, the premise of the lecture notes' argument for the scale
    (``bishop2024notes``, sec. 2.10).
    Returns ``model``."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SelfAttention):
                rows = m.in_proj.out_features - m.d_model  # W_q and W_k (W_q alone when tied)
                m.in_proj.weight[:rows].normal_(0.0, 1.0 / math.sqrt(m.d_model))
    return model


def xavier_linear_(model: nn.Module) -> nn.Module:
    r"""Re-initialise every ``nn.Linear`` of ``model`` in place with Glorot & Bengio's uniform
    weights, :math:`\mathcal U(-a, a)` with :math:`a = \sqrt{6/(\text{fan}_\text{in} +
    \text{fan}_\text{out})}`, and zero biases: the initialisation Xiong et al. (2020) analyse, under
    which every branch of a block starts about as large as its input. Every linear map changes,
    the head ``lm_head`` included; the fused query-key-value map ``in_proj`` is drawn as one
    :math:`3D \times D` matrix (fan-out :math:`3D`, as ``nn.MultiheadAttention`` draws its
    ``in_proj_weight``), not as three :math:`D \times D` matrices, so its bound is :math:`\sqrt{6/4D}`
    rather than :math:`\sqrt{6/2D}`. Returns ``model``."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model
