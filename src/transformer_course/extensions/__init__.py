"""Extensions: what modern transformers change, each part proven equal to its definition.

Chapter: *Extensions* (it fills the empty "Extensions" section of the Jupyter Book retelling of Turner
2023, and follows Turner's sec. 3 pointer to encodings that bring relative positions into attention).
Each part is a small function or class, with a reference that reads like its equation:

* norms and MLPs: :class:`RMSNorm` (Zhang & Sennrich 2019), gated MLPs and :class:`SwiGLU`
  (Dauphin et al. 2017; Shazeer 2020), sized by :func:`swiglu_hidden` to the GELU MLP's parameters;
* positions inside attention: rotary embeddings (:func:`apply_rope`, :class:`RotaryEmbedding`; Su et
  al. 2024) and linear biases (:func:`alibi_attention`; Press et al. 2022);
* fewer key-value heads: :class:`GroupedQueryAttention` (Shazeer 2019; Ainslie et al. 2023) and the
  size of its cache, :func:`kv_cache_bytes`;
* exact attention in less memory: :func:`online_softmax` (Milakov & Gimelshein 2018) and
  :func:`tiled_attention` (Dao et al. 2022), with :func:`largest_intermediate` and
  :func:`peak_memory` to measure what they save; its backward pass recomputed from the stored
  log-sum-exp (:func:`tiled_attention_with_grad`; Dao 2024) and the memory traffic of both forms
  (:func:`tiled_attention_io`, :class:`IOCounter`);
* local attention: :func:`sliding_window_mask` for :class:`.multihead.SelfAttention`, the banded
  :func:`sliding_window_attention`, the rolling-buffer cache :class:`RollingKVCache` (Jiang et al.
  2023) and stacks of local and global layers (:func:`local_global_windows`; Gemma Team 2024);
* a sparse mixture of experts: :func:`top_k_router`, :class:`MixtureOfExperts` with an expert
  capacity and dropped tokens, and :func:`load_balancing_loss` (Shazeer et al. 2017; Lepikhin et al.
  2021; Fedus et al. 2022);
* a modern GPT assembled from these parts (:class:`ModernGPT`: RMSNorm, SwiGLU, RoPE, no position
  table; Touvron et al. 2023), reusing the course's pre-norm block, stack, GPT and training loop.

Rows are tokens. Comparisons with PyTorch's own modules that newer versions added (``nn.RMSNorm``
in 2.4, ``enable_gqa`` in 2.5) go through :func:`torch_lacks`, which says why a check is skipped on an
older torch; nothing here requires them.
"""

from __future__ import annotations

from .alibi import (
    ALiBiBlock,
    ALiBiSelfAttention,
    alibi_attention,
    alibi_attention_reference,
    alibi_bias,
    alibi_scheme,
    alibi_slopes,
)
from .experts import (
    EXPERT_KINDS,
    MixtureOfExperts,
    MoEOutput,
    Routing,
    capacity_keep,
    expert_capacity,
    load_balancing_loss,
    moe_parameter_counts,
    moe_reference,
    top_k_router,
)
from .flash import (
    IOCounter,
    TiledAttentionFunction,
    largest_intermediate,
    materialised_attention,
    materialised_attention_io,
    online_softmax,
    peak_memory,
    tiled_attention,
    tiled_attention_backward,
    tiled_attention_forward,
    tiled_attention_io,
    tiled_attention_with_grad,
)
from .gated_mlp import GATES, GatedMLP, SwiGLU, gated_mlp_reference, swiglu_hidden
from .grouped_query import GroupedQueryAttention, gqa_reference, kv_cache_bytes, repeat_kv
from .modern_gpt import (
    MODERN_CPU,
    MODERN_CPU_RECIPE,
    ModernBlock,
    ModernGPT,
    ModernGPTConfig,
    RotaryBlock,
    rope_scheme,
    train_modern_lm,
)
from .norms import RMSNorm, rms_norm_reference
from .rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_complex,
    apply_rope_halves,
    apply_rope_reference,
    rope_frequencies,
    rope_rotation_matrix,
)
from .sliding_window import (
    RollingKVCache,
    decode_windowed,
    forward_with_masks,
    interleaved_masks,
    kv_cache_entries,
    local_global_windows,
    receptive_field,
    sliding_window_attention,
    sliding_window_attention_reference,
    sliding_window_edges,
    sliding_window_mask,
)
from .versions import torch_lacks

__all__ = [
    "EXPERT_KINDS",
    "GATES",
    "MODERN_CPU",
    "MODERN_CPU_RECIPE",
    "ALiBiBlock",
    "ALiBiSelfAttention",
    "GatedMLP",
    "GroupedQueryAttention",
    "IOCounter",
    "MixtureOfExperts",
    "MoEOutput",
    "ModernBlock",
    "ModernGPT",
    "ModernGPTConfig",
    "RMSNorm",
    "RollingKVCache",
    "RotaryBlock",
    "RotaryEmbedding",
    "Routing",
    "SwiGLU",
    "TiledAttentionFunction",
    "alibi_attention",
    "alibi_attention_reference",
    "alibi_bias",
    "alibi_scheme",
    "alibi_slopes",
    "apply_rope",
    "apply_rope_complex",
    "apply_rope_halves",
    "apply_rope_reference",
    "capacity_keep",
    "decode_windowed",
    "expert_capacity",
    "forward_with_masks",
    "gated_mlp_reference",
    "gqa_reference",
    "interleaved_masks",
    "kv_cache_bytes",
    "kv_cache_entries",
    "largest_intermediate",
    "load_balancing_loss",
    "local_global_windows",
    "materialised_attention",
    "materialised_attention_io",
    "moe_parameter_counts",
    "moe_reference",
    "online_softmax",
    "peak_memory",
    "receptive_field",
    "repeat_kv",
    "rms_norm_reference",
    "rope_frequencies",
    "rope_rotation_matrix",
    "rope_scheme",
    "sliding_window_attention",
    "sliding_window_attention_reference",
    "sliding_window_edges",
    "sliding_window_mask",
    "swiglu_hidden",
    "tiled_attention",
    "tiled_attention_backward",
    "tiled_attention_forward",
    "tiled_attention_io",
    "tiled_attention_with_grad",
    "top_k_router",
    "torch_lacks",
    "train_modern_lm",
]
