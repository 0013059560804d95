"""The device-clean probe of ``check_reload(..., device_clean=True)``: a
layer's load, post-processing and forward run once with torch's default
device set to meta (on a CPU check), so a tensor made without a device, which
would break the layer on a GPU, is named on a CPU."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._device import DeviceContext, _device_constructors
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .errors import ReloadCheckError
from .loading import layout
from .walk import named_tensors

if TYPE_CHECKING:
    from .layer_subject import LayerSubject

__all__ = ["probe", "stray"]

# Note [Device-clean layers]
# A layer is device-clean when every tensor it makes in loading,
# post-processing and forward is made on the device of the weights it is
# given (device=w.device, torch.empty_like, w.new_zeros); one that calls
# torch.zeros(16, 64) without a device works on a CPU and breaks on a GPU
# ("Expected all tensors to be on the same device"). On a CPU machine the
# probe runs the steps with torch's default device set to meta: a tensor
# made without a device lands there, where the walk finds it by name (or
# an op mixing it with the CPU weights raises), while every tensor made
# from the weights stays on the CPU.
#
# Meta stands in for a GPU machine's CPU, and differs from it where a
# correct layer can tell (_DefaultDeviceProbe does what the GPU machine
# does instead):
# - a 0-dim tensor made without a device: CUDA's elementwise ops read a
#   0-dim CPU tensor as a number, so w * torch.tensor(0.5) runs on a GPU;
#   one on meta beside CPU weights raises. It is made on the CPU, as on
#   the GPU machine, and the walk does not name 0-dim tensors. A [1] or
#   [64, 1] tensor is no number to CUDA and is still named. (A kernel
#   that reads a 0-dim tensor's memory, a matmul's bias or a custom op's
#   scale, still fails on a GPU with a CPU one; the probe does not see
#   that.)
# - torch.tensor / as_tensor / asarray of a tensor keep that tensor's
#   device when no device is given and none is set: on the GPU machine
#   torch.tensor(w) is on w's device, under the probe it would be meta.
# - t.data = v between a tensor made without a device and one on the
#   weights' device: set_data moves between CPU and CUDA tensors (both
#   dense backends) but refuses meta. t takes v's data, as on a GPU (so
#   nn.Linear(64, 32) built without a device, its weight's .data set to
#   the loaded weight, is clean; a weight whose .data is set to a tensor
#   made without a device lands on meta and is named).
# - copying a tensor made without a device into one on the weights'
#   device (dst.copy_(src), dst[:] = src) and moving one there
#   (t.to(w.device), t.to(w)): CPU to CUDA copies are legal, but meta has
#   no data to copy. The destination keeps its memory and its values; a
#   moved tensor is made on the weights' device, zeroed: the probe judges
#   where tensors are, not what they hold. A move to a device written as
#   a string (t.to("cpu"), t.cpu()) is left to meta, which has nothing to
#   copy (the probe cannot follow it, below): on a GPU it would leave the
#   tensor on the CPU, not on the weights' device.
# A step that reads the values of a tensor made without a device on the
# host (t.item(), t.tolist()), or runs an op with no meta kernel on one,
# still raises under the probe; the error says the probe cannot follow
# it (_reads_meta_data), not that the layer is not device-clean.


def probe(subject: LayerSubject, layer: torch.nn.Module, x: torch.Tensor) -> None:
    """Load, post-processing and forward of ``layer`` once with torch's
    default device set to the probe's (meta on a CPU check): a ReloadCheckError
    naming what is not device-clean, or saying the probe cannot follow a step."""
    probe = torch.device("meta") if subject.device.type == "cpu" else torch.device("cpu")
    how = f"with torch's default device set to {probe.type} (a device-clean probe)"
    step = f"load or post-processing {how}"
    try:
        with _DefaultDeviceProbe(probe, subject.device):
            subject.load_and_process(layer, subject.first_checkpoint, check_meta=False)
            _check_devices(subject, layer, step, probe)
            step = f"forward {how}"
            _check_output(subject, subject.run_forward(layer, x), step, probe)
            _check_devices(subject, layer, step, probe)
    except ReloadCheckError:
        raise
    except Exception as e:
        mixed = stray(layer, subject.device)
        if _reads_meta_data(e):
            raise ReloadCheckError(
                f"check_reload: {subject.name}: the device-clean probe cannot follow the {step}: it "
                f"raised {type(e).__name__}: {e}. The step reads the values of a tensor made without "
                "a device, or runs an op with no meta kernel on it (on a GPU machine it is a CPU "
                "tensor; under the probe a meta tensor, which has no data), so the probe cannot tell "
                "whether the layer is device-clean. Make that tensor with device=w.device, or check "
                "the layer without device_clean"
            ) from e
        raise ReloadCheckError(
            f"check_reload: {subject.name} is not device-clean: the {step} raised {type(e).__name__}: {e}"
            + (f" ({mixed})" if mixed else "")
            + ". Make every tensor on the device of the weights it comes from (device=w.device, "
            "torch.empty_like(w), w.new_zeros(...)), never with torch's default device"
        ) from e


def stray(layer: torch.nn.Module, device: torch.device, on: bool = False, scalars: bool = True) -> str:
    """The non-empty tensors ``layer`` reaches that are not on
    ``device`` (with ``on``: that are on ``device``), named; without
    ``scalars``, 0-dim ones are left out."""
    found = []
    for n in named_tensors(layer):
        t = n.tensor
        if t.numel() > 0 and (scalars or t.dim() > 0) and (t.device.type == device.type) == on:
            found.append(f"'{n.name}' is on {t.device} ({layout(t)})")
    return "; ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")


def _check_devices(subject: LayerSubject, layer: torch.nn.Module, step: str, probe: torch.device) -> None:
    """No tensor of ``layer`` is on ``probe``, the default device of a
    device-clean probe: one that is was made without a device. A 0-dim
    one is not named: CUDA's elementwise ops read a 0-dim CPU tensor as
    a number (Note [Device-clean layers])."""
    mixed = stray(layer, probe, on=True, scalars=False)
    if mixed:
        raise ReloadCheckError(
            f"check_reload: {subject.name} is not device-clean: after the {step}, {mixed}, but the "
            f"weights are on {subject.device}: make every tensor on the device of the weights it comes "
            "from (device=w.device, torch.empty_like(w), w.new_zeros(...)), never with torch's "
            "default device"
        )


def _check_output(subject: LayerSubject, out: torch.Tensor, step: str, probe: torch.device) -> None:
    if out.device.type == probe.type:
        raise ReloadCheckError(
            f"check_reload: {subject.name} is not device-clean: the {step} returned a tensor on "
            f"{out.device} ({layout(out)}): the forward makes its output without a device; make "
            "it on the input's or the weights' device"
        )


#: Constructors that, given a tensor, keep its device when no device is given.
_FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray)
_SET_DATA = torch.Tensor.data.__set__

#: What torch raises where an op needs the data of a meta tensor, or has no
#: meta kernel: under the device-clean probe, a step that reads the values
#: of a tensor made without a device, or runs an op meta cannot run.
_META_HAS_NO_DATA = re.compile(
    r"cannot be called on meta tensors|Cannot copy out of meta tensor|can't convert meta device type tensor"
    r"|with Meta tensors, but there was no fake impl or Meta kernel|could not find the fake impl for this operator"
    r"|as a correct data-independent implementation does not exist"
    r"|with arguments from the '\w*Meta' backend"
)


def _reads_meta_data(e: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if _META_HAS_NO_DATA.search(str(cur)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _plain(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not is_traceable_wrapper_subclass(x)


def _basic_index(index: Any) -> bool:
    """An index of ints, slices, ``...`` and ``None`` only: assigning
    through it copies into a view (copy_), whatever the value's device."""
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


