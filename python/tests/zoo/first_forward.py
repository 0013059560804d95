"""Class E: state the first forward makes (a scratch, a lazily built cache)
that a reload drops, so the next forward makes it again at a new address
(and with extra ops); and class G: a reload that keeps allocating. The
fixes keep the state on the layer across reloads and refill it."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import Bug
from ._layers import param

E, H, TOPK = 4, 16, 2


# Z08 -- vLLM #48902: the MoE permute scratch lives on a kernel object that
# every post-processing rebuilds; the first forward after makes it again.


class _PermuteKernel:
    def __init__(self):
        self._permute_scratch = None


def _routed(layer, x, scratch_owner):
    t = x.shape[0]
    ids = torch.topk(F.linear(x, layer.router), TOPK, dim=1).indices  # [T, TOPK]
    if scratch_owner._permute_scratch is None:
        scratch_owner._permute_scratch = {
            "sorted_ids": torch.empty(t * TOPK, dtype=torch.int64, device=x.device),
            "sorted_row_idx": torch.empty(t * TOPK, dtype=torch.int64, device=x.device),
        }
    s = scratch_owner._permute_scratch
    torch.sort(ids.flatten(), stable=True, out=(s["sorted_ids"], s["sorted_row_idx"]))
    tokens = x.index_select(0, s["sorted_row_idx"] // TOPK)
    w = layer.experts.index_select(0, s["sorted_ids"])  # [T*TOPK, H, H]
    y = torch.bmm(w, tokens.unsqueeze(2)).squeeze(2)
    out = torch.zeros_like(x)
    out.index_add_(0, s["sorted_row_idx"] // TOPK, y)
    return out


class PermuteScratchBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = param(E, H)
        self.experts = param(E, H, H)

    def process_weights_after_loading(self):
        self.kernel = _PermuteKernel()  # make_*_moe_kernel() on every post-processing

    def forward(self, x):
        return _routed(self, x, self.kernel)


class PermuteScratchFixed(PermuteScratchBuggy):
    def __init__(self):
        super().__init__()
        self.kernel: Any = None
        self._permute_scratch = None  # layer-owned: outlives the kernel

    def process_weights_after_loading(self):
        if self.kernel is None:
            self.kernel = _PermuteKernel()

    def forward(self, x):
        return _routed(self, x, self)


# Z35 -- verl #7455: a BF16 copy of the FP8 wo_a, built lazily by the forward;
# the refit drops it, the next forward rebuilds it into new storage.

DI, DO = 32, 16


class LazyBf16CacheBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wo_a = param(DO, DI, dtype=torch.int8)
        self.wo_a_scale = param(DO, 1)
        self._dsv4_wo_a_bf16 = None

    def process_weights_after_loading(self):
        self._dsv4_wo_a_bf16 = None  # the refit deletes the cache

    def forward(self, x):
        if self._dsv4_wo_a_bf16 is None:
            self._dsv4_wo_a_bf16 = (self.wo_a.float() * self.wo_a_scale).to(torch.bfloat16)
        return F.linear(x, self._dsv4_wo_a_bf16.float())


class LazyBf16CacheFixed(LazyBf16CacheBuggy):
    def process_weights_after_loading(self):
        fresh = (self.wo_a.float() * self.wo_a_scale).to(torch.bfloat16)  # after the live weights are in
        if self._dsv4_wo_a_bf16 is None:
            self._dsv4_wo_a_bf16 = fresh
        else:
            self._dsv4_wo_a_bf16.copy_(fresh)  # into the original tensor


# Z34 -- TensorRT-LLM #14330: every reload registers a fresh staging parameter
# (torch.empty_like of the saved metadata) as the module weight, next to the
# runtime tensor the forward reads.


def _transform(w):
    return (w * 2.0).t().contiguous()


class StagingBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(DO, DI)
        self._meta: Any = None

    def pre_reload(self):
        self.weight = torch.nn.Parameter(torch.empty_like(self.weight), requires_grad=False)

    def process_weights_after_loading(self):
        if self._meta is None:
            self._meta = {"param": _transform(self.weight)}
        else:
            self._meta["param"].copy_(_transform(self.weight))

    def forward(self, x):
        return torch.mm(x, self._meta["param"])


class StagingFixed(StagingBuggy):
    def pre_reload(self):
        buf = self._meta.setdefault("reload_buf", self.weight)  # allocated once, reused
        self.weight = buf


def _load_with_staging(layer, ckpt):
    if layer._meta is not None:  # a reload, not the first load
        layer.pre_reload()
    layer.weight.copy_(ckpt["weight"])


BUGS = [
    Bug("Z08", "vLLM", "vllm-project/vllm#48902", "E (+F)", "MoE permute scratch re-made after the kernel is rebuilt",
        ("_permute_scratch",), PermuteScratchBuggy, PermuteScratchFixed, (6, H)),
    Bug("Z34", "TensorRT-LLM", "NVIDIA/TensorRT-LLM#14330", "G", "a fresh staging parameter every reload",
        ("weight",), StagingBuggy, StagingFixed, (6, DI), options={"load": _load_with_staging}),
    Bug("Z35", "verl", "verl-project/verl#7455", "E (+H)", "lazily rebuilt BF16 cache of wo_a",
        ("_dsv4_wo_a_bf16",), LazyBf16CacheBuggy, LazyBf16CacheFixed, (6, DI),
        values_must_change=True),
]
