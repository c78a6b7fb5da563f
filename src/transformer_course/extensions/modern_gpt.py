"""Extensions: a modern GPT: RMSNorm, SwiGLU, RoPE, no position table."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..block import PreNormBlock, TransformerStack
from ..language_models import (
    GPT,
    SHAKESPEARE_CPU_RECIPE,
    GPTConfig,
    LMRecipe,
    LMRun,
    gpt2_init,
    train_char_lm,
)
from .gated_mlp import SwiGLU
from .grouped_query import GroupedQueryAttention
from .norms import RMSNorm
from .rope import RotaryEmbedding


@dataclass(frozen=True)
class ModernGPTConfig(GPTConfig):
    """Sizes of a :class:`ModernGPT`: a :class:`.language_models.GPTConfig` plus ``H_kv`` key-value
    heads (default ``H``), the SwiGLU width ``d_ff`` (default :func:`swiglu_hidden`), the RoPE base and
    the RMSNorm ``eps``."""

    H_kv: int | None = None
    d_ff: int | None = None
    rope_base: float = 10_000.0
    eps: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        H_kv = self.H if self.H_kv is None else self.H_kv
        if H_kv < 1 or self.H % H_kv:
            raise ValueError(f"H_kv={self.H_kv} must divide H={self.H}")
        if (self.d_model // self.H) % 2:
            raise ValueError(
                f"RoPE rotates pairs of features, so d_k = d_model / H = {self.d_model // self.H} "
                "must be even"
            )


class ModernBlock(PreNormBlock):
    """The pre-norm block of :class:`.block.PreNormBlock` (its ``forward`` is inherited unchanged:
    ``Z = X + attn(norm1(X))``, ``Z + mlp(norm2(Z))``) with modern parts: :class:`RMSNorm` for both
    norms, :class:`GroupedQueryAttention` with :class:`RotaryEmbedding` on the queries and keys, and
    a :class:`SwiGLU` MLP; no biases anywhere."""

    def __init__(
        self,
        d_model: int,
        H: int,
        H_kv: int | None = None,
        d_ff: int | None = None,
        rope_base: float = 10_000.0,
        dropout: float = 0.0,
        eps: float = 1e-5,
        causal: bool = True,
    ) -> None:
        nn.Module.__init__(self)  # the parts are not PreNormBlock's: build them here
        rope = RotaryEmbedding(d_model // H, rope_base)
        self.attn = GroupedQueryAttention(d_model, H, H_kv, causal, rope, dropout=dropout)
        self.mlp = SwiGLU(d_model, d_ff)
        self.norm1, self.norm2 = RMSNorm(d_model, eps), RMSNorm(d_model, eps)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def load_from_torch(self, layer: nn.Module) -> ModernBlock:
        raise TypeError("a ModernBlock has no counterpart in torch.nn to copy weights from")


class RotaryBlock(PreNormBlock):
    """:class:`.block.PreNormBlock` with rotary positions in its attention and nothing else changed
    (LayerNorm, the MLP, biases): the block that isolates RoPE, for the length-generalisation
    experiment of chapter *Claims* (:func:`rope_scheme`)."""

    def __init__(self, d_model: int, H: int, **kwargs) -> None:
        super().__init__(d_model, H, **kwargs)
        rope = RotaryEmbedding(d_model // H, kwargs.get("rope_base", 10_000.0))
        causal, dropout = kwargs.get("causal", False), kwargs.get("dropout", 0.0)
        self.attn = GroupedQueryAttention(d_model, H, None, causal, rope, True, dropout)


def rope_scheme(config) -> nn.Module:
    """RoPE as a position scheme of :func:`.claims.length_generalisation`: a
    :class:`.claims.ClaimsLM` with no position code added to the tokens and :class:`RotaryBlock` s,
    so that it differs from the other schemes only in how positions enter."""
    from ..claims import ClaimsLM, NoPositions  # chapter 11's model; imported only when asked for

    return ClaimsLM(config, block=RotaryBlock, positions=NoPositions())


class _NoPositionTable(nn.Module):
    """Stands where a GPT adds its learned positions: RoPE brings positions into attention instead."""

    def forward(self, X: Tensor, start: int = 0) -> Tensor:
        return X


class ModernGPT(GPT):
    r"""A decoder-only language model with the changes of LLaMA (Touvron et al. 2023), book eq.
    ``eq-ext-modern``: :math:`\mathbf{x}^{(0)}_n = E[s_n]` (no position table), ``L``
    :class:`ModernBlock` s, a final :class:`RMSNorm`, and the GPT's tied head (``tie_weights``; LLaMA
    keeps a separate output matrix).

    Everything else is :class:`.language_models.GPT`'s: ``forward``, the loss, the key-value caches
    and therefore :func:`.language_models.generate`, ``save`` and ``load``.

    Implements: eq-ext-modern
    """

    config_class = ModernGPTConfig

    def __init__(self, config: ModernGPTConfig) -> None:
        if not isinstance(config, ModernGPTConfig):
            raise TypeError(f"ModernGPT needs a ModernGPTConfig, got {type(config).__name__}")
        nn.Module.__init__(self)
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = _NoPositionTable()
        self.drop = nn.Dropout(c.dropout)
        self.stack = TransformerStack(
            ModernBlock, c.n_layers, c.d_model, c.H, H_kv=c.H_kv, d_ff=c.d_ff,
            rope_base=c.rope_base, dropout=c.dropout, eps=c.eps, causal=True,
        )  # fmt: skip
        self.stack.final_norm = RMSNorm(
            c.d_model, c.eps
        )  # the stack's final norm, RMS like the rest
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(gpt2_init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))


MODERN_CPU = ModernGPTConfig(
    vocab_size=65, block_size=64, n_layers=2, H=4, d_model=128, dropout=0.0
)
"""``SHAKESPEARE_CPU``'s sizes (2 layers, 4 heads, width 128, context 64) with the modern parts."""
MODERN_CPU_RECIPE = LMRecipe(
    model=MODERN_CPU,
    train=SHAKESPEARE_CPU_RECIPE.train,
    batch_size=SHAKESPEARE_CPU_RECIPE.batch_size,
)
"""``SHAKESPEARE_CPU_RECIPE``'s optimisation settings, unchanged, for the modern model."""


def train_modern_lm(
    recipe: LMRecipe = MODERN_CPU_RECIPE,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> LMRun:
    """Train a :class:`ModernGPT` on tiny-shakespeare exactly as
    :func:`.language_models.train_char_lm` trains a GPT (same split, tokenizer, batches, held-out
    windows and loop); only the model class differs. ``recipe.model`` must be a
    :class:`ModernGPTConfig`."""
    if not isinstance(recipe.model, ModernGPTConfig):
        raise TypeError(
            f"train_modern_lm needs recipe.model to be a ModernGPTConfig, got "
            f"{type(recipe.model).__name__}; use language_models.train_char_lm for a GPTConfig"
        )
    return train_char_lm(recipe, device, steps, seed, progress, model_cls=ModernGPT)
