"""Python versions of the C++ sample backends (conformance/harness/
backends/sample_backends.cc) and negative controls, as plain torch.nn.Modules with
``process_weights_after_loading``: what a backend author would write.

``keep_address`` and ``refill`` are the two moves that keep a captured
graph's addresses: post-processed weights go into the storage the parameter
already has (``reloadsafe.in_own_storage``), derived tensors are refilled in
place.
"""
import functools

import torch

import reloadsafe


def keep_address(param: torch.Tensor, new: torch.Tensor) -> None:
    """``param`` takes ``new``'s values and layout, at ``param``'s address
    when it fits there (in a direct reload: anywhere in its storage)."""
    if new.shape == param.shape and new.stride() == param.stride() and new.dtype == param.dtype:
        param.detach().copy_(new)
        return
    param.data = reloadsafe.in_own_storage(param.detach(), new, whole_storage=reloadsafe.direct_reload_enabled())


def refill(module: torch.nn.Module, name: str, new: torch.Tensor) -> None:
    """The plain attribute ``name`` holds ``new``'s values: refilled in place
    when it has the same shape, dtype and device, else rebound."""
    old = getattr(module, name, None)
    if isinstance(old, torch.Tensor) and old.shape == new.shape and old.dtype == new.dtype and old.device == new.device:
        old.copy_(new)
    else:
        setattr(module, name, new)


def _param(*shape, dtype=torch.float32):
    return torch.nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)


def marlin_pack(w):
    return w.reshape(4, 4, 64).transpose(0, 1).contiguous().view(torch.int32).reshape(4, 64)


def marlin_unpack(packed):
    return packed.contiguous().view(torch.uint8).reshape(4, 4, 64).transpose(0, 1).reshape(16, 64)


class MarlinRepack(torch.nn.Module):
    """uint8 [16,64] weight repacked to int32 [4,64] of the same byte size."""

    input_shape = (8, 64)

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64, dtype=torch.uint8)

    def process_weights_after_loading(self):
        keep_address(self.weight, marlin_pack(self.weight))

    def forward(self, x):
        return torch.mm(x, marlin_unpack(self.weight).float().t())


class RowPadding(torch.nn.Module):
    """[16,60] weight padded to row stride 64: a larger view with gaps, which
    only a direct reload can place in the old storage."""

    input_shape = (8, 60)
    modes = ("direct",)

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 60)

    def process_weights_after_loading(self):
        padded = torch.zeros(16, 64, dtype=self.weight.dtype, device=self.weight.device).narrow(1, 0, 60)
        padded.copy_(self.weight)
        keep_address(self.weight, padded)

    def forward(self, x):
        return torch.mm(x, self.weight.t())


class Transposed(torch.nn.Module):
    """[32,16] weight stored transposed as [16,32]."""

    input_shape = (8, 32)

    def __init__(self):
        super().__init__()
        self.weight = _param(32, 16)

    def process_weights_after_loading(self):
        keep_address(self.weight, self.weight.t().contiguous())

    def forward(self, x):
        return torch.mm(x, self.weight.t())


class MlaDerived(torch.nn.Module):
    """W_UK / W_UV derived from kv_b_proj, plain attributes refilled in place."""

    input_shape = (8, 32)

    def __init__(self):
        super().__init__()
        self.kv_b_proj = _param(64, 32)

    def process_weights_after_loading(self):
        w = self.kv_b_proj
        refill(self, "W_UK", w.narrow(0, 0, 32).t().contiguous())
        refill(self, "W_UV", w.narrow(0, 32, 32).clone())

    def forward(self, x):
        return torch.mm(torch.mm(x, self.W_UK), self.W_UV.t())


class OnlineRequant(torch.nn.Module):
    """float source quantized to int8 qweight with a per-tensor scale; the
    source is released after post-processing and re-materialised by the next
    load (it is empty whenever the forward runs)."""

    input_shape = (8, 64)

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64)
        self.qweight = _param(0, dtype=torch.int8)

    def process_weights_after_loading(self):
        w = self.weight
        scale = w.abs().max().clamp_min(1e-8) / 127.0
        keep_address(self.qweight, (w / scale).round().clamp(-127, 127).to(torch.int8))
        refill(self, "w_scale", scale.reshape(1))
        self.weight.data = torch.empty(0, dtype=w.dtype, device=w.device)  # release the source

    def forward(self, x):
        return torch.mm(x, self.qweight.float().t()) * self.w_scale