class _DefaultDeviceProbe(DeviceContext):
    """torch's default device set to ``probe`` for a device-clean probe;
    where ``probe`` is meta (a CPU check), what a GPU machine does with a
    tensor made without a device (a CPU one there) where meta does
    otherwise: Note [Device-clean layers]."""

    def __init__(self, probe: torch.device, weights: torch.device) -> None:
        super().__init__(probe)
        self.weights = weights
        self.emulate = probe.type == "meta" and weights.type != "meta"

    def _on_weights(self, t: Any) -> bool:
        return _plain(t) and t.device.type == self.weights.type

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if not self.emulate:
            return super().__torch_function__(func, types, args, kwargs)
        if func in _device_constructors() and kwargs.get("device") is None:
            if func in _FROM_DATA and args and isinstance(args[0], torch.Tensor):
                return func(*args, **kwargs)  # on its data's device, as with no default device set
            kwargs.pop("device", None)
            out = func(*args, device=self.device, **kwargs)
            if isinstance(out, torch.Tensor) and out.dim() == 0 and "out" not in kwargs:
                out = func(*args, device=torch.device("cpu"), **kwargs)  # a number to CUDA's elementwise ops
            return out
        if func == _SET_DATA and len(args) == 2 and _plain(args[0]) and _plain(args[1]):
            t, v = args
            if t.is_meta != v.is_meta and self._on_weights(v if t.is_meta else t):
                # set_data between a GPU machine's CPU and CUDA; t takes v's data.
                alias = v.detach()
                if t.requires_grad and (alias.is_floating_point() or alias.is_complex()):
                    alias.requires_grad_(True)
                torch._C._swap_tensor_impl(t, alias)
                return None
        elif func is torch.Tensor.copy_ and len(args) >= 2 and self._on_weights(args[0]) and _plain(args[1]):
            if args[1].is_meta:
                return args[0]  # a legal copy into the weights' device; the values are not the probe's
        elif func is torch.Tensor.__setitem__ and len(args) == 3 and self._on_weights(args[0]):
            if _plain(args[2]) and args[2].is_meta and _basic_index(args[1]):
                return None  # the same copy, into a view
        elif func is torch.Tensor.to and args and _plain(args[0]) and args[0].is_meta:
            target = args[1] if len(args) > 1 else kwargs.get("device", kwargs.get("other"))
            if isinstance(target, torch.Tensor):
                target_device, dtype = target.device, target.dtype
            elif isinstance(target, torch.device):
                target_device = target
                given = [a for a in args[2:] if isinstance(a, torch.dtype)]
                dtype = kwargs.get("dtype", given[0] if given else args[0].dtype)
            else:
                target_device = None
            if target_device is not None and target_device.type == self.weights.type:
                return torch.zeros(args[0].shape, dtype=dtype, device=target_device)
        return func(*args, **kwargs)
