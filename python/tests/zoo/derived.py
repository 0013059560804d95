"""Class A: a tensor derived from the weights (a dequantized split, a
transposed copy, an FP32 precast) rebound to a new attribute by every
post-processing instead of refilled; and class D: a host number derived
from a weight and baked into the forward. The fixes copy into the tensor
the layer already holds, or read a tensor instead of a number."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import Bug
from ._layers import bind_or_assign, param

NH, P, V, R = 2, 8, 8, 16  # heads, nope dim, value dim, latent rank


def _mla_split(kv_b_proj, kv_b_scale):
    """Dequantizes kv_b_proj [NH*(P+V), R] and splits it per head."""
    w = (kv_b_proj.float() * kv_b_scale.view(-1, 1)).view(NH, P + V, R)
    return w[:, :P, :], w[:, P:, :]  # W_UK [NH, P, R], W_UV [NH, V, R]


def _mla_forward(x, w_uk, w_uv):
    """x [T, NH*P] -> latent [NH, T, R] -> out [T, NH*V]."""
    t = x.shape[0]
    q_nope = x.view(t, NH, P).transpose(0, 1)
    lat = torch.softmax(torch.bmm(q_nope, w_uk), dim=-1)
    out = torch.bmm(lat, w_uv)
    return out.transpose(0, 1).reshape(t, NH * V)


# Z03 -- vLLM #48251 (part 1): MLA W_UV / W_UK_T reassigned as views of a new
# dequantized tensor.


class MlaAbsorbBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kv_b_proj = param(NH * (P + V), R, dtype=torch.int8)
        self.kv_b_scale = param(NH * (P + V))

    def _set(self, name, value):
        setattr(self, name, value)

    def process_weights_after_loading(self):
        w_uk, w_uv = _mla_split(self.kv_b_proj, self.kv_b_scale)
        self._set("W_UK_T", w_uk)  # [NH, P, R], a view of the fresh dequantized tensor
        self._set("W_UV", w_uv.transpose(1, 2))  # [NH, R, V], strided

    def forward(self, x):
        return _mla_forward(x, self.W_UK_T, self.W_UV)


class MlaAbsorbFixed(MlaAbsorbBuggy):
    def _set(self, name, value):
        bind_or_assign(self, name, value)  # replace_parameter(..., prefer_copy=True)


# Z21 -- vllm-ascend #7473: the same tensors made with .contiguous(), new
# storage each post-processing.


class AscendMlaBuggy(MlaAbsorbBuggy):
    def process_weights_after_loading(self):
        w_uk, w_uv = _mla_split(self.kv_b_proj, self.kv_b_scale)
        self._set("W_UK_T", w_uk.contiguous())
        self._set("W_UV", w_uv.transpose(1, 2).contiguous())


class AscendMlaFixed(AscendMlaBuggy):
    def _set(self, name, value):
        if hasattr(self, name):
            getattr(self, name).copy_(value)
        else:
            setattr(self, name, value)


# Z25 -- SGLang #4961 -> #6265: DeepSeek MLA w_kc / w_vc recreated by
# post_load_weights, in SGLang's column-major layouts, on the attention
# submodule.


class _SelfAttn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kv_b_proj = param(NH * (P + V), R)


class SglangMlaBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = _SelfAttn()

    def _assign(self, name, value):
        setattr(self.self_attn, name, value)

    def process_weights_after_loading(self):
        w = self.self_attn.kv_b_proj.view(NH, P + V, R)
        w_kc, w_vc = w[:, :P, :], w[:, P:, :]
        self._assign("w_kc", w_kc.transpose(1, 2).contiguous().transpose(1, 2))  # column-major [NH, P, R]
        self._assign("w_vc", w_vc.contiguous().transpose(1, 2))  # [NH, R, V]

    def forward(self, x):
        return _mla_forward(x, self.self_attn.w_kc, self.self_attn.w_vc)


class SglangMlaFixed(SglangMlaBuggy):
    def _assign(self, name, value):
        bind_or_assign(self.self_attn, name, value)  # bind_or_assign: copy_ into the existing strided view


# Z04 -- vLLM #48251 (part 2): FlashInfer sinks converted to an FP32 copy by
# the backend once; every later conversion is a no-op on the FP32 copy.

HQ, T = 4, 8


def _sink_attention(x, sinks):
    b = x.shape[0]
    scores = x.view(b, HQ, T)
    col = sinks.view(1, HQ, 1).expand(b, HQ, 1)
    probs = torch.softmax(torch.cat([scores, col], dim=2), dim=2)
    return probs[:, :, :T].reshape(b, HQ * T)


class _AttnBackend:
    def __init__(self, sinks):
        self.sinks = sinks


class SinksBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sinks = param(HQ, dtype=torch.bfloat16)
        self.impl: Any = None

    def process_weights_after_loading(self):
        if self.impl is None:
            self.impl = _AttnBackend(self.sinks)
        # The first call makes an FP32 copy; later calls return it unchanged.
        self.impl.sinks = self.impl.sinks.to(torch.float32)

    def forward(self, x):
        return _sink_attention(x, self.impl.sinks)


class SinksFixed(SinksBuggy):
    def process_weights_after_loading(self):
        if self.impl is None:
            self.impl = _AttnBackend(torch.empty(HQ, dtype=torch.float32, device=self.sinks.device))
        self.impl.sinks.copy_(self.sinks)  # the FP32 runtime copy refreshed from the source every time


# Z23 -- vllm-ascend #15666: DeepSeek V4 FP32 precast weight reassigned.

DI, DO = 32, 16


class Fp32PrecastBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(DO, DI, dtype=torch.bfloat16)

    def process_weights_after_loading(self):
        self.weight_fp32 = self.weight.float()

    def forward(self, x):
        return F.linear(x.float(), self.weight_fp32)


class Fp32PrecastFixed(Fp32PrecastBuggy):
    def process_weights_after_loading(self):
        bind_or_assign(self, "weight_fp32", self.weight.float())


# Z37 -- ModelExpress #782 / #711 / #783: the FP8 KV scale as a host float,
# set at the first load and left stale by the refit; a CUDA graph bakes the
# number into its launch anyway.


class HostKvScaleBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k_proj = param(DO, DI)
        self.k_scale = param(1)
        self._k_scale_float = None

    def process_weights_after_loading(self):
        if self._k_scale_float is None:  # the refit path copies device tensors only
            self._k_scale_float = float(self.k_scale)

    def forward(self, x):
        return F.linear(x, self.k_proj) * self._k_scale_float


class HostKvScaleEagerFix(HostKvScaleBuggy):
    """ModelExpress #711/#783: the host float refreshed after every refit.
    Right in eager mode; a captured graph still holds the old number."""

    def process_weights_after_loading(self):
        self._k_scale_float = float(self.k_scale)


class HostKvScaleFixed(HostKvScaleBuggy):
    """The graph-safe form: the forward reads the scale tensor, an address,
    and no host copy is kept."""

    def process_weights_after_loading(self):
        pass

    def forward(self, x):
        return F.linear(x, self.k_proj) * self.k_scale


BUGS = [
    Bug("Z03", "vLLM", "vllm-project/vllm#48251", "A", "MLA W_UV / W_UK_T reassigned as views of a new tensor",
        ("W_UK_T", "W_UV"), MlaAbsorbBuggy, MlaAbsorbFixed, (6, NH * P),
        values_must_change=True),
    Bug("Z04", "vLLM", "vllm-project/vllm#48251", "A", "FlashInfer sinks converted to an FP32 copy once",
        ("sinks",), SinksBuggy, SinksFixed, (3, HQ * T), values_must_change=True,
        gap="the stale FP32 copy keeps its address; only the value check fails, and it names the forward, "
            "not `impl.sinks` (needs: each reachable tensor compared with a cold load's, by name)",
        needs={"compare_state": True}),
    Bug("Z21", "vLLM-Ascend", "vllm-project/vllm-ascend#7473", "A", "MLA .contiguous() gives W_UV / W_UK_T new storage",
        ("W_UK_T", "W_UV"), AscendMlaBuggy, AscendMlaFixed, (6, NH * P),
        values_must_change=True),
    Bug("Z23", "vLLM-Ascend", "vllm-project/vllm-ascend#15666", "A", "DeepSeek V4 FP32 precast weight reassigned",
        ("weight_fp32",), Fp32PrecastBuggy, Fp32PrecastFixed, (6, DI),
        values_must_change=True),
    Bug("Z25", "SGLang", "sgl-project/sglang#6265", "A", "DeepSeek MLA w_kc / w_vc recreated by post_load_weights",
        ("self_attn.w_kc", "self_attn.w_vc"), SglangMlaBuggy, SglangMlaFixed, (6, NH * P),
        values_must_change=True),
    Bug("Z37", "ModelExpress", "ai-dynamo/modelexpress#782", "D", "FP8 KV scale as a host float, stale after refit",
        ("_k_scale_float",), HostKvScaleBuggy, HostKvScaleFixed, (6, DI), values_must_change=True,
        gap="the stale number is an argument of the forward's op, not a tensor: the value check fails but "
            "names the forward (needs: host numbers the forward reads compared with a cold load's, by attribute)",
        needs={"compare_state": True}),
]
