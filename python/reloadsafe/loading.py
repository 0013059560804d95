"""Checkpoints and loading for ``check_reload``: drawing value-changing
checkpoints from a layer's parameters, and the default load through each
parameter's ``weight_loader``."""
from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Tuple

import torch

from .errors import ReloadCheckError
from .reference import storage_view

__all__ = ["Checkpoint", "checkpoint_layouts", "draw_checkpoint", "default_weight_loader", "load_checkpoint"]

#: A checkpoint: tensor name -> tensor (on the CPU, as an mmap'd checkpoint is).
Checkpoint = Dict[str, torch.Tensor]

#: name -> (shape, dtype) of every checkpoint tensor.
Layouts = Dict[str, Tuple[Tuple[int, ...], torch.dtype]]


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


def describe(t: torch.Tensor) -> str:
    """``t``'s form for messages: "a mkldnn float32[16, 64] tensor",
    "a sparse_coo ...", "a quantized qint8[...] tensor", "a dense ..."."""
    if t.layout == torch._mkldnn:  # type: ignore[attr-defined]
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
    a normal distribution, integers over a small range, booleans)."""
    gen = torch.Generator().manual_seed(int(seed))
    ckpt: Checkpoint = {}
    for name, (shape, dtype) in layouts.items():
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).bool()
        elif dtype.is_complex:
            t = torch.randn(shape, generator=gen, dtype=dtype)
        else:
            info = torch.iinfo(dtype)
            t = torch.randint(max(info.min, -128), min(info.max, 127) + 1, shape, generator=gen, dtype=torch.int64)
            t = t.to(dtype)
        ckpt[name] = t
    return ckpt


def default_weight_loader(param: torch.Tensor, loaded: torch.Tensor, *, device: Optional[torch.device] = None) -> None:
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
    module: torch.nn.Module, checkpoint: Mapping[str, torch.Tensor], *, device: Optional[torch.device] = None
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
        loader: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = getattr(target, "weight_loader", None)
        if loader is not None:
            loader(target, loaded)
            continue
        if not is_dense(target):
            raise ReloadCheckError(
                f"the default loader cannot write the checkpoint's '{name}' into the layer's "
                f"'{name}', {describe(target)}: keep '{name}' dense (as the checkpoint holds it) and "
                "convert, quantize or pack it in post-processing, or give it a weight_loader, or pass "
                "load= a function that loads it"
            )
        default_weight_loader(target, loaded, device=device)
