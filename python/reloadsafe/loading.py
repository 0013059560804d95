"""Checkpoints and loading for ``check_reload``: drawing value-changing
checkpoints from a layer's parameters, and the default load through each
parameter's ``weight_loader``."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._loader import _C
from .errors import ReloadCheckError
from .reference import storage_view

__all__ = [
    "Checkpoint", "CheckpointDrawer", "check_drawable", "checkpoint_layouts", "draw_checkpoint",
    "default_weight_loader", "layout", "layout_hint", "layout_notes", "load_checkpoint",
    "process_weights_after_loading",
]

#: A checkpoint: tensor name -> tensor (on the CPU, as an mmap'd checkpoint is).
Checkpoint = dict[str, torch.Tensor]

#: name -> (shape, dtype) of every checkpoint tensor.
Layouts = dict[str, tuple[tuple[int, ...], torch.dtype]]


def checkpoint_layouts(module: torch.nn.Module) -> Layouts:
    """The checkpoint a freshly built ``module`` expects: every non-empty
    parameter, by name, with its shape and dtype."""
    return {
        name: (tuple(p.shape), p.dtype)
        for name, p in module.named_parameters(remove_duplicate=True)
        if p.numel() > 0
    }


_QUANTIZED_DTYPES = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


def is_dense(t: torch.Tensor) -> bool:
    """Whether ``t`` is what a checkpoint holds and the default loader writes:
    a strided tensor of an ordinary dtype (not mkldnn, sparse or quantized)."""
    return t.layout == torch.strided and t.dtype not in _QUANTIZED_DTYPES


def layout(t: torch.Tensor) -> str:
    """``t``'s dtype and shape for messages: "float32[16, 64]"."""
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def describe(t: torch.Tensor) -> str:
    """``t``'s form for messages: "a mkldnn float32[16, 64] tensor",
    "a sparse_coo ...", "a quantized qint8[...] tensor", "a dense ..."."""
    if t.layout == torch._mkldnn:  # type: ignore[attr-defined, unused-ignore]  # torch's types do not export _mkldnn; unused without torch installed
        kind = "mkldnn"
    elif t.layout != torch.strided:
        kind = str(t.layout).replace("torch.", "")
    elif t.dtype in _QUANTIZED_DTYPES:
        kind = "quantized"
    else:
        kind = "dense"
    return f"a {kind} {str(t.dtype).replace('torch.', '')}{list(t.shape)} tensor"


def draw_checkpoint(layouts: Layouts, seed: int) -> Checkpoint:
    """A checkpoint with the given layouts and values drawn from ``seed``:
    the same names and layouts for every seed, different values (floats from
    a normal distribution, integers from [-128, 127] clipped to the dtype's
    range, booleans). The same checkpoints as
    ``CheckpointDrawer(layouts)(seed)``, which ``check_reload`` uses to draw
    many of them cheaply, and as a C++ subject of the same layouts draws."""
    return CheckpointDrawer(layouts)(seed)


class CheckpointDrawer:
    """Checkpoints of fixed layouts, each seed's values different, at the
    cost of a copy rather than a fresh random draw: the protocol's one
    generator (Note [Checkpoints from a pool] in
    conformance/harness/checkpoint_pools.h), which C++ subjects draw with
    too, so the same layouts and seed give the same checkpoint in both.

    The tensors of one dtype draw from one pool of about a million random
    values (floating and complex values from a normal distribution,
    integers from [-128, 127] clipped to the dtype's range, booleans), drawn
    once, each from a place its name fixes, wrapping around (so the pools
    stay a few MB for a model of any size); the checkpoint of a seed holds,
    for each tensor, a window of its pool at an offset derived from the seed
    and, for floating and complex dtypes, multiplied by a scale in [0.5, 2)
    derived from the seed. So from one seed to another every element
    changes, and not all by one factor (a checkpoint that were a multiple of
    another would quantize to the same bytes, and a stale quantized weight
    would go unseen). Every call returns new tensors, none sharing memory
    with the pool or another checkpoint, in the order of ``layouts``."""

    def __init__(self, layouts: Layouts) -> None:
        self.layouts = dict(layouts)
        self._pools: Any = None  # _C.CheckpointPools, drawn at the first call

    def __call__(self, seed: int) -> Checkpoint:
        if self._pools is None:
            self._pools = _C.CheckpointPools(
                {name: torch.empty(shape, dtype=dtype, device="meta") for name, (shape, dtype) in self.layouts.items()}
            )
        ckpt = self._pools.draw(seed)
        return {name: ckpt[name] for name in self.layouts}


