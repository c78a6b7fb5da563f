"""Token ids as a list of Python ints: the one conversion the tokenizers share (a private helper)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

from ..runtime import shape_of as _shape


def _as_id_list(ids: Iterable[int] | Tensor) -> list[int]:
    """Token ids as a list of Python ints; a tensor must be 1-D (one sequence)."""
    if isinstance(ids, Tensor):
        if ids.dim() != 1:
            raise ValueError(
                f"ids has shape {_shape(ids)}; decode takes one sequence, a 1-D tensor of ids "
                "(decode a batch row by row: [tok.decode(row) for row in batch])"
            )
        return [int(i) for i in ids.tolist()]
    return [int(i) for i in ids]
