"""Layers built the way backends build them, on real quantization libraries
and on PyTorch's own CPU kernels, for python/tests/real.

Every layer loads a dense float checkpoint (``weight`` [32, 64], some a
``bias``) through reloadsafe's default loader and turns it into what its
kernel reads in ``process_weights_after_loading``. Each comes in two
variants:

- *rebuilt* (``expected`` names what must be flagged): the natural
  post-processing, which quantizes or packs again on every reload and binds
  the result anew: a captured graph would keep reading the old tensors or
  the old packed object;
- *in place* (no ``expected``): the same kernel, with every tensor the kernel
  reads refilled in place on a reload (inner tensors ``copy_``'d), so nothing
  a captured graph holds moves. These must pass with no violation and no
  warning.

The libraries are imported where a layer is built, so this module imports
without them (the tests skip a layer whose library is missing).
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

OUT, IN = 32, 64
INPUT_SHAPE = (8, IN)


def _param(*shape: int) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.zeros(*shape), requires_grad=False)


def refill_in_place(old: Any, new: Any) -> None:
    """Copies ``new``'s values into ``old``: tensor into tensor, and for a
    wrapper subclass each inner tensor (``__tensor_flatten__``) into the old
    one, recursively; nothing of ``old`` is rebound."""
    if is_traceable_wrapper_subclass(old):
        names, _ = old.__tensor_flatten__()
        for name in names:
            refill_in_place(getattr(old, name), getattr(new, name))
        return
    assert old.shape == new.shape and old.dtype == new.dtype, (old.shape, new.shape, old.dtype, new.dtype)
    old.copy_(new)


class _RealLayer(torch.nn.Module):
    """A dense checkpoint (``weight``, ``bias``) and a kernel made from it."""

    input_shape = INPUT_SHAPE
    library: str | None = None  # the module pytest.importorskip needs
    expected: str | None = None  # rebuilt variants: a name that must be flagged
    #: rebuilt variants: every name in here must be among the flagged ones
    expected_all: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.weight = _param(OUT, IN)
        self.bias = _param(OUT)


# torchao: quantize_(linear, Int8WeightOnlyConfig()) makes the weight an
# Int8Tensor, a traceable wrapper subclass over qdata (int8), scale and
# zero_point.


def _torchao_int8(weight: torch.Tensor) -> torch.Tensor:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    lin = torch.nn.Linear(IN, OUT, bias=False)
    lin.weight.data = weight.detach().clone()
    quantize_(lin, Int8WeightOnlyConfig())
    return lin.weight


class TorchaoInt8Rebuilt(_RealLayer):
    """torchao Int8WeightOnlyConfig: quantize_ on every post-processing, the
    new Int8Tensor bound as ``qweight``."""

    library = "torchao"
    expected: str | None = "qweight.qdata"
    expected_all: tuple[str, ...] = ("qweight.qdata", "qweight.scale")

    def process_weights_after_loading(self) -> None:
        self.qweight = _torchao_int8(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.qweight, self.bias)


class TorchaoInt8InPlace(TorchaoInt8Rebuilt):
    """torchao Int8WeightOnlyConfig, the first Int8Tensor kept: a reload
    quantizes again and copies qdata, scale and zero_point into it."""

    expected = None
    expected_all = ()

    def process_weights_after_loading(self) -> None:
        new = _torchao_int8(self.weight)
        if not hasattr(self, "qweight"):
            self.qweight = new
        else:
            refill_in_place(self.qweight, new)


# bitsandbytes NF4 through its functional API: quantize_4bit gives packed
# 4-bit codes and a QuantState (absmax per block, the NF4 code table);
# dequantize_4bit (a torch.library op with a CPU kernel) reverses it.


def _nf4(weight: torch.Tensor) -> tuple[torch.Tensor, Any]:
    import bitsandbytes.functional as bnbf

    return bnbf.quantize_4bit(weight.detach().contiguous(), blocksize=64, quant_type="nf4")


class BnbNf4Rebuilt(_RealLayer):
    """bitsandbytes NF4: quantize_4bit on every post-processing, new codes
    and a new QuantState bound."""

    library = "bitsandbytes"
    expected: str | None = "qweight"
    expected_all: tuple[str, ...] = ("qweight", "quant_state.absmax")

    def process_weights_after_loading(self) -> None:
        self.qweight, self.quant_state = _nf4(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import bitsandbytes.functional as bnbf

        return F.linear(x, bnbf.dequantize_4bit(self.qweight, self.quant_state), self.bias)


class BnbNf4InPlace(BnbNf4Rebuilt):
    """bitsandbytes NF4, the first codes and QuantState kept: a reload
    quantizes again and copies the codes and the state's tensors into them."""

    expected = None
    expected_all = ()

    def process_weights_after_loading(self) -> None:
        q, state = _nf4(self.weight)
        if not hasattr(self, "qweight"):
            self.qweight, self.quant_state = q, state
            return
        self.qweight.copy_(q)
        refill_quant_state(self.quant_state, state)


