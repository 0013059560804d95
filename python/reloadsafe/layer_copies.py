"""A layer as its factory built it, kept without the bytes of its
parameters, and copies of it: the layers ``check_reload`` loads aside to
compare reloads with, once one has proven to load as a built layer does
(Note [Layers made aside by copying] in conformance/harness/layer_life.h).

Building a real model is mostly initialising weights that a load overwrites
at once; copying one as built costs an allocation. What a copy shares with
the layer it was made from is what ``copy.deepcopy`` shares (functions,
classes, modules); the protocol's proof compares a copy's cold load with a
built layer's, so a copy that reads anything of another layer's is refused
there, not trusted."""
from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .walk import tensor_parts

__all__ = ["RELOADS_BY_IDENTITY", "LayerAsBuilt", "reloads_by_identity"]

#: The attribute that marks a layer whose reload finds what it needs by the
#: layer's identity (vLLM's layerwise reload: the metadata
#: ``record_metadata_for_reloading`` keeps per module object): a copy loads
#: as it does, but does not reload as it does, so no copy stands for it.
RELOADS_BY_IDENTITY = "_reloadsafe_reloads_by_identity"

#: At most this share of a layer's bytes may be kept as built (buffers,
#: tensor subclasses): beyond it, keeping the template would cost most of
#: a model, the memory the copies are there to spare.
_MAX_KEPT_SHARE = 0.25

#: What every byte of a copy's parameter holds until a load writes it: NaN
#: in every floating dtype, so that a value no load wrote shows in the proof.
_UNWRITTEN = 0xFF


class LayerAsBuilt:
    """``layer`` as built, without its parameters' bytes; ``copy()`` makes a
    new layer from it. Made before ``layer`` is loaded, and leaves ``layer``
    as it is. ``of()`` is the constructor to call: it answers None for a
    layer it cannot keep this way."""

    def __init__(self, layer: torch.nn.Module) -> None:
        def meta_twin(p: torch.Tensor) -> torch.Tensor:
            return torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="meta")

        self._template, twins = _copy_replacing_parameters(layer, meta_twin)
        self._devices = {id(twin): original.device for original, twin in twins}
        # Every name each parameter of the template has (a tied one, several).
        self._names: dict[int, list[str]] = {}
        for name, p in self._template.named_parameters(remove_duplicate=False):
            self._names.setdefault(id(p), []).append(name)

    @classmethod
    def of(cls, layer: torch.nn.Module) -> LayerAsBuilt | None:
        """The template of ``layer``, or None where its parameters hold too
        little of its bytes to spare any (_MAX_KEPT_SHARE), it cannot be
        copied (an object deepcopy refuses), it is compiled (a copy of a
        module compiled with ``module.compile()`` runs eagerly: torch leaves
        the compiled call out of a module's copies), or it or a module of it
        reloads by its identity (``reloads_by_identity``)."""
        if _compiled(layer) or any(getattr(m, RELOADS_BY_IDENTITY, False) for m in layer.modules()):
            return None
        try:
            total, twinned = _bytes(layer)
            if total == 0 or total - twinned > _MAX_KEPT_SHARE * total:
                return None
            return cls(layer)
        except Exception:  # noqa: BLE001 - a layer that cannot be copied is built instead
            return None

    def copy(self, on: Mapping[str, torch.Tensor] | None = None) -> torch.nn.Module:
        """A new layer as the factory would build it, but that every
        parameter's bytes are 0xFF (a load writes them) on its device; or,
        for a parameter that ``on`` holds under one of its names in its very
        layout (dtype, shape, strides, device), that tensor of ``on`` (Note
        [A copy on its checkpoint])."""
        devices, names = self._devices, self._names

        def fresh(twin: torch.Tensor) -> torch.Tensor:
            device = devices.get(id(twin), twin.device)
            for name in names.get(id(twin), ()) if on is not None else ():
                t = on.get(name)  # type: ignore[union-attr]
                if t is not None and _same_layout(t, twin, device):
                    return t
            t = torch.empty_strided(twin.shape, twin.stride(), dtype=twin.dtype, device=device)
            if not t.is_meta:
                t.untyped_storage().fill_(_UNWRITTEN)
            return t

        layer, _ = _copy_replacing_parameters(self._template, fresh)
        return layer


def _same_layout(t: torch.Tensor, twin: torch.Tensor, device: torch.device) -> bool:
    """Whether ``t`` is a plain tensor laid out as the parameter ``twin``
    stands for, on ``device``, from the start of its storage."""
    return (type(t) is torch.Tensor and t.layout == torch.strided and t.device == device
            and t.dtype == twin.dtype and t.shape == twin.shape and t.stride() == twin.stride()
            and t.storage_offset() == 0)


def _compiled(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` or a module in it runs compiled code of its own:
    ``torch.compile(module)``'s wrapper, or ``module.compile()``."""
    if "torch._dynamo" not in sys.modules:
        return False
    from torch._dynamo.eval_frame import OptimizedModule

    return any(isinstance(m, OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None
               for m in layer.modules())


def _plain_parameters(layer: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every parameter of ``layer`` (each once) whose bytes are its own
    storage's: not a tensor subclass made of inner tensors, not sparse or
    mkldnn."""
    seen: set[int] = set()
    out = []
    for _, p in layer.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p.layout == torch.strided and tensor_parts(p) is None:
            out.append(p)
    return out


def _copy_replacing_parameters(
    layer: torch.nn.Module, make: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A deep copy of ``layer`` in which every plain parameter ``p`` is a
    new parameter of ``p``'s class over ``make(p)`` (its attributes deep-
    copied with the rest, so a bound weight loader is the copy's), and the
    pairs (``p``, its twin)."""
    memo: dict[int, Any] = {}
    pairs = []
    for p in _plain_parameters(layer):
        twin = torch.Tensor._make_subclass(type(p), make(p), p.requires_grad)
        memo[id(p)] = twin
        pairs.append((p, twin))
    out = copy.deepcopy(layer, memo)
    for p, twin in pairs:
        twin.__dict__.update(copy.deepcopy(p.__dict__, memo))
    return out, pairs


def _bytes(layer: torch.nn.Module) -> tuple[int, int]:
    """The bytes of ``layer``'s parameters and buffers (each storage once),
    and of those the plain parameters hold."""
    seen: set[int] = set()

    def size(t: torch.Tensor) -> int:
        if t.layout != torch.strided or t.is_meta or tensor_parts(t) is not None:
            return t.numel() * t.element_size()
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()

    twinned = sum(size(p) for p in _plain_parameters(layer))
    rest = sum(size(t) for t in (*layer.parameters(), *layer.buffers()))
    return twinned + rest, twinned


def reloads_by_identity(layer: torch.nn.Module) -> torch.nn.Module:
    """Marks ``layer`` as one whose reload finds what it needs by the
    layer's identity (state kept per module object, such as vLLM's layerwise
    reload records): ``check_reload`` then builds every layer it needs with
    the factory instead of copying one, since a copy would load but not
    reload as a built layer does. Returns ``layer``."""
    setattr(layer, RELOADS_BY_IDENTITY, True)
    return layer
