"""Classes O1 and O5: post-processing that is not idempotent (it transforms
what the previous pass left, guards itself with a flag, deletes its sources,
or turns a weight into a layout the loader cannot write), and
post-processing that re-registers a weight as a new parameter, dropping
what the loader needs. The fixes start from the checkpoint value every time
and keep the parameter object."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Bug
from ._layers import checkpoints, load_shards, param

E, IM, H = 2, 8, 16
N, K = 16, 32


# Z14 -- vLLM #42821: w13 is swapped to [w3; w1] once, guarded by a flag; a
# second load writes the checkpoint's [w1; w3] into the swapped buffer and
# the guard skips the swap.


def _shard_loader(p, loaded, shard):
    rows = slice(0, IM) if shard == "w1" else slice(IM, 2 * IM)
    p.data[:, rows].copy_(loaded)


class SwapW13Buggy(torch.nn.Module):
    shard_map = {"gate_proj": ("w13", "w1"), "up_proj": ("w13", "w3")}

    def __init__(self):
        super().__init__()
        self.w13 = param(E, 2 * IM, H)
        self.w13.weight_loader = _shard_loader
        self.w2 = param(E, H, IM)
        self._converted = False

    def process_weights_after_loading(self):
        if not self._converted:  # swap_w13_to_w31, once
            self.w13.copy_(torch.cat([self.w13[:, IM:], self.w13[:, :IM]], dim=1))
            self._converted = True

    def forward(self, x):
        h = torch.einsum("th,eoh->teo", x, self.w13)
        up, gate = h.split(IM, dim=2)  # kernel layout: [w3; w1]
        return torch.einsum("tei,ehi->th", F.silu(gate) * up, self.w2)


class SwapW13Fixed(SwapW13Buggy):
    def process_weights_after_loading(self):
        # The loader always writes the checkpoint layout: convert every time.
        self.w13.copy_(torch.cat([self.w13[:, IM:], self.w13[:, :IM]], dim=1))


_Z14_CKPT = checkpoints({
    "gate_proj": ((E, IM, H), torch.float32),
    "up_proj": ((E, IM, H), torch.float32),
    "w2": ((E, H, IM), torch.float32),
})


# Z17 -- vLLM #17915: Llama 4 MoE post-processing installs new Parameter
# objects, without the weight_loader the next refit needs.


def _fused_loader(p, loaded, shard=None):
    p.data.copy_(loaded)


class MoeParamsReplacedBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13 = param(E, 2 * IM, H)
        self.w13.weight_loader = _fused_loader  # set_weight_attrs
        self.w2 = param(E, H, IM)

    def _install(self, value):
        self.w13 = torch.nn.Parameter(value, requires_grad=False)  # a new object, no weight_loader

    def process_weights_after_loading(self):
        self._install(self.w13.data * 0.5)

    def forward(self, x):
        h = torch.einsum("th,eoh->teo", x, self.w13)
        gate, up = h.split(IM, dim=2)
        return torch.einsum("tei,ehi->th", F.silu(gate) * up, self.w2)


class MoeParamsReplacedFixed(MoeParamsReplacedBuggy):
    def _install(self, value):
        self.w13.data.copy_(value)


# Z26 -- SGLang #8863: FP8 post-processing re-registers the fused weight as a
# plain Parameter, dropping the ModelWeightParameter's weight_loader.


def _requant(w):
    s = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-6) / 127.0
    return (w / s).round() * s


class Fp8LinearReplacedBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(3 * N, K)
        self.weight.weight_loader = _fused_loader

    def process_weights_after_loading(self):
        self.weight = torch.nn.Parameter(_requant(self.weight), requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.weight)


class Fp8LinearReplacedFixed(Fp8LinearReplacedBuggy):
    def process_weights_after_loading(self):
        self.weight.data.copy_(_requant(self.weight))


# Z28 -- SGLang #25190: NVFP4 post-processing derives alpha and the
# interleaved scale, shuffles the weight in place, deletes its source scales
# and marks itself done.

ROW_PERM = torch.arange(N - 1, -1, -1)


def _interleave(s):
    return s.view(N // 2, 2).t().reshape(N)


class Nvfp4DeletesSourcesBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(N, K)
        self.weight_scale = param(N)
        self.weight_scale_2 = param(1)
        self.input_scale = param(1)
        self.register_buffer("alpha", torch.zeros(1), persistent=False)
        self.register_buffer("weight_scale_interleaved", torch.zeros(N), persistent=False)
        # The row permutation travels with the layer: a forward that copied a
        # host tensor to the device would stop a CUDA graph capture.
        self.register_buffer("row_perm", ROW_PERM.clone(), persistent=False)
        self._done = False

    def _derive(self):
        self.alpha.copy_(self.input_scale * self.weight_scale_2)
        self.weight_scale_interleaved.copy_(_interleave(self.weight_scale))
        self.weight.copy_(self.weight.index_select(0, self.row_perm))

    def process_weights_after_loading(self):
        if self._done:
            return
        self._derive()
        del self.weight_scale, self.weight_scale_2, self.input_scale  # saves memory
        self._done = True

    def forward(self, x):
        scale = _interleave(self.weight_scale_interleaved).index_select(0, self.row_perm)
        return F.linear(x, self.weight) * scale * self.alpha


class Nvfp4DeletesSourcesFixed(Nvfp4DeletesSourcesBuggy):
    def process_weights_after_loading(self):
        self._derive()  # every time, from the freshly loaded sources


# Z31 -- SGLang #40586: the KV scale is transformed in place by every
# post-processing (the FNUZ halving), so it compounds across reloads. The
# checkpoint does not carry it.


class KvScaleCompoundsBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k_proj = param(N, K)
        self.register_buffer("k_scale", torch.ones(1))

    def process_weights_after_loading(self):
        self.k_scale.mul_(0.5)

    def forward(self, x):
        return F.linear(x, self.k_proj) * self.k_scale


class KvScaleCompoundsFixed(KvScaleCompoundsBuggy):
    def __init__(self):
        super().__init__()
        self.register_buffer("_kv_scale_checkpoint", torch.ones(1))

    def process_weights_after_loading(self):
        self.k_scale.copy_(self._kv_scale_checkpoint * 0.5)


# Z32 -- ROCm ATOM #2028: the e4m3fn -> e4m3fnuz normalization is gated by a
# static flag nothing clears, so every sync doubles the scale, into a new
# tensor.


class FnuzScaleDoublesBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(N, K, dtype=torch.int8)
        self.weight_scale: torch.Tensor
        self.register_buffer("weight_scale", torch.full((N, 1), 0.01))
        self.need_normalize_e4m3fn_to_e4m3fnuz = True

    def process_weights_after_loading(self):
        if self.need_normalize_e4m3fn_to_e4m3fnuz:
            self.weight_scale = self.weight_scale * 2.0  # a new tensor under the buffer's name

    def forward(self, x):
        return F.linear(x, self.weight.float() * self.weight_scale)


class FnuzScaleDoublesFixed(FnuzScaleDoublesBuggy):
    def process_weights_after_loading(self):
        if self.need_normalize_e4m3fn_to_e4m3fnuz:
            self.weight_scale.mul_(2.0)  # in place, once
            self.need_normalize_e4m3fn_to_e4m3fnuz = False


# Z36 -- verl #7978: the MoE weights are converted one way to a 4-D block
# layout; the next sync's expert loader indexes a 3-D expert and raises.

BK = 4


def _to_blocks(t):
    e, n, k = t.shape
    return t.view(e, n, k // BK, BK).permute(0, 2, 1, 3).contiguous()


def _from_blocks(t):
    e, kb, n, bk = t.shape
    return t.permute(0, 2, 1, 3).reshape(e, n, kb * bk)


def _expert_loader(p, loaded, shard=None):
    for e in range(loaded.shape[0]):
        expert = p.data[e]
        if expert.dim() != 2:
            raise ValueError(f"shard_dim=0 is not a valid data dimension for a {expert.dim()}D tensor")
        expert.copy_(loaded[e])


class BlockLayoutOneWayBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13 = param(E, 2 * IM, H)
        self.w13.weight_loader = _expert_loader

    def process_weights_after_loading(self):
        self.w13.data = _to_blocks(self.w13.data)

    def _blocks(self):
        return self.w13

    def forward(self, x):
        h = torch.einsum("th,eoh->teo", x, _from_blocks(self._blocks()))
        gate, up = h.split(IM, dim=2)
        return (F.silu(gate) * up).sum(dim=1)


class BlockLayoutOneWayFixed(BlockLayoutOneWayBuggy):
    def process_weights_after_loading(self):
        # The loader-facing parameter keeps the checkpoint layout; the block
        # layout goes into a persistent runtime buffer.
        blocks = _to_blocks(self.w13)
        if getattr(self, "w13_blocks", None) is None:
            self.w13_blocks = blocks
        else:
            self.w13_blocks.copy_(blocks)

    def _blocks(self):
        return self.w13_blocks


BUGS = [
    Bug("Z14", "vLLM", "vllm-project/vllm#42821", "O1", "second load writes checkpoint layout into swapped w13",
        ("w13",), SwapW13Buggy, SwapW13Fixed, (6, H), options={"make_checkpoint": _Z14_CKPT, "load": load_shards},
        needs={"compare_state": True},
        gap="no address moves: the value check fails but names the forward, not `w13` (needs: each reachable "
            "tensor compared with a cold load's, by name)"),
    Bug("Z17", "vLLM", "vllm-project/vllm#17915", "O5", "MoE parameters lose weight_loader after the first load",
        ("w13",), MoeParamsReplacedBuggy, MoeParamsReplacedFixed, (6, H)),
    Bug("Z26", "SGLang", "sgl-project/sglang#8863", "O5", "FP8 post-processing replaces the loader-carrying parameter",
        ("weight",), Fp8LinearReplacedBuggy, Fp8LinearReplacedFixed, (6, K)),
    Bug("Z28", "SGLang", "sgl-project/sglang#25190", "O1", "NVFP4 post-processing deletes its source scales",
        ("weight_scale", "input_scale", "weight_scale_2"), Nvfp4DeletesSourcesBuggy, Nvfp4DeletesSourcesFixed,
        (6, K), outcome="raises"),
    Bug("Z31", "SGLang", "sgl-project/sglang#40586", "O1", "KV-scale post-processing compounds across reloads",
        ("k_scale",), KvScaleCompoundsBuggy, KvScaleCompoundsFixed, (6, K), needs={"compare_state": True},
        gap="the scale halves in place: the value check fails but names the forward, not `k_scale` (needs: "
            "post-processing that is not idempotent named as such)"),
    Bug("Z32", "ROCm ATOM", "ROCm/ATOM#2028", "O1 (+A)", "FP8 normalization re-applied every sync",
        ("weight_scale",), FnuzScaleDoublesBuggy, FnuzScaleDoublesFixed, (6, K)),
    Bug("Z36", "verl", "verl-project/verl#7978", "O1", "one-way 4-D block layout breaks the next weight sync",
        ("w13",), BlockLayoutOneWayBuggy, BlockLayoutOneWayFixed, (6, H), outcome="raises"),
]