# bitsandbytes Linear4bit itself: Params4bit quantizes when moved to a device.


def _linear4bit(weight: torch.Tensor) -> torch.nn.Module:
    import bitsandbytes as bnb

    lin = bnb.nn.Linear4bit(IN, OUT, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(weight.detach().clone(), requires_grad=False, quant_type="nf4", module=lin)
    return lin.to(weight.device)  # quantizes: the weight becomes packed codes + quant_state


class BnbLinear4bitRebuilt(_RealLayer):
    """bitsandbytes Linear4bit: a new Linear4bit (quantized by .to()) on
    every post-processing."""

    library = "bitsandbytes"
    expected: str | None = "lin.weight"

    def process_weights_after_loading(self) -> None:
        self.lin = _linear4bit(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.bias


def first_forward_repacked(lin: torch.nn.Module) -> bool:
    return bool(getattr(lin.weight.quant_state, "packing_format_for_cpu", False))


class BnbLinear4bitInPlace(BnbLinear4bitRebuilt):
    """bitsandbytes Linear4bit, the first one kept: a reload quantizes the
    new weight the way Params4bit does and copies codes and absmax into the
    kept ones; where the layer's first forward repacked the weight for the
    CPU kernel (AVX512-BF16 CPUs), the new codes are repacked the same way
    before they are copied."""

    expected = None

    def process_weights_after_loading(self) -> None:
        if not hasattr(self, "lin"):
            self.lin = _linear4bit(self.weight)
            return
        import bitsandbytes.functional as bnbf

        weight = self.lin.weight
        # Quantized as Params4bit quantizes (its block size, nested absmax
        # statistics, type and storage), then refilled into the kept tensors.
        q, state = bnbf.quantize_4bit(
            self.weight.detach().contiguous(), blocksize=weight.blocksize,
            compress_statistics=weight.compress_statistics, quant_type=weight.quant_type,
            quant_storage=weight.quant_storage,
        )
        if first_forward_repacked(self.lin):
            q, state = bnbf._convert_weight_packed_for_cpu(q, state)
        weight.data.copy_(q.view(weight.dtype).reshape(weight.shape))
        refill_quant_state(weight.quant_state, state)


def refill_quant_state(old: Any, new: Any) -> None:
    """Copies every tensor of a bitsandbytes QuantState (absmax, code,
    offset, and the nested state2's) into the kept one."""
    for name, value in vars(new).items():
        if isinstance(value, torch.Tensor):
            getattr(old, name).copy_(value)
        elif type(value).__name__ == "QuantState":
            refill_quant_state(getattr(old, name), value)


# What Linear4bit's forward does on a CPU with AVX512-BF16 (not this
# machine's): the first forward converts the weight to the kernel's packed
# layout, rebinding the weight's data and the quant state's absmax, and marks
# the state as converted; later forwards use the packed form as it is. The
# model below does the same with its own packed layout: codes unpacked to
# one per byte, in 32-row blocks of interleaved columns, and absmax
# transposed per block.

_BLOCK_N = 32


def _repack_for_cpu(q: torch.Tensor, absmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = q.reshape(-1)
    codes = torch.stack([flat >> 4, flat & 0xF], dim=1).reshape(OUT, IN)  # one NF4 code per byte
    packed = codes.reshape(OUT // _BLOCK_N, _BLOCK_N, IN).transpose(1, 2).contiguous()
    return packed, absmax.reshape(OUT, IN // 64).t().contiguous()


def _unpack_for_cpu(packed: torch.Tensor, absmax_t: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    codes = packed.transpose(1, 2).reshape(OUT, IN).long()
    values = code[codes].reshape(OUT, IN // 64, 64)
    return (values * absmax_t.t().unsqueeze(-1)).reshape(OUT, IN)


class FirstForwardRepackRebuilt(_RealLayer):
    """Linear4bit's CPU first-forward repack, with NF4 from bitsandbytes: a
    reload quantizes anew (a new weight object and quant state, not yet
    repacked), so the next forward repacks again into new memory."""

    library = "bitsandbytes"
    expected: str | None = "qweight"
    expected_all: tuple[str, ...] = ("qweight", "quant_state.absmax")

    def process_weights_after_loading(self) -> None:
        q, state = _nf4(self.weight)
        self.qweight = torch.nn.Parameter(q, requires_grad=False)
        self.quant_state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.quant_state
        if not getattr(state, "repacked_for_cpu", False):
            self.qweight.data, state.absmax = _repack_for_cpu(self.qweight.data, state.absmax)
            state.repacked_for_cpu = True
        return F.linear(x, _unpack_for_cpu(self.qweight, state.absmax, state.code), self.bias)


class FirstForwardRepackInPlace(FirstForwardRepackRebuilt):
    """The first-forward repack kept: the warm-up forward repacks once; a
    reload quantizes, repacks the new codes itself and copies them and the
    absmax into the repacked tensors, so the forward never repacks again."""

    expected = None
    expected_all = ()

    def process_weights_after_loading(self) -> None:
        q, state = _nf4(self.weight)
        if not hasattr(self, "qweight"):
            self.qweight = torch.nn.Parameter(q, requires_grad=False)
            self.quant_state = state
            return
        if getattr(self.quant_state, "repacked_for_cpu", False):
            q, absmax = _repack_for_cpu(q, state.absmax)
        else:
            absmax = state.absmax
        self.qweight.copy_(q)
        self.quant_state.absmax.copy_(absmax)


# fbgemm through PyTorch's own ops: quantized::linear_prepack packs a qint8
# weight into a LinearPackedParamsBase (a TorchBind object, opaque to
# Python); quantized::linear_dynamic reads it. The packed object cannot be
# refilled in place (it has no method that writes new values into its
# buffers), so a layer that reloads fbgemm-packed weights without moving
# them cannot be written: the in-place variant packs a fixed projection once
# (not part of the reloaded checkpoint, built from a fixed seed) and keeps it
# beside the dense weights it does reload.


#
# torch 2.15 deprecates creating quantized (qint8) tensors, which the int8
# packing needs: from 2.15 on, the layers pack with fbgemm's fp16 variant
# instead (linear_prepack_fp16 of the float weight: the same
# LinearPackedParamsBase class, read by quantized::linear_dynamic_fp16), and
# quantize_dynamic quantizes to float16.
QUANTIZED_TENSORS_DEPRECATED = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 15)
#: the op that reads a packed object, and the dtype quantize_dynamic packs to
LINEAR_DYNAMIC = "quantized::linear_dynamic_fp16" if QUANTIZED_TENSORS_DEPRECATED else "quantized::linear_dynamic"
_DYNAMIC_DTYPE = torch.float16 if QUANTIZED_TENSORS_DEPRECATED else torch.qint8


def _prepack(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    b = None if bias is None else bias.detach()
    if QUANTIZED_TENSORS_DEPRECATED:
        return torch.ops.quantized.linear_prepack_fp16(weight.detach(), b)
    scale = float(weight.abs().max().clamp_min(1e-8)) / 127.0
    qw = torch.quantize_per_tensor(weight.detach(), scale, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(qw, b)


def _linear_dynamic(x: torch.Tensor, packed: Any) -> torch.Tensor:
    if QUANTIZED_TENSORS_DEPRECATED:
        return torch.ops.quantized.linear_dynamic_fp16(x, packed)
    return torch.ops.quantized.linear_dynamic(x, packed)


def _fixed_weight(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class FbgemmPrepackRebuilt(_RealLayer):
    """fbgemm: linear_prepack on every post-processing, the new packed
    object bound as ``packed``; the forward is one linear_dynamic."""

    expected = LINEAR_DYNAMIC
    expected_all = ("packed",)

    def process_weights_after_loading(self) -> None:
        self.packed = _prepack(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear_dynamic(x, self.packed)


class FbgemmPrepackKept(_RealLayer):
    """fbgemm kept: a fixed projection packed once at construction (not in
    the checkpoint), beside the reloaded dense weight and bias, which are
    written in place by the default loader."""

    def __init__(self) -> None:
        super().__init__()
        self.packed = _prepack(_fixed_weight(11, OUT, IN), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear_dynamic(x, self.packed) + F.linear(x, self.weight, self.bias)


def _quantize_dynamic(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Module:
    lin = torch.nn.Linear(IN, OUT, bias=bias is not None)
    lin.weight.data = weight.detach().clone()
    if bias is not None:
        lin.bias.data = bias.detach().clone()
    return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=_DYNAMIC_DTYPE)[0]


class QuantizeDynamicRebuilt(_RealLayer):
    """torch.ao quantize_dynamic (fbgemm) on every post-processing: a new
    dynamic quantized Linear, whose packed params are a new object."""

    expected = LINEAR_DYNAMIC
    expected_all = ("q._packed_params._packed_params",)

    def process_weights_after_loading(self) -> None:
        self.q = _quantize_dynamic(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x)


class QuantizeDynamicKept(_RealLayer):
    """quantize_dynamic kept: a fixed projection quantized once at
    construction (not in the checkpoint) beside the reloaded dense weight."""

    def __init__(self) -> None:
        super().__init__()
        self.q = _quantize_dynamic(_fixed_weight(12, OUT, IN), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) + F.linear(x, self.weight, self.bias)


# torch._weight_int8pack_mm: int8 weight [N, K] with per-row scales.


def _int8_per_row(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scales = weight.abs().amax(dim=1).clamp_min(1e-8) / 127.0
    return (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales


class Int8PackMmRebuilt(_RealLayer):
    """torch._weight_int8pack_mm: int8 weight and scales made anew and bound
    on every post-processing."""

    expected: str | None = "w_int8"
    expected_all: tuple[str, ...] = ("w_int8", "w_scales")

    def process_weights_after_loading(self) -> None:
        self.w_int8, self.w_scales = _int8_per_row(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.w_int8, self.w_scales) + self.bias


class Int8PackMmInPlace(Int8PackMmRebuilt):
    """torch._weight_int8pack_mm with the int8 weight and scales refilled."""

    expected = None
    expected_all = ()

    def process_weights_after_loading(self) -> None:
        q, s = _int8_per_row(self.weight)
        if not hasattr(self, "w_int8"):
            self.w_int8, self.w_scales = q, s
        else:
            self.w_int8.copy_(q)
            self.w_scales.copy_(s)


# A plain __torch_dispatch__ wrapper subclass, the pattern optimum-quanto and
# others use: the wrapper holds int8 ``qdata`` and a float per-row ``scale``,
# and its dispatch turns aten.mm(x, w) into a dense mm. ``qdata`` can itself
# be a wrapper (a nested subclass), whose inner tensors are then the payload.


class ScaledWeight(torch.Tensor):
    """A [K, N] weight as ``qdata`` (int8, or another ScaledWeight) times a
    per-column ``scale``; only torch.mm(x, w) and the aliasing ops a
    captured call needs are implemented."""

    @staticmethod
    def __new__(cls, qdata: torch.Tensor, scale: torch.Tensor) -> ScaledWeight:
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=scale.dtype, device=qdata.device)

    def __init__(self, qdata: torch.Tensor, scale: torch.Tensor) -> None:
        self.qdata = qdata
        self.scale = scale

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], ctx: None, outer_size: Any, outer_stride: Any) -> ScaledWeight:
        return ScaledWeight(inner["qdata"], inner["scale"])

    def __repr__(self) -> str:
        return f"ScaledWeight({tuple(self.shape)})"

    def dense(self) -> torch.Tensor:
        """The float weight, computed with ops on the inner tensors."""
        inner = self.qdata.dense() if isinstance(self.qdata, ScaledWeight) else self.qdata.to(self.scale.dtype)
        return inner * self.scale

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.mm.default:
            a, b = args
            return torch.mm(a.dense() if isinstance(a, ScaledWeight) else a, b.dense() if isinstance(b, ScaledWeight) else b)
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            (w,) = args
            return ScaledWeight(func(w.qdata), func(w.scale))
        raise NotImplementedError(f"ScaledWeight: {func} is not implemented")


def _scaled(weight: torch.Tensor, nested: bool) -> ScaledWeight:
    wt = weight.detach().t()  # [K, N]
    col = wt.abs().amax(dim=0).clamp_min(1e-8) / 127.0
    q = (wt / col).round().clamp(-127, 127).to(torch.int8).contiguous()
    if not nested:
        return ScaledWeight(q, col)
    # The int8 payload split into an int8 part and a per-row factor of its
    # own, as a double-quantized weight is: qdata is itself a ScaledWeight.
    # The factor is made on the weight's device: made without one it is a
    # CPU [64, 1] tensor on a GPU, and dense() multiplying the CUDA codes by
    # it raises (check_reload's device-clean probe names it; test_real_device_clean).
    row = torch.full((wt.shape[0], 1), 0.5, device=wt.device)
    return ScaledWeight(ScaledWeight(q, row), col * 2.0)


class DispatchSubclassRebuilt(_RealLayer):
    """A plain __torch_dispatch__ subclass weight made anew and bound on
    every post-processing."""

    nested = False
    expected: str | None = "qweight.qdata"
    expected_all: tuple[str, ...] = ("qweight.qdata", "qweight.scale")

    def process_weights_after_loading(self) -> None:
        self.qweight = _scaled(self.weight, self.nested)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.qweight) + self.bias


class DispatchSubclassInPlace(DispatchSubclassRebuilt):
    """The subclass weight kept, its inner tensors copy_'d."""

    expected = None
    expected_all = ()

    def process_weights_after_loading(self) -> None:
        new = _scaled(self.weight, self.nested)
        if not hasattr(self, "qweight"):
            self.qweight = new
        else:
            refill_in_place(self.qweight, new)


class NestedSubclassRebuilt(DispatchSubclassRebuilt):
    """A subclass whose inner ``qdata`` is itself a subclass, made anew."""

    nested = True
    expected = "qweight.qdata.qdata"
    expected_all = ("qweight.qdata.qdata", "qweight.qdata.scale", "qweight.scale")


class NestedSubclassInPlace(DispatchSubclassInPlace):
    """The nested subclass kept, every leaf copy_'d."""

    nested = True


# A negative control the trace cannot see: a kernel object holding a raw
# pointer (an int) to a transposed copy of the weight, read with ctypes.
# The copy lives outside the module (in a registry a library would keep),
# and post-processing re-creates it on every reload while the kernel object,
# made once, keeps the old address. Only the forward differing from a fresh
# cold load can show it, and that holds deterministically only while freed
# storages are poisoned (the check's quarantine).

_RAW_COPIES: weakref.WeakKeyDictionary[torch.nn.Module, torch.Tensor] = weakref.WeakKeyDictionary()


class _RawPointerKernel:
    def __init__(self, t: torch.Tensor) -> None:
        self._ptr = t.data_ptr()  # an int: nothing keeps the tensor alive
        self._nbytes = t.numel() * t.element_size()
        self._shape = tuple(t.shape)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        wt = torch.empty(self._shape)
        ctypes.memmove(wt.data_ptr(), self._ptr, self._nbytes)  # invisible to the dispatcher
        return torch.mm(x, wt) + bias  # bias: a declared tensor the trace sees


class RawPointerKernel(_RealLayer):
    """Negative control: a raw-pointer read of a re-created weight copy."""

    expected = "forward"

    def process_weights_after_loading(self) -> None:
        _RAW_COPIES[self] = self.weight.detach().t().contiguous()
        if not hasattr(self, "kernel"):
            self.kernel = _RawPointerKernel(_RAW_COPIES[self])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, self.bias)


#: (rebuilt, in place) pairs, one per backend pattern.
PAIRS = [
    (TorchaoInt8Rebuilt, TorchaoInt8InPlace),
    (BnbNf4Rebuilt, BnbNf4InPlace),
    (BnbLinear4bitRebuilt, BnbLinear4bitInPlace),
    (FirstForwardRepackRebuilt, FirstForwardRepackInPlace),
    (FbgemmPrepackRebuilt, FbgemmPrepackKept),
    (QuantizeDynamicRebuilt, QuantizeDynamicKept),
    (Int8PackMmRebuilt, Int8PackMmInPlace),
    (DispatchSubclassRebuilt, DispatchSubclassInPlace),
    (NestedSubclassRebuilt, NestedSubclassInPlace),
]
REBUILT = [r for r, _ in PAIRS]
IN_PLACE = [k for _, k in PAIRS]
NEGATIVE_CONTROLS = [RawPointerKernel]
ALL = REBUILT + IN_PLACE + NEGATIVE_CONTROLS


def need(cls: Any) -> None:
    """In a test: skip, naming the library, when ``cls`` needs one that is
    not installed (pytest is imported here only, so measure.py runs
    without it)."""
    if cls.library is not None:
        import pytest

        pytest.importorskip(cls.library, reason=f"{cls.__name__} needs {cls.library} (not in this environment: pip install it; the main test environment tools/setup.sh makes has it)")
