"""Class F: a tensor the forward reads is held by a kernel object, a
``functools.partial`` or a config object that post-processing rebuilds, so
the engine's copy-back (which restores registered parameters) never sees it.
The fixes keep the object (or move the tensor onto the layer) and refill."""
from __future__ import annotations

import functools
import types
from typing import Any

import torch
import torch.nn.functional as F

from . import Bug
from ._layers import bind_or_assign, param

E, H, IM = 4, 16, 8  # experts, hidden, intermediate


def _swiglu_experts(x, w13, w2, scale=None):
    """Dense MoE over all experts (no routing): [T, H] -> [T, H]."""
    h = torch.einsum("th,eoh->teo", x, w13)
    if scale is not None:
        h = h * scale.view(1, -1, 1)
    gate, up = h.split(w13.shape[1] // 2, dim=2)
    return torch.einsum("tei,ehi->th", F.silu(gate) * up, w2)


# Z01 -- vLLM #41670: CUTLASS FP8 MoE strides made by a kernel object rebuilt
# by every post-processing.


class _CutlassExperts:
    """The kernel: per-expert strides into the flattened weights, and a copy
    of the per-expert scale, made when it is built."""

    def __init__(self, layer):
        dev = layer.w13.device
        self.ab_strides1 = torch.full((E,), 2 * IM * H, dtype=torch.int64, device=dev)
        self.c_strides1 = torch.full((E,), H * IM, dtype=torch.int64, device=dev)
        self.w1_scale = layer.w13_scale * 1.0

    def __call__(self, layer, x, ab_strides1, c_strides1, w1_scale):
        dev = x.device
        rows13 = (torch.arange(E, device=dev) * ab_strides1).view(E, 1) + torch.arange(2 * IM * H, device=dev)
        w13 = layer.w13.reshape(-1).index_select(0, rows13.reshape(-1)).view(E, 2 * IM, H)
        rows2 = (torch.arange(E, device=dev) * c_strides1).view(E, 1) + torch.arange(H * IM, device=dev)
        w2 = layer.w2.reshape(-1).index_select(0, rows2.reshape(-1)).view(E, H, IM)
        return _swiglu_experts(x, w13, w2, w1_scale)


class CutlassMoeBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13 = param(E, 2 * IM, H)
        self.w2 = param(E, H, IM)
        self.w13_scale = param(E)
        self.kernel: Any = None

    def process_weights_after_loading(self):
        self.kernel = _CutlassExperts(self)  # new strides, new scale copy

    def forward(self, x):
        k = self.kernel
        return k(self, x, k.ab_strides1, k.c_strides1, k.w1_scale)


class CutlassMoeFixed(CutlassMoeBuggy):
    def __init__(self):
        super().__init__()
        # Layer-owned slots: moved with the layer, never re-made.
        self.register_buffer("ab_strides1", torch.full((E,), 2 * IM * H, dtype=torch.int64), persistent=False)
        self.register_buffer("c_strides1", torch.full((E,), H * IM, dtype=torch.int64), persistent=False)

    def process_weights_after_loading(self):
        if self.kernel is None:
            self.kernel = _CutlassExperts(self)
        self.kernel.w1_scale.copy_(self.w13_scale)

    def forward(self, x):
        return self.kernel(self, x, self.ab_strides1, self.c_strides1, self.kernel.w1_scale)


# Z02 -- vLLM #48438: Marlin's workspace on the kernel object and the act-order
# sort indices, both made anew by every post-processing.

K, N, GS = 32, 16, 8  # in, out, group size


def _dequant(qweight, scales):
    return qweight.float() * scales.repeat_interleave(GS, 0)


class MarlinActOrderBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qweight = param(K, N, dtype=torch.int8)
        self.scales = param(K // GS, N)
        self.g_idx = param(K, dtype=torch.int32)
        self.kernel = types.SimpleNamespace(workspace=None)

    def process_weights_after_loading(self):
        perm = torch.argsort(self.g_idx, stable=True)
        self.qweight.copy_(self.qweight[perm])
        self.g_idx_sort_indices = perm  # rebound every time
        # Marlin's lock counters must start at zero: a new zeroed workspace.
        self.kernel.workspace = torch.zeros(N, device=self.qweight.device)

    def forward(self, x):
        xp = x.index_select(1, self.g_idx_sort_indices)
        return torch.mm(xp, _dequant(self.qweight, self.scales)) + self.kernel.workspace


class MarlinActOrderFixed(MarlinActOrderBuggy):
    def __init__(self):
        super().__init__()
        self.register_buffer("g_idx_sort_indices", torch.zeros(K, dtype=torch.int64), persistent=False)

    def process_weights_after_loading(self):
        perm = torch.argsort(self.g_idx, stable=True)
        self.qweight.copy_(self.qweight[perm])
        self.g_idx_sort_indices.copy_(perm)
        if self.kernel.workspace is None:  # marlin_make_workspace_new(existing=...)
            self.kernel.workspace = torch.zeros(N, device=self.qweight.device)
        else:
            self.kernel.workspace.zero_()


# Z05 -- vLLM #48539: Machete's act-order permutation bound into a
# functools.partial rebuilt by every post-processing.


class MacheteActOrderBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(K, N)
        self.g_idx = param(K, dtype=torch.int32)
        self.kernel = types.SimpleNamespace(act_perm=None)

    def process_weights_after_loading(self):
        perm = torch.argsort(self.g_idx, stable=True)
        self.weight.copy_(self.weight[perm])
        self.kernel.act_perm = functools.partial(torch.index_select, dim=1, index=perm)

    def forward(self, x):
        return torch.mm(self.kernel.act_perm(x), self.weight)


class MacheteActOrderFixed(MacheteActOrderBuggy):
    def __init__(self):
        super().__init__()
        self.register_buffer("g_idx_sort_indices", torch.zeros(K, dtype=torch.int64), persistent=False)

    def process_weights_after_loading(self):
        perm = torch.argsort(self.g_idx, stable=True)
        self.weight.copy_(self.weight[perm])
        self.g_idx_sort_indices.copy_(perm)

    def forward(self, x):
        return torch.mm(x.index_select(1, self.g_idx_sort_indices), self.weight)


# Z06 -- vLLM #50521: FlashInfer CUTLASS MoE SwiGLU constants allocated by an
# experts object that every post-processing rebuilds.


class _FlashInferExperts:
    def __init__(self, device):
        self.gemm1_alpha = torch.full((E,), 1.702, device=device)
        self.gemm1_beta = torch.ones(E, device=device)
        self.gemm1_clamp_limit = torch.full((E,), 7.0, device=device)


def _clamped_swiglu(x, w13, w2, alpha, beta, limit):
    h = torch.einsum("th,eoh->teo", x, w13)
    gate, up = h.split(IM, dim=2)
    lim = limit.view(1, E, 1)
    gate = torch.minimum(gate, lim)
    up = torch.maximum(torch.minimum(up, lim), -lim)
    act = gate * torch.sigmoid(alpha.view(1, E, 1) * gate) * (up + beta.view(1, E, 1))
    return torch.einsum("tei,ehi->th", act, w2)


class FlashInferMoeConstantsBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13 = param(E, 2 * IM, H)
        self.w2 = param(E, H, IM)

    def process_weights_after_loading(self):
        self.experts: Any = _FlashInferExperts(self.w13.device)

    def forward(self, x):
        ex = self.experts
        return _clamped_swiglu(x, self.w13, self.w2, ex.gemm1_alpha, ex.gemm1_beta, ex.gemm1_clamp_limit)


class FlashInferMoeConstantsFixed(FlashInferMoeConstantsBuggy):
    def __init__(self):
        super().__init__()
        self.register_buffer("gemm1_alpha", torch.full((E,), 1.702), persistent=False)
        self.register_buffer("gemm1_beta", torch.ones(E), persistent=False)
        self.register_buffer("gemm1_clamp_limit", torch.full((E,), 7.0), persistent=False)

    def process_weights_after_loading(self):
        self.experts = types.SimpleNamespace(layer_owned=True)  # reads through the layer

    def forward(self, x):
        return _clamped_swiglu(x, self.w13, self.w2, self.gemm1_alpha, self.gemm1_beta, self.gemm1_clamp_limit)


# Z07 -- vLLM #50538: B12x MoE runtime scales on a rebuilt experts object, and
# a wrapper with routing workspaces built lazily by the first forward after.


class _B12xWrapper:
    def __init__(self, device):
        self.routing_meta = torch.zeros(E + 1, dtype=torch.int64, device=device)


class _B12xExperts:
    def __init__(self, layer):
        self._fc2_input_scale = 1.0 / layer.w2_input_scale
        self.w1_sf_mma = layer.w13_scale.permute(0, 2, 1).contiguous()
        self.wrapper = None


def _b12x_forward(x, w13, w2, w1_sf, fc2_scale, wrapper):
    ids = x.abs().argmax(dim=1) % E
    meta = wrapper.routing_meta
    meta.zero_()
    meta.index_add_(0, ids + 1, torch.ones_like(ids))
    counts = meta.cumsum(0)[1:] - meta.cumsum(0)[:-1]
    w = w13 * w1_sf.repeat_interleave(H // 2, dim=2)  # two scale blocks along H
    h = torch.einsum("th,eoh->teo", x, w)
    gate, up = h.split(IM, dim=2)
    act = F.silu(gate) * up * fc2_scale.view(1, E, 1)
    return torch.einsum("tei,ehi->th", act, w2) + counts.sum().to(x.dtype)


class B12xMoeBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13 = param(E, 2 * IM, H)
        self.w2 = param(E, H, IM)
        self.w13_scale = param(E, 2, 2 * IM)
        self.w2_input_scale = param(E)

    def process_weights_after_loading(self):
        self.experts: Any = _B12xExperts(self)

    def forward(self, x):
        ex = self.experts
        if ex.wrapper is None:
            ex.wrapper = _B12xWrapper(x.device)
        return _b12x_forward(x, self.w13, self.w2, ex.w1_sf_mma, ex._fc2_input_scale, ex.wrapper)


class B12xMoeFixed(B12xMoeBuggy):
    def __init__(self):
        super().__init__()
        self.register_buffer("_fc2_input_scale", torch.zeros(E), persistent=False)
        self.register_buffer("w1_sf_mma", torch.zeros(E, 2 * IM, 2), persistent=False)
        self.experts = None

    def process_weights_after_loading(self):
        self._fc2_input_scale.copy_(1.0 / self.w2_input_scale)
        self.w1_sf_mma.copy_(self.w13_scale.permute(0, 2, 1))
        if self.experts is None:  # the experts object (and its wrapper) survive reloads
            self.experts = types.SimpleNamespace(wrapper=None)

    def forward(self, x):
        ex = self.experts
        if ex.wrapper is None:
            ex.wrapper = _B12xWrapper(x.device)
        return _b12x_forward(x, self.w13, self.w2, self.w1_sf_mma, self._fc2_input_scale, ex.wrapper)


# Z13 -- vLLM #57954 (after #50074): the kernel config is kept across reloads,
# but quantization installs a new w13_scale_2 parameter; the config's alphas
# still reference the old one, so g1_scale_c is derived from old scales.


class OnlineNvfp4MoeBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13 = param(E, 2 * IM, H)
        self.w2 = param(E, H, IM)
        self.a2_scale = param(E)
        self.register_parameter("w13_scale_2", None)
        self.register_buffer("g1_scale_c", torch.zeros(E), persistent=False)
        self.cfg = None

    def _install_scale(self, s2):
        self.w13_scale_2 = torch.nn.Parameter(s2, requires_grad=False)  # replace_parameter: new object

    def process_weights_after_loading(self):
        s2 = self.w13.abs().amax(dim=(1, 2)) / 2688.0
        self._install_scale(s2)
        if self.cfg is None:  # #50074: kernel and config built once
            self.cfg = types.SimpleNamespace(g1_alphas=self.w13_scale_2)
        self.g1_scale_c.copy_(self.cfg.g1_alphas * self.a2_scale)

    def forward(self, x):
        h = torch.einsum("th,eoh->teo", x, self.w13) * self.g1_scale_c.view(1, E, 1)
        gate, up = h.split(IM, dim=2)
        return torch.einsum("tei,ehi->th", F.silu(gate) * up, self.w2)


class OnlineNvfp4MoeFixed(OnlineNvfp4MoeBuggy):
    def _install_scale(self, s2):
        if self.w13_scale_2 is None:
            super()._install_scale(s2)
        else:
            self.w13_scale_2.copy_(s2)  # same object: the config's reference stays valid


# Z27 -- SGLang #11289: gpt-oss mxfp4 on triton_kernels: post-processing
# swizzles the expert weights into tensors held by the quant method object and
# releases the registered weight; a reload swizzles into new storage.


def _swizzle(w):
    e, o, h = w.shape
    return w.view(e, o // 4, 4, h).transpose(1, 2).contiguous()


def _unswizzle(t):
    e, four, q, h = t.shape
    return t.transpose(1, 2).reshape(e, q * four, h)


class TritonMxfp4MoeBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13_weight = param(E, 2 * IM, H)
        self.w2_weight = param(E, H, IM)
        self.quant_method = types.SimpleNamespace()

    def process_weights_after_loading(self):
        qm = self.quant_method
        qm.w13_weight_triton_tensor = _swizzle(self.w13_weight)
        qm.w2_weight_triton_tensor = _swizzle(self.w2_weight)
        # The registered weights are released; the next load re-makes them.
        self.w13_weight.data = torch.empty(0, device=self.w13_weight.device)
        self.w2_weight.data = torch.empty(0, device=self.w2_weight.device)

    def forward(self, x):
        qm = self.quant_method
        return _swiglu_experts(x, _unswizzle(qm.w13_weight_triton_tensor), _unswizzle(qm.w2_weight_triton_tensor))


class TritonMxfp4MoeFixed(TritonMxfp4MoeBuggy):
    def process_weights_after_loading(self):
        qm = self.quant_method
        bind_or_assign(qm, "w13_weight_triton_tensor", _swizzle(self.w13_weight))
        bind_or_assign(qm, "w2_weight_triton_tensor", _swizzle(self.w2_weight))


BUGS = [
    Bug("Z01", "vLLM", "vllm-project/vllm#41670", "F", "CUTLASS FP8 MoE strides owned by a rebuilt kernel",
        ("ab_strides1", "c_strides1", "w1_scale"), CutlassMoeBuggy, CutlassMoeFixed, (6, H)),
    Bug("Z02", "vLLM", "vllm-project/vllm#48438", "F (+A)", "Marlin workspace on the kernel object, sort indices rebound",
        ("g_idx_sort_indices", "workspace"), MarlinActOrderBuggy, MarlinActOrderFixed, (6, K),
        values_must_change=True),
    Bug("Z05", "vLLM", "vllm-project/vllm#48539", "F", "Machete act-order permutation in a functools.partial",
        ("act_perm",), MacheteActOrderBuggy, MacheteActOrderFixed, (6, K),
        values_must_change=True),
    Bug("Z06", "vLLM", "vllm-project/vllm#50521", "F", "FlashInfer CUTLASS MoE constants in a rebuilt experts object",
        ("gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit"), FlashInferMoeConstantsBuggy, FlashInferMoeConstantsFixed,
        (6, H)),
    Bug("Z07", "vLLM", "vllm-project/vllm#50538", "F (+E, H)", "B12x MoE runtime scales and a lazily built wrapper",
        ("_fc2_input_scale", "w1_sf_mma", "routing_meta"), B12xMoeBuggy, B12xMoeFixed, (6, H)),
    Bug("Z13", "vLLM", "vllm-project/vllm#57954", "F", "kept NVFP4 config references the previous alpha storage",
        ("w13_scale_2",), OnlineNvfp4MoeBuggy, OnlineNvfp4MoeFixed, (6, H),
        values_must_change=True),
    Bug("Z27", "SGLang", "sgl-project/sglang#11289", "F (+B)", "triton_kernels MoE weights held by the quant method",
        ("w13_weight_triton_tensor", "w2_weight_triton_tensor"), TritonMxfp4MoeBuggy, TritonMxfp4MoeFixed, (6, H),
        values_must_change=True),
]
