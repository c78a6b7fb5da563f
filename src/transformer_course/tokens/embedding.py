"""Embeddings: token ids to vectors, a row lookup in ``E`` that equals one-hot vectors times ``E``."""

from __future__ import annotations

import torch
from torch import Tensor

from ..runtime import shape_of as _shape


def _check_embedding_args(ids: Tensor, E: Tensor) -> None:
    if not isinstance(ids, Tensor) or not isinstance(E, Tensor):
        raise TypeError(
            f"ids and E must be torch tensors, got {type(ids).__name__} and {type(E).__name__}; "
            "turn a list of ids into one with torch.tensor(ids)"
        )
    if ids.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        raise TypeError(
            f"ids must hold integer token ids, got dtype {ids.dtype}; use torch.long ids "
            "(e.g. tok.encode_tensor(text) or torch.tensor(ids, dtype=torch.long))"
        )
    if E.dim() != 2:
        raise ValueError(
            f"E has shape {_shape(E)}; the embedding matrix must be 2-D, (vocab_size, D): one row "
            "per token"
        )
    V = E.shape[0]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(
            f"token id {bad} is outside the vocabulary: E has {V} rows (vocab_size={V}), so ids run "
            f"from 0 to "
            f"{V - 1}"
        )


def embedding_reference(ids: Tensor, E: Tensor) -> Tensor:
    r"""Embed token ids as one-hot vectors times the embedding matrix, term by term.

    .. math:: X^{(0)} = O E, \qquad O_{nv} = [s_n = v], \quad O \in \{0,1\}^{N\times |\mathcal{V}|},
              \quad E \in \mathbb{R}^{|\mathcal{V}|\times D}

    (eq. ``eq-tok-onehot``.) Row ``n`` of ``O`` is the one-hot vector of token ``s_n``, so row ``n``
    of the product is row ``s_n`` of ``E``: see :func:`embedding`, which returns the same numbers.

    Implements: eq-tok-onehot

    Args:
        ids: integer ids of any shape ``(...)``, each in ``0 .. vocab_size - 1``.
        E: ``(vocab_size, D)``, one row per vocabulary entry (the book's :math:`|\mathcal{V}|\times D`).

    Returns:
        ``(..., D)``, in ``E``'s dtype and device.

    Raises:
        TypeError: if ``ids`` is not an integer tensor.
        ValueError: if ``E`` is not 2-D or an id is outside ``0 .. vocab_size - 1``.
    """
    _check_embedding_args(ids, E)
    O = torch.nn.functional.one_hot(ids.long(), E.shape[0]).to(E.dtype)  # (..., V)
    return O @ E  # (..., |V|) @ (|V|, D) -> (..., D)


def embedding(ids: Tensor, E: Tensor) -> Tensor:
    """Embed token ids by looking up rows of ``E``: ``X[..., :] = E[ids[...], :]``.

    The efficient form of eq. ``eq-tok-onehot`` (``torch.nn.functional.embedding``, which is what
    ``torch.nn.Embedding`` calls); it equals :func:`embedding_reference` without building the
    ``(..., V)`` one-hot tensor.

    Implements: eq-tok-onehot

    Raises:
        TypeError: if ``ids`` is not an integer tensor.
        ValueError: if ``E`` is not 2-D or an id is outside ``0 .. vocab_size - 1``.
    """
    _check_embedding_args(ids, E)
    return torch.nn.functional.embedding(ids.long(), E)  # (..., D)
