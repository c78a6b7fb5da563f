"""The GPT of chapter *Autoregressive language models*: its sizes, its presets and the model.

Every part of :class:`GPT` is the course's own: token lookup (:mod:`..tokens`), learned positions
(:mod:`..position`) and a stack of causal pre-norm blocks (:mod:`..block`) over
:class:`..multihead.SelfAttention`, which takes a :class:`..kv_cache.KVCache` per block when it
generates. ``scratch/gpt.py`` writes the same model from scratch; ``tests/test_scratch_gpt.py`` proves
the two equal. The one map between the two models' parameters is here: :func:`scratch_names`,
:func:`scratch_state_dict` (a package GPT's weights under the scratch names, the fused ``in_proj``
split into ``W_q, W_k, W_v``) and :func:`gpt_from_scratch` (a package GPT holding a scratch model's
weights); lab 7's checkers and the tests load weights through them.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..block import ACTIVATIONS, PreNormBlock, TransformerStack
from ..checkpoint import atomic_save
from ..kv_cache import KVCache
from ..position import LearnedPositionalEmbedding

__all__ = [
    "GPT",
    "SHAKESPEARE_CHAPTER",
    "SHAKESPEARE_CPU",
    "SHAKESPEARE_GPU",
    "TINY",
    "GPTConfig",
    "gpt2_init",
    "gpt2_state_dict",
    "gpt_from_scratch",
    "scratch_names",
    "scratch_state_dict",
]


def gpt2_init(module: nn.Module) -> None:
    """The GPT-2-style initialisation of nanoGPT (Karpathy 2022) for one module: N(0, 0.02^2) weights,
    both embedding tables included (GPT-2's released code draws the position table with std 0.01),
    zero biases (use ``model.apply``)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT. ``vocab_size`` is ``|V|``, ``block_size`` the context length
    ``C``, ``n_layers`` the number of blocks ``L``, ``d_model`` the width ``D``, ``H`` the heads;
    ``activation`` names the MLP's (a key of :data:`..block.ACTIVATIONS`: the course trains with
    ``"gelu"``, GPT-2 was trained with ``"gelu_tanh"``) and ``eps`` is every LayerNorm's epsilon."""

    vocab_size: int = 65
    block_size: int = 256
    n_layers: int = 6
    H: int = 6
    d_model: int = 384
    dropout: float = 0.2
    tie_weights: bool = True
    activation: str = "gelu"
    eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.d_model % self.H:
            raise ValueError(f"d_model={self.d_model} must be divisible by H={self.H}")
        if min(self.vocab_size, self.block_size, self.n_layers, self.H) < 1:
            raise ValueError(f"every size must be positive: {self}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; choose one of {sorted(ACTIVATIONS)}"
            )


TINY = GPTConfig(vocab_size=65, block_size=32, n_layers=2, H=2, d_model=32, dropout=0.0)
"""For tests and quick demonstrations."""
SHAKESPEARE_CPU = GPTConfig(vocab_size=65, block_size=64, n_layers=2, H=4, d_model=128, dropout=0.0)
"""Sized for a 2-core CPU and a two-minute budget: shallow and narrow, so that many tokens are seen
(``bench/lm.py`` reports what it reaches; the performance page shows the figures)."""
SHAKESPEARE_CHAPTER = GPTConfig(
    vocab_size=65, block_size=64, n_layers=2, H=4, d_model=64, dropout=0.0
)
"""The chapter's model (``SHAKESPEARE_CHAPTER_RECIPE``): ``SHAKESPEARE_CPU`` at half the width, 64, for
about a minute of one CPU thread, where a narrower model that takes more steps learns more."""
SHAKESPEARE_GPU = GPTConfig(
    vocab_size=65, block_size=256, n_layers=6, H=6, d_model=384, dropout=0.2
)
"""nanoGPT's ``shakespeare_char`` size (Karpathy 2022): 6 layers, 6 heads, 384 wide, context 256."""


def _check_token_ids(idx: Tensor, start: int, config: GPTConfig) -> None:
    """The errors of :meth:`GPT.forward`. Token ids are checked whenever a sequence starts; the tokens
    that continue a cache are the model's own choices and are not checked again (a check costs two
    host synchronisations per token on a GPU)."""
    if idx.dim() != 2 or idx.dtype not in (torch.long, torch.int32):
        raise ValueError(
            f"idx must be integer token ids of shape (B, N), got {idx.dtype} {tuple(idx.shape)}"
        )
    if start + idx.shape[1] > config.block_size:
        raise ValueError(
            f"{start + idx.shape[1]} tokens exceed the context of {config.block_size}; crop "
            "the input (tc.language_models.generate does this for you)"
        )
    if start == 0 and idx.numel() and (idx.min() < 0 or idx.max() >= config.vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {config.vocab_size}), got {idx.min()}..{idx.max()}"
        )