def check_drawable(name: str, probe: torch.nn.Module) -> None:
    """Checkpoints are drawn from the fresh layer's parameters, as dense
    tensors: a parameter of ``probe`` (the layer ``name``, fresh) that is not
    dense (mkldnn, sparse, quantized) cannot be drawn or loaded by default,
    and a layer whose non-empty weights are all buffers has nothing to draw.
    Both raise ReloadCheckError naming them."""
    params = [(n, p) for n, p in probe.named_parameters(remove_duplicate=True) if p.numel() > 0]
    for name, p in params:
        if not is_dense(p):
            raise ReloadCheckError(
                f"check_reload: {name}: parameter '{name}' is {describe(p)}, from which no "
                "checkpoint can be drawn and into which the default loader cannot write. An engine "
                f"loads a dense checkpoint: keep '{name}' a dense (strided) tensor of the checkpoint's "
                f"dtype and {_pack_hint(p)} in post-processing (process_weights_after_loading), or "
                "pass make_checkpoint= (and load= for this tensor)"
            )
    if params:
        return
    buffers = [(n, b) for n, b in probe.named_buffers(remove_duplicate=True) if b.numel() > 0]
    if buffers:
        listed = ", ".join(f"'{n}' ({describe(b)})" for n, b in buffers[:4])
        odd = next(((n, b) for n, b in buffers if not is_dense(b)), None)
        hint = (
            f"; keep '{odd[0]}' dense, as a checkpoint holds it, and {_pack_hint(odd[1])} in post-processing"
            if odd is not None
            else ""
        )
        raise ReloadCheckError(
            f"check_reload: {name} has no non-empty parameters, only buffers ({listed}), and "
            "checkpoints are drawn from parameters: register the tensors the checkpoint holds as "
            f"torch.nn.Parameter, or pass make_checkpoint=lambda seed: {{name: tensor, ...}}{hint}"
        )


def _pack_hint(t: torch.Tensor) -> str:
    """What to do in post-processing to get from a dense tensor to ``t``'s form."""
    if t.layout == torch._mkldnn:  # type: ignore[attr-defined, unused-ignore]  # torch's types do not export _mkldnn; unused without torch installed
        return "convert it (to_mkldnn, torch.utils.mkldnn) or pack it"
    if t.layout != torch.strided:
        return f"make it {str(t.layout).replace('torch.', '')}"
    return "quantize or pack it (torch.quantize_per_tensor, a prepack op)"


def layout_notes(layer: torch.nn.Module, checkpoint: Mapping[str, torch.Tensor]) -> list[str]:
    """Where ``layer``, with ``checkpoint`` just loaded, holds a parameter or
    buffer in another shape or dtype than the checkpoint tensor of its name.
    A hint for a failure, never a refusal: an engine's loader may pad (a
    vocabulary), pack (bitsandbytes) or quantize (online FP8) in the load
    itself, and what is judged is what the forward reads after it."""
    notes = []
    for name, t in checkpoint.items():
        target = _parameter_or_buffer(layer, name)
        if target is not None and (target.shape != t.shape or target.dtype != t.dtype):
            notes.append(f"after load, '{name}' is {layout(target)} where the checkpoint has {layout(t)}")
    return notes


def layout_hint(notes: list[str]) -> str:
    """``layout_notes`` as a sentence, the first three listed; "" for none."""
    if not notes:
        return ""
    listed = "; ".join(notes[:3]) + (f"; and {len(notes) - 3} more" if len(notes) > 3 else "")
    return (
        "Note: " + listed + " (a loader may pad, pack or quantize into its parameter; one that "
        "should not replaced the parameter with the checkpoint's tensor instead of loading into it)"
    )


def _parameter_or_buffer(layer: torch.nn.Module, name: str) -> torch.Tensor | None:
    try:
        return layer.get_parameter(name)
    except AttributeError:
        try:
            return layer.get_buffer(name)
        except AttributeError:
            return None


def default_weight_loader(param: torch.Tensor, loaded: torch.Tensor, *, device: torch.device | None = None) -> None:
    """Writes ``loaded`` into ``param`` in the checkpoint's layout, keeping
    ``param``'s object and, where it fits, its storage.

    If post-processing changed ``param``'s layout (a repack, a transpose, a
    padded view), the checkpoint layout is restored as a view at the start of
    the storage ``param`` already has; only when that storage is too small (a
    released or emptied tensor) does ``param`` get a new one. A parameter on
    the meta device (a layer built without memory) is given memory on
    ``device`` (default: ``loaded``'s device) and then written."""
    if param.is_meta:
        _materialize(param, loaded, torch.device(device) if device is not None else loaded.device)
    strides = torch.empty(loaded.shape, device="meta").stride()
    in_layout = (
        param.shape == loaded.shape
        and param.dtype == loaded.dtype
        and param.stride() == strides
        and param.storage_offset() == 0
    )
    if not in_layout:
        need = loaded.numel() * loaded.element_size()
        if param.untyped_storage().nbytes() >= need:
            param.data = storage_view(param, 0, list(loaded.shape), list(strides), loaded.dtype)
        else:
            param.data = torch.empty(loaded.shape, dtype=loaded.dtype, device=param.device)
    with torch.no_grad():
        param.detach().copy_(loaded)