class EmptiedWeight(torch.nn.Module):
    """zero_point folded into weight, then emptied (a direct reload keeps its
    storage for the next load)."""

    input_shape = (8, 64)

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64)
        self.zero_point = _param(64)

    def process_weights_after_loading(self):
        keep_address(self.weight, self.weight - self.zero_point)
        keep_address(self.zero_point, self.zero_point.new_empty(0))

    def forward(self, x):
        return torch.mm(x, self.weight.t())


class KernelOwner(torch.nn.Module):
    """A kernel wrapper done right: a functools.partial and a closure that
    read the layer's tensors through the module at call time, and a scale
    refilled in place."""

    input_shape = (8, 64)

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64)

    def process_weights_after_loading(self):
        refill(self, "col_scale", self.weight.abs().amax(0).clamp_min(1e-6))
        keep_address(self.weight, self.weight / self.col_scale)
        self.kernel = functools.partial(_scaled_mm, scale=self.col_scale)

    def forward(self, x):
        return self.kernel(x, self.weight)


def _scaled_mm(x, w, scale):
    return torch.mm(x * scale, w.t())


SAMPLES = [MarlinRepack, RowPadding, Transposed, MlaDerived, OnlineRequant, EmptiedWeight, KernelOwner]


# Negative controls: each loses an address (or memory) on every reload; the
# check must flag the name in `expected`.


class PartialScale(torch.nn.Module):
    """The scale is rebuilt on every post-processing and bound into a new
    functools.partial: the partial's keyword moves."""

    input_shape = (8, 64)
    expected = "kernel.keywords['scale']"

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64)

    def process_weights_after_loading(self):
        self.kernel = functools.partial(_scaled_mm, scale=self.weight.abs().amax(0).clamp_min(1e-6))

    def forward(self, x):
        return self.kernel(x, self.weight)


class ClosureWeight(torch.nn.Module):
    """A transposed copy of the weight captured by a lambda, rebuilt on every
    post-processing: the closure cell moves."""

    input_shape = (8, 64)
    expected = "fn.__closure__[0]"

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64)

    def process_weights_after_loading(self):
        wt = self.weight.t().contiguous()
        self.fn = lambda x: torch.mm(x, wt)

    def forward(self, x):
        return self.fn(x)


_KERNELS: dict[int, "_TransposedKernel"] = {}  # kernel objects outside any module, keyed by layer


class _TransposedKernel:
    def __init__(self, w):
        self.wt = w.t().contiguous()

    def __call__(self, x):
        return torch.mm(x, self.wt)


class OutsideKernel(torch.nn.Module):
    """A transposed copy of the weight held by a kernel object in a global
    registry, outside the module: only the trace sees it."""

    input_shape = (8, 64)
    expected = "aten::mm"

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64)

    def process_weights_after_loading(self):
        _KERNELS[id(self)] = _TransposedKernel(self.weight)

    def forward(self, x):
        return _KERNELS[id(self)](x)


class RebuiltScale(torch.nn.Module):
    """An undeclared per-column scale rebuilt on every post-processing and
    divided by in the forward."""

    input_shape = (8, 64)
    expected = "col_scale"

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64)

    def process_weights_after_loading(self):
        self.col_scale = self.weight.abs().amax(0).clamp_min(1e-6)

    def forward(self, x):
        return torch.mm(x, (self.weight / self.col_scale).t())


_LEAKED: list[torch.Tensor] = []


class Leak(torch.nn.Module):
    """Keeps a copy of every loaded weight alive (outside the module):
    addresses stay, memory grows with every reload."""

    input_shape = (8, 64)
    expected = "memory"

    def __init__(self):
        super().__init__()
        self.weight = _param(16, 64)

    def process_weights_after_loading(self):
        _LEAKED.append(self.weight.detach().clone())

    def forward(self, x):
        return torch.mm(x, self.weight.t())


NEGATIVE_CONTROLS = [PartialScale, ClosureWeight, OutsideKernel, RebuiltScale, Leak]