class GPT(nn.Module):
    r"""A decoder-only transformer language model: one forward pass gives every conditional of the
    chain rule, :math:`p(s_{n+1} \mid s_{1:n}) = \operatorname{softmax}(\mathrm{LN}(X^{(L)})
    W_\text{vocab})_n`, and with ``targets`` the mean cross-entropy over all ``B N`` positions.

    Implements: eq-lm-chain, eq-lm-head, eq-lm-loss

    ``forward(idx (B, N), targets (B, N) | None, caches | None) -> (logits (B, N, |V|), loss | None)``.
    With caches (:meth:`new_caches`), ``idx`` holds only the new tokens.
    """

    config_class: type = GPTConfig  # what :meth:`load` rebuilds the config as

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)  # E, (|V|, D)
        self.pos_emb = LearnedPositionalEmbedding(c.block_size, c.d_model)  # R, (C, D)
        self.drop = nn.Dropout(c.dropout)
        self.stack = TransformerStack(  # L causal pre-norm blocks, then a final LayerNorm
            PreNormBlock, c.n_layers, c.d_model, c.H, activation=c.activation, dropout=c.dropout,
            eps=c.eps, causal=True,
        )  # fmt: skip
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # W_vocab = E^T (Press & Wolf 2017)
        self.apply(gpt2_init)
        for name, p in self.named_parameters():  # the residual projections scaled, as nanoGPT
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))

    def num_params(self) -> int:
        """Parameters, each counted once (a tied LM head is not counted twice)."""
        return sum(p.numel() for p in self.parameters())

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per block, each as long as the context."""
        return [KVCache(self.config.block_size) for _ in range(self.config.n_layers)]

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, caches: list[KVCache] | None = None
    ) -> tuple[Tensor, Tensor | None]:
        start = len(caches[0]) if caches else 0  # positions already in the cache
        _check_token_ids(idx, start, self.config)
        X = self.drop(self.pos_emb(self.tok_emb(idx), start=start))  # (B, N, D)
        X = self.stack(X, caches=caches)  # (B, N, D), final LayerNorm included
        logits = self.lm_head(X)  # (B, N, |V|), eq. (eq-lm-head)
        if targets is None:
            return logits, None
        if targets.shape != idx.shape:
            raise ValueError(
                f"targets {tuple(targets.shape)} must have the shape of idx {tuple(idx.shape)}"
            )
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())  # eq. (eq-lm-loss)
        return logits, loss

    def save(self, path: str | pathlib.Path, **extra) -> None:
        """Save config, weights and any ``extra`` (e.g. the tokenizer's characters) to ``path``,
        atomically (:func:`.checkpoint.atomic_save`: a failed save leaves the old file)."""
        atomic_save(
            {"config": dataclasses.asdict(self.config), "state_dict": self.state_dict(), **extra},
            path,
        )

    @classmethod
    def from_huggingface(cls, model) -> GPT:
        """The course's GPT holding the weights of a Hugging Face GPT-2, a
        ``transformers.GPT2LMHeadModel`` or its name on the Hub (``"gpt2"``, ``"gpt2-medium"``, ...;
        ``transformers`` downloads it when online), on its device and in its dtype, in evaluation mode.

        GPT-2 is this model: learned positions, pre-norm blocks, a final LayerNorm and a head tied to
        the token table. What differs is how the weights are stored and two settings: its ``Conv1D``
        layers keep their weight as (in, out), the transpose of ``nn.Linear``'s; its MLP uses GELU in
        the tanh approximation (``activation="gelu_tanh"``); its LayerNorms use
        ``config.layer_norm_epsilon`` (1e-5); its context is ``n_positions`` (1,024). The config is
        read from the model, so any size of GPT-2 loads; ``tests/test_gpt2.py`` proves the logits and
        the greedy continuation equal to the Hugging Face model's.

        Raises:
            ImportError: a name was given and ``transformers`` is not installed.
            ValueError: ``model`` is not a GPT-2, has settings this model cannot reproduce, or a
                tensor whose shape does not fit its config (named in the message).
        """
        if isinstance(model, str):
            try:
                from transformers import GPT2LMHeadModel
            except ImportError as error:
                raise ImportError(
                    "loading GPT-2 by name needs Hugging Face's transformers: pip install transformers"
                ) from error
            model = GPT2LMHeadModel.from_pretrained(model)
        hf = getattr(model, "config", None)
        if getattr(hf, "model_type", None) != "gpt2":
            raise ValueError(
                f"expected a transformers GPT2LMHeadModel, got {type(model).__name__} "
                f"(model_type {getattr(hf, 'model_type', None)!r})"
            )
        activation = _GPT2_ACTIVATIONS.get(hf.activation_function)
        unsupported = {
            "activation_function": activation is None,
            "n_inner": hf.n_inner not in (None, 4 * hf.n_embd),
            "scale_attn_weights": not hf.scale_attn_weights,
            "scale_attn_by_inverse_layer_idx": hf.scale_attn_by_inverse_layer_idx,
        }
        if any(unsupported.values()):
            setting = next(k for k, bad in unsupported.items() if bad)
            raise ValueError(
                f"GPT-2's {setting}={getattr(hf, setting)!r} has no counterpart in the course's GPT"
            )
        config = GPTConfig(
            vocab_size=hf.vocab_size, block_size=hf.n_positions, n_layers=hf.n_layer, H=hf.n_head,
            d_model=hf.n_embd, dropout=0.0, tie_weights=True, activation=activation,
            eps=hf.layer_norm_epsilon,
        )  # fmt: skip
        with torch.random.fork_rng(devices=[]):
            ours = cls(config)
        ref = next(model.parameters())
        ours = ours.to(device=ref.device, dtype=ref.dtype)
        ours.load_state_dict(gpt2_state_dict(model.state_dict(), config))
        return ours.eval()

    @classmethod
    def load(
        cls, path: str | pathlib.Path, map_location: str | torch.device = "cpu"
    ) -> tuple[GPT, dict]:
        """Rebuild a model saved by :meth:`save`; returns ``(model, extra)``."""
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        model = cls(cls.config_class(**ckpt.pop("config")))
        model.load_state_dict(ckpt.pop("state_dict"))
        return model, ckpt


# --------------------------------------------------------------------------------------------------
# GPT-2's weights (Hugging Face's GPT2LMHeadModel) in the package's GPT

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _gpt2_names(config: GPTConfig) -> list[tuple[str, str, bool]]:
    """(the package's name, GPT-2's name, transposed) for every parameter of a GPT of ``config``."""
    names = [("tok_emb.weight", "transformer.wte.weight", False),
             ("pos_emb.table.weight", "transformer.wpe.weight", False)]  # fmt: skip
    for i in range(config.n_layers):
        ours, theirs = f"stack.blocks.{i}.", f"transformer.h.{i}."
        for a, b, transposed in (
            ("norm1", "ln_1", False), ("attn.in_proj", "attn.c_attn", True),
            ("attn.out_proj", "attn.c_proj", True), ("norm2", "ln_2", False),
            ("mlp.fc1", "mlp.c_fc", True), ("mlp.fc2", "mlp.c_proj", True),
        ):  # fmt: skip
            names.append((f"{ours}{a}.weight", f"{theirs}{b}.weight", transposed))
            names.append((f"{ours}{a}.bias", f"{theirs}{b}.bias", False))
    names += [("stack.final_norm.weight", "transformer.ln_f.weight", False),
              ("stack.final_norm.bias", "transformer.ln_f.bias", False)]  # fmt: skip
    return names


def gpt2_state_dict(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """A GPT-2 state dict (Hugging Face's names, ``Conv1D`` weights stored (in, out)) under the names
    of the package's :class:`GPT` of ``config``, each ``Conv1D`` weight transposed to ``nn.Linear``'s
    (out, in); the tied head is the token table (``lm_head.weight``). The query, key and value maps
    stay fused: GPT-2's ``c_attn`` stacks them in the order of ``in_proj``'s rows.

    Raises:
        ValueError: a tensor is missing, or its shape does not fit ``config``; the message names the
            first such tensor, GPT-2's name and the package's.
    """
    expected = {name: tuple(t.shape) for name, t in GPT(config).state_dict().items()}
    out = {}
    for ours, theirs, transposed in _gpt2_names(config):
        if theirs not in state:
            raise ValueError(f"the GPT-2 state dict has no {theirs!r} (for the course's {ours!r})")
        t = state[theirs].t() if transposed else state[theirs]
        if tuple(t.shape) != expected[ours]:
            stored = tuple(state[theirs].shape)
            want = expected[ours][::-1] if transposed else expected[ours]
            raise ValueError(
                f"GPT-2's {theirs} has shape {stored}, but a GPT of {config} needs {want} there "
                f"(the course's {ours}, {expected[ours]}" + (", transposed)" if transposed else ")")
            )
        out[ours] = t
    out["lm_head.weight"] = out["tok_emb.weight"]
    return out


# --------------------------------------------------------------------------------------------------
# The package's GPT and scratch/gpt.py's: one map between their parameters

_SCRATCH_RENAMES = (
    (r"^tok_emb\.", "embed.tok_emb."),
    (r"^pos_emb\.table\.", "embed.pos_emb."),
    (r"^stack\.final_norm\.", "final_norm."),
    (r"^stack\.blocks\.", "blocks."),
    (r"\.attn\.out_proj\.", ".attn.W_o."),
    (r"\.mlp\.fc1\.", ".mlp.0."),
    (r"\.mlp\.fc2\.", ".mlp.2."),
)
_QKV = ("W_q", "W_k", "W_v")  # the blocks of rows of a fused in_proj, in this order


def scratch_names(name: str) -> tuple[str, ...]:
    """The names in ``scratch/gpt.py``'s GPT of the package GPT's parameter ``name``: one, e.g.
    ``stack.blocks.0.mlp.fc1.weight`` -> ``blocks.0.mlp.0.weight``, or three for a fused ``in_proj``,
    whose ``3D`` rows stack ``W_q^T, W_k^T, W_v^T`` (each ``(D, D)`` as ``nn.Linear`` stores it):
    ``stack.blocks.0.attn.in_proj.weight`` -> ``blocks.0.attn.W_q.weight``, ``...W_k.weight``,
    ``...W_v.weight``.

    Seven renames: ``tok_emb.`` -> ``embed.tok_emb.``, ``pos_emb.table.`` -> ``embed.pos_emb.``,
    ``stack.final_norm.`` -> ``final_norm.``, ``stack.blocks.`` -> ``blocks.``, ``attn.out_proj.`` ->
    ``attn.W_o.``, ``mlp.fc1.`` -> ``mlp.0.``, ``mlp.fc2.`` -> ``mlp.2.`` (the scratch MLP is an
    ``nn.Sequential``); ``lm_head.weight`` keeps its name.
    """
    for pattern, replacement in _SCRATCH_RENAMES:
        name = re.sub(pattern, replacement, name)
    if ".attn.in_proj." in name:
        return tuple(name.replace("in_proj", part) for part in _QKV)
    return (name,)


def scratch_state_dict(model: GPT) -> dict[str, Tensor]:
    """The package GPT's weights under the scratch names (:func:`scratch_names`), each fused
    ``in_proj`` split in three; ``scratch.gpt.GPT(model.config).load_state_dict`` takes it (strictly)
    when the head is tied (a tied head appears under both of its names, as in the scratch model)."""
    state = {}
    for name, t in model.state_dict().items():
        names = scratch_names(name)
        for new, part in zip(names, t.chunk(len(names)), strict=True):
            state[new] = part
    return state


def gpt_from_scratch(model: nn.Module) -> GPT:
    """A package :class:`GPT` holding the weights of ``scratch/gpt.py``'s ``model`` (its ``config`` a
    :class:`GPTConfig`): each ``W_q, W_k, W_v`` joined into the fused ``in_proj``, on the scratch
    model's device, in its dtype and its training or evaluation mode. The two compute the same
    function (``tests/test_scratch_gpt.py``); the package's adds the key-value cache, the checks of its
    inputs and the fused attention kernel. The global random state is left as it was.

    Raises:
        ValueError: ``model`` lacks a parameter the package GPT needs, or one has another shape.
    """
    with torch.random.fork_rng(
        devices=[]
    ):  # scratch/gpt.py computes exact GELU, LayerNorm eps 1e-5
        gpt = GPT(dataclasses.replace(model.config, activation="gelu", eps=1e-5))
    own = model.state_dict()
    state = {}
    for name, t in gpt.state_dict().items():
        names = scratch_names(name)
        missing = [n for n in names if n not in own]
        if missing:
            raise ValueError(
                f"the scratch model has no parameter {missing[0]!r} (for the package's {name!r}); "
                "build it with scratch.gpt.GPT(config)"
            )
        joined = torch.cat([own[n] for n in names]) if len(names) > 1 else own[names[0]]
        if joined.shape != t.shape:
            raise ValueError(
                f"{' + '.join(names)} has shape {tuple(joined.shape)}, the package's {name} "
                f"{tuple(t.shape)}"
            )
        state[name] = joined
    ref = next(model.parameters())
    gpt = gpt.to(device=ref.device, dtype=ref.dtype)
    gpt.load_state_dict(state)
    return gpt.train(model.training)
