"""Loading safetensors files into tensors that already exist, at their addresses.

The C++ loader of ``utils/file_loader.h`` on Python tensors: each file tensor's
bytes are written into the destination tensor's existing memory, so a captured
CUDA graph that reads the destinations reads the new weights at its next replay.
No storage is allocated, resized or moved, and no device memory is allocated:

    >>> import torch, reloadsafe
    >>> weight = torch.zeros(4, 3)
    >>> loader = reloadsafe.SafetensorsLoader()        # keep it across reloads
    >>> loader.load_(["model.safetensors"], {"weight": weight})  # doctest: +SKIP

Everything is checked before the first byte is written (every header, every
name, dtype, shape, byte range, contiguity, overlap); a refused load raises
``RuntimeError`` naming the tensor and leaves every destination as it was.
Layouts that differ from the file's (a checkpoint tensor that fills a part of a
fused parameter) are the caller's to state, as ``(tensor, byte_offset)``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Union

import torch

from ._loader import _C

__all__ = ["SafetensorsLoader", "load_safetensors_"]

#: A destination: the whole tensor (dtype and shape equal the file's), or
#: ``(tensor, byte_offset)``: the file tensor's bytes at that byte offset into it.
Target = Union[torch.Tensor, "tuple[torch.Tensor, int]"]


class SafetensorsLoader:
    """Loads safetensors files into existing tensors (``utils/file_loader.h``).

    CPU destinations are copied out of a mapping of the file whose pages are
    faulted in first (the fastest of the reads measured: Note [Which read] in
    ``utils/file_loader.h``), on torch's intra-op threads; device destinations
    go through a pinned staging ring of ``ring_slots`` buffers of
    ``chunk_bytes``, filled by ``threads`` reader threads, allocated by the
    first device load and reused by every later one, with the host-to-device
    copies on a stream of their own (on an integrated GPU: the mapping and
    ``copy_weight_``'s page touch). Keep one loader across reloads.

    ``threads=0`` uses the CPUs this process may use (at most 8).
    """

    def __init__(self, threads: int = 0, chunk_bytes: int = 8 << 20, ring_slots: int = 4) -> None:
        self._loader = _C.FileLoader(int(threads), int(chunk_bytes), int(ring_slots))

    def load_(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
              tensors: Mapping[str, Target]) -> int:
        """Fills each destination in ``tensors`` (file tensor name -> tensor, or
        ``(tensor, byte_offset)``) with its bytes from ``paths`` (a file, or the
        shards of one checkpoint; each name must be in exactly one). Names in
        the files that ``tensors`` does not name are not read. Returns the bytes
        written. Raises ``RuntimeError`` before any write when a file or a
        destination is wrong."""
        return int(self._loader.load_(_paths(paths), _targets(tensors)))

    def counters(self) -> dict[str, int]:
        """What this loader has done: ``calls``, ``tensors_loaded``,
        ``bytes_read``, ``staging_allocations`` (0, or 1 for the loader's
        life), ``staging_bytes``, ``staged_copies``, ``mapped_copies``."""
        return dict(self._loader.counters())

    @property
    def threads(self) -> int:
        """The reader threads."""
        return int(self._loader.threads)


def load_safetensors_(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                      tensors: Mapping[str, Target]) -> int:
    """``SafetensorsLoader().load_(paths, tensors)``: a load with a loader of its
    own. Its staging ring (device destinations) is not kept: reloads should
    keep a ``SafetensorsLoader``."""
    return SafetensorsLoader().load_(paths, tensors)


def _paths(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


def _targets(tensors: Mapping[str, Target]) -> list[tuple[str, tuple[torch.Tensor, int | None]]]:
    out: list[tuple[str, tuple[torch.Tensor, int | None]]] = []
    for name, target in tensors.items():
        if isinstance(target, torch.Tensor):
            out.append((str(name), (target, None)))
        elif (isinstance(target, tuple) and len(target) == 2 and isinstance(target[0], torch.Tensor)
              and isinstance(target[1], int) and not isinstance(target[1], bool)):
            out.append((str(name), (target[0], int(target[1]))))
        else:
            raise TypeError(f"load_: the destination of {name!r} must be a tensor or a "
                            f"(tensor, byte_offset) pair, got {type(target).__name__}")
    return out
