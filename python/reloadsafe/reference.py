"""The C++ reference utilities on Python tensors.

These are the reloadsafe C++ implementations (utils/storage_fit.h), called on
the caller's tensors without copies, so a Python implementation of the same
utilities can be checked against the reference directly:

    >>> import torch, reloadsafe
    >>> old = torch.zeros(16, dtype=torch.uint8)
    >>> placed = reloadsafe.in_own_storage(old, torch.ones(4, dtype=torch.int32))
    >>> placed.data_ptr() == old.data_ptr()
    True

No function here grows, shrinks, reallocates or moves a storage.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import torch

from ._loader import _C

__all__ = ["in_own_storage", "storage_view", "extent", "checked_extent", "direct_reload", "direct_reload_enabled"]


def in_own_storage(old: torch.Tensor, new: torch.Tensor, whole_storage: bool = False) -> torch.Tensor:
    """``new`` copied into ``old``'s storage at ``old``'s byte offset when it
    fits there, else ``new`` itself (the same tensor object's data).

    It fits when both are on the same device, ``new`` is not already on
    ``old``'s storage, the byte offset is a multiple of ``new``'s element size,
    and:

    - by default: ``new`` is non-empty and dense, ``old`` is dense, and ``new``
      has no more bytes than ``old`` (an equal-size repack to another dtype fits);
    - with ``whole_storage=True`` (direct reload): ``new`` shares no elements
      and ends within ``old``'s storage (it may be larger than ``old``, padded,
      or empty).

    When it fits, the result is a view on ``old``'s storage with ``new``'s
    shape, strides and dtype holding ``new``'s values; only the bytes it spans
    are written. Otherwise nothing is written.
    """
    _require_tensor("old", old)
    _require_tensor("new", new)
    return _C.in_own_storage(old, new, bool(whole_storage))


def storage_view(
    storage: torch.Tensor | torch.UntypedStorage | torch.TypedStorage,
    offset: int,
    shape: Sequence[int],
    stride: Sequence[int],
    dtype: torch.dtype,
) -> torch.Tensor:
    """A ``dtype`` tensor on ``storage`` (an untyped or legacy typed storage,
    or a tensor whose storage is meant) starting ``offset`` elements of
    ``dtype`` into it, with the given ``shape`` and ``stride`` (in elements).

    Never moves memory; raises ``RuntimeError`` if the view would not fit the
    storage (where ``Tensor.set_`` would silently grow it).
    """
    if isinstance(storage, torch.Tensor):
        storage = storage.untyped_storage()
    elif isinstance(storage, torch.TypedStorage):  # the legacy tensor.storage(): its bytes
        storage = storage.untyped()
    elif not isinstance(storage, torch.UntypedStorage):
        raise TypeError(
            "storage_view: storage must be a torch.UntypedStorage or a tensor (or a legacy "
            f"TypedStorage), got {type(storage).__name__}"
        )
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"storage_view: dtype must be a torch.dtype, got {type(dtype).__name__}")
    return _C.storage_view(storage, int(offset), list(shape), list(stride), dtype)


def extent(tensor: torch.Tensor) -> int:
    """The number of elements ``tensor`` spans in its storage, from its first
    element to its last: 0 when it has no elements, else
    ``1 + sum((size - 1) * stride)``. Gaps count; elements shared by several
    indices (zero strides) count once."""
    _require_tensor("tensor", tensor)
    return _C.extent(tensor)


def checked_extent(sizes: Sequence[int], strides: Sequence[int]) -> int | None:
    """The extent of a layout given as sizes and strides (in elements), or
    ``None`` when the arithmetic overflows int64. Raises on negative sizes or
    strides and on ranks that differ."""
    return _C.checked_extent(list(sizes), list(strides))


def direct_reload_enabled() -> bool:
    """Whether a direct reload is in progress on this thread: inside
    ``direct_reload()``, or inside ``check_reload``'s direct mode. A
    post-processing step may then place a weight anywhere in the old weight's
    storage (``in_own_storage(old, new, whole_storage=direct_reload_enabled())``)."""
    return _C.direct_reload_enabled()


def direct_reload(enabled: bool = True) -> AbstractContextManager[None]:
    """A context manager that sets the direct-reload flag on this thread for
    its block and restores the previous value when it ends (also on an
    exception)::

        with reloadsafe.direct_reload():
            layer.process_weights_after_loading()
    """
    return _C.DirectReloadContext(bool(enabled))


def _require_tensor(what: str, value: object) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
