"""Sleep and wake between reloads, as engines do between RL steps, and the
module-level caches an author asks the check to treat as the layer's.

Engines free the GPU between rollouts: vLLM's sleep mode (level 1 offloads
the weights to host memory and restores them on wake; level 2 discards them
and the trainer's weights are loaded again after wake, with the registered
buffers restored from a host copy), SGLang's memory-saver pause. Both keep
every address (the memory is unmapped and mapped again), so a captured graph
stays valid, but what was in memory the wake does not restore is garbage.
``check_reload(..., sleep=1 or 2)`` does this before every reload (the C++
protocol's sleep step, conformance/harness/reload_steps.h; the Python
subject names the storages, buffers and parameters):

- sleep: the contents of every storage the layer reaches (``named_tensors``:
  parameters, buffers, attributes, kernel objects, closures; and the tensors
  of ``module_caches``) are discarded in place: floating point (and complex)
  elements become NaN, integer and boolean ones 0 (fresh pages come back
  zeroed; a zero index still indexes, so the garbage is read, not refused);
- wake: level 2 restores the registered buffers (``named_buffers``, the
  non-persistent ones included) from a host copy taken before sleeping, as
  vLLM's wake does; level 1, where vLLM keeps the weights' memory on the
  host, restores everything the cold load made (every storage the layer
  reached before its first forward), so only what a forward made since is
  lost;
- then the reload loads the checkpoint and post-processes, as after a wake.

Anything the forward or post-processing still reads that was neither
restored nor rewritten is garbage, and shows: in the value checks, and by
name with ``compare_state=True``.

Module caches: ``module_caches={"name": mapping}`` names mutable mappings
kept at module level (``_PERM_CACHE = {}``) whose tensors post-processing
reads. They are slept with the layer, compared by name under
``compare_state`` (``name[key]``), and every cold load made aside (the
reference forward, the state comparison) runs with them emptied and puts
their contents back after, so a corrupted cache cannot corrupt the
reference too. Each mode of the check starts from empty caches too, and
the caches get back what they held when the mode ends, so a check leaves
them as it found them. Their tensors are not held to their addresses (a
cache may rightly be rebuilt; the forward's reads of it are traced anyway).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import torch

from ._loader import _C

__all__ = ["Caches", "cache_tensors", "caches_emptied", "discard"]

Caches = Mapping[str, MutableMapping[Any, Any]]


def _key(k: Any) -> str:
    return f"[{k!r}]"


def cache_tensors(caches: Caches) -> list[tuple[str, torch.Tensor]]:
    """The tensors of ``caches``, named ``name[key]`` (``name[key][i]`` for
    a tuple or list of tensors)."""
    out: list[tuple[str, torch.Tensor]] = []
    for name, cache in caches.items():
        for k, v in list(cache.items()):
            if isinstance(v, torch.Tensor):
                out.append((f"{name}{_key(k)}", v))
            elif isinstance(v, (tuple, list)):
                out += [(f"{name}{_key(k)}[{i}]", t) for i, t in enumerate(v) if isinstance(t, torch.Tensor)]
    return out


@contextlib.contextmanager
def caches_emptied(caches: Caches) -> Iterator[dict[str, dict[Any, Any]]]:
    """Empties ``caches`` for the block, then puts their contents back. The
    dict it yields holds, after the block, what each cache held at its end
    (a cold load's own cache entries)."""
    saved = {name: dict(cache) for name, cache in caches.items()}
    seen: dict[str, dict[Any, Any]] = {}
    for cache in caches.values():
        cache.clear()
    try:
        yield seen
    finally:
        for name, cache in caches.items():
            seen[name] = dict(cache)
            cache.clear()
            cache.update(saved[name])


def discard(t: torch.Tensor, integer: int = 0) -> None:
    """Overwrites every element of ``t``'s whole storage, in place: NaN for
    a floating or complex dtype, ``integer`` otherwise (the protocol's own
    garbage, ``discard_storage`` in conformance/harness/reload_steps.h)."""
    _C.discard_storage(t, integer)