def _materialize(param: torch.Tensor, loaded: torch.Tensor, device: torch.device) -> None:
    """Gives the meta tensor ``param`` memory for ``loaded`` on ``device``,
    keeping the object, its class and its attributes (``param.data = t``
    cannot move a tensor off the meta device; ``torch.utils.swap_tensors``
    swaps the contents and the attributes, which are put back)."""
    attrs = dict(vars(param))
    empty = torch.empty(loaded.shape, dtype=loaded.dtype, device=device)
    fresh = empty if type(param) is torch.Tensor else torch.Tensor._make_subclass(type(param), empty, param.requires_grad)
    try:
        torch.utils.swap_tensors(param, fresh)
    except RuntimeError as e:
        raise ReloadCheckError(
            f"the default loader cannot give the meta tensor {str(param.dtype).replace('torch.', '')}"
            f"{list(param.shape)} memory ({e}): build the layer on a real device, or give the parameter a "
            "weight_loader that materialises it"
        ) from None
    vars(param).update(attrs)


def _lookup(module: torch.nn.Module, name: str) -> torch.Tensor:
    try:
        return module.get_parameter(name)
    except AttributeError:
        pass
    try:
        return module.get_buffer(name)
    except AttributeError:
        raise ReloadCheckError(
            f"the checkpoint has '{name}' but the layer has no parameter or buffer of that name: "
            "pass load= a function that loads this checkpoint into the layer (through its weight "
            "loaders), or make_checkpoint= one whose names are the layer's parameters"
        ) from None


def load_checkpoint(
    module: torch.nn.Module, checkpoint: Mapping[str, torch.Tensor], *, device: torch.device | None = None
) -> None:
    """Loads ``checkpoint`` into ``module`` as an inference engine does:
    through each parameter's ``weight_loader(param, loaded)`` attribute where
    it has one, else through ``default_weight_loader`` (which gives a meta
    parameter memory on ``device``).

    Raises ``ReloadCheckError`` for a checkpoint name the module lacks, and
    where the default loader would have to write into a tensor that is not
    dense (mkldnn, sparse, quantized)."""
    for name, loaded in checkpoint.items():
        target = _lookup(module, name)
        loader: Callable[[torch.Tensor, torch.Tensor], None] | None = getattr(target, "weight_loader", None)
        if loader is not None:
            try:
                loader(target, loaded)
            except ReloadCheckError:
                raise
            except Exception as e:
                # Named here: the loader's own message rarely says which
                # parameter it was writing, or that post-processing left it
                # in a layout the loader cannot write (a one-way repack).
                raise ReloadCheckError(
                    f"the weight_loader of '{name}' raised {type(e).__name__}: {e}. '{name}' is now "
                    f"{describe(target)} and the checkpoint's is {describe(loaded)}: every load, reloads "
                    "included, goes through the loader, so post-processing must leave the parameter in a "
                    "layout its loader can write (keep a checkpoint-layout parameter and put the kernel "
                    "layout in a buffer of its own)"
                ) from e
            continue
        if not is_dense(target):
            raise ReloadCheckError(
                f"the default loader cannot write the checkpoint's '{name}' into the layer's "
                f"'{name}', {describe(target)}: keep '{name}' dense (as the checkpoint holds it) and "
                "convert, quantize or pack it in post-processing, or give it a weight_loader, or pass "
                "load= a function that loads it"
            )
        default_weight_loader(target, loaded, device=device)


def process_weights_after_loading(layer: torch.nn.Module) -> None:
    """The post-processing ``check_reload`` runs when given no ``process``,
    as an engine's model loader runs it: vLLM's convention first (every
    module, the layer itself included, whose ``quant_method`` has
    ``process_weights_after_loading`` gets ``quant_method.
    process_weights_after_loading(module)``), then the layer's own
    ``process_weights_after_loading()`` if it has one."""
    for module in layer.modules():
        hook = getattr(getattr(module, "quant_method", None), "process_weights_after_loading", None)
        if callable(hook):
            hook(module)
    own = getattr(layer, "process_weights_after_loading", None)
    if callable(own):
        own()
