"""Classes B and C: post-processing repacks a weight (a shuffle, a transpose,
a resmooth) into new storage, or pads it and changes its strides; and
padding that only construction zeroed. The fixes write the new layout into
the storage the weight already has, and zero the padding every time."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import Bug
from ._layers import checkpoints, load_shards, param

N, K = 16, 32


def _copy_loader(p, loaded, shard=None):
    """A weight_loader writing into the parameter's current layout."""
    p.data.copy_(loaded)


# Z11 -- vLLM #46009: ROCm MoE padding by rebinding .data to a view of a new,
# wider storage.

PAD = 16


class RocmPaddedBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(N, K)
        self.weight.weight_loader = _copy_loader

    def process_weights_after_loading(self):
        self.weight.data = F.pad(self.weight.data, (0, PAD))[:, :K]  # row stride K + PAD, new storage

    def forward(self, x):
        return F.linear(x, self.weight)


class RocmPaddedFixed(RocmPaddedBuggy):
    def process_weights_after_loading(self):
        if self.weight.stride(0) != K + PAD:  # the first load: make the padded storage once
            padded = torch.zeros(N, K + PAD, dtype=self.weight.dtype, device=self.weight.device)
            padded[:, :K].copy_(self.weight)
            self.weight.data = padded[:, :K]
        # later loads wrote into the padded view itself: nothing to move


# Z12 -- vLLM #40390: AITER MoE weight shuffle into new tensors.

E, M, HD = 2, 8, 16  # experts, rows, hidden


def _shuffle(t):
    """16-byte style tiles: [E, M, HD] as 4x4 tiles, tile-major."""
    return t.view(E, M // 4, 4, HD // 4, 4).permute(0, 1, 3, 2, 4).contiguous().view(E, M, HD)


def _unshuffle(t):
    return t.view(E, M // 4, HD // 4, 4, 4).permute(0, 1, 3, 2, 4).reshape(E, M, HD)


class AiterShuffleBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13 = param(E, M, HD)

    def process_weights_after_loading(self):
        self.w13.data = _shuffle(self.w13.data)

    def forward(self, x):
        return torch.einsum("th,emh->tem", x, _unshuffle(self.w13)).flatten(1)


class AiterShuffleFixed(AiterShuffleBuggy):
    def process_weights_after_loading(self):
        self.w13.data.copy_(_shuffle(self.w13.data))  # the shuffle reads a temporary


# Z22 -- vllm-ascend #13902: W8A8 MXFP8 weight and scale transposed into new
# storage by every post-processing.

BLOCK = 8


def _dequant_t(w_t, s_t):
    return w_t.float() * s_t.repeat_interleave(BLOCK, 0)


class Mxfp8TransposeBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(N, K, dtype=torch.int8)
        self.weight_scale = param(N, K // BLOCK)

    def process_weights_after_loading(self):
        self.weight.data = self.weight.data.t().contiguous()
        self.weight_scale.data = self.weight_scale.data.t().contiguous()

    def forward(self, x):
        return torch.mm(x, _dequant_t(self.weight, self.weight_scale))


class Mxfp8TransposeFixed(Mxfp8TransposeBuggy):
    def __init__(self):
        super().__init__()
        self._mxfp8_weight_buf: Any = None
        self._mxfp8_scale_buf: Any = None

    def process_weights_after_loading(self):
        if self._mxfp8_weight_buf is None:
            self._mxfp8_weight_buf = torch.empty(K, N, dtype=torch.int8, device=self.weight.device)
            self._mxfp8_scale_buf = torch.empty(K // BLOCK, N, device=self.weight.device)
        self._mxfp8_weight_buf.copy_(self.weight.t())
        self._mxfp8_scale_buf.copy_(self.weight_scale.t())

    def forward(self, x):
        return torch.mm(x, _dequant_t(self._mxfp8_weight_buf, self._mxfp8_scale_buf))


# Z33 -- TensorRT-LLM #11267: the load path installs the resmoothed weight as
# a new parameter on every update, instead of writing into the captured one.


def _resmooth(w):
    """Per-row scale rounded to a power of two, the weight rescaled."""
    s = torch.exp2(torch.ceil(torch.log2(w.abs().amax(dim=1, keepdim=True).clamp_min(1e-6))))
    return (w / s).clamp(-1, 1) * s


def _load_resmoothed(layer, ckpt):
    layer.load_weights(ckpt["weight"])


class ResmoothBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(N, K)

    def load_weights(self, w):
        self.weight = torch.nn.Parameter(_resmooth(w.to(self.weight.device)), requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.weight)


class ResmoothFixed(ResmoothBuggy):
    def load_weights(self, w):
        meta = getattr(self, "_meta", None)
        if meta is None:
            super().load_weights(w)
            self._meta = {"param": self.weight}  # saved (and pinned) for later updates
        else:
            meta["param"].copy_(_resmooth(w.to(self.weight.device)))


# Z09 -- vLLM #50523: padded weights re-created with uninitialised memory by
# layerwise reload; the loader writes only the checkpoint's slice, so the pad
# keeps whatever the memory held. A plain reload into the existing tensors
# never shows it: the pad keeps construction's zeros.

NR, KR = 30, 45  # real dims; padded to 32 x 48
NP_, KP = 32, 48


def _slice_loader(p, loaded, shard=None):
    p.data[: loaded.shape[0], : loaded.shape[1]].copy_(loaded)


class PaddedRematerializeBuggy(torch.nn.Module):
    shard_map = {"experts.w13": ("w13_weight", "all"), "experts.w2": ("w2_weight", "all")}

    def __init__(self):
        super().__init__()
        self.w13_weight = param(NP_, KP)  # zero-initialised at construction only
        self.w2_weight = param(KP, NP_)
        self.w13_weight.weight_loader = _slice_loader
        self.w2_weight.weight_loader = _slice_loader

    def process_weights_after_loading(self):
        pass

    def forward(self, x):
        x_pad = F.pad(x, (0, KP - KR))
        h = F.silu(F.linear(x_pad, self.w13_weight))
        return F.linear(h, self.w2_weight)[:, :KR]


class PaddedRematerializeFixed(PaddedRematerializeBuggy):
    def process_weights_after_loading(self):
        # Zero the padding on every load (the fix zero-fills at materialisation).
        self.w13_weight[NR:].zero_()
        self.w13_weight[:, KR:].zero_()
        self.w2_weight[KR:].zero_()
        self.w2_weight[:, NR:].zero_()


_Z09_CKPT = checkpoints({"experts.w13": ((NR, KR), torch.float32), "experts.w2": ((KR, NR), torch.float32)})


# Z10 -- vLLM #54699: an in-place conversion over the whole padded w13 and
# w2; the padding is zeroed only when the parameter is created, so from the
# first reload on the pad holds what the previous conversion left there.

EX, IR, IP, HX = 2, 6, 8, 16  # experts, real intermediate, padded, hidden


def _gate_up_loader(p, loaded, shard):
    off = 0 if shard == "w1" else IP
    p.data[:, off : off + IR].copy_(loaded)


def _down_loader(p, loaded, shard=None):
    p.data[:, :, :IR].copy_(loaded)


class InPlaceConvertBuggy(torch.nn.Module):
    shard_map = {"gate_proj": ("w13", "w1"), "up_proj": ("w13", "w3"), "down_proj": ("w2", "all")}

    def __init__(self):
        super().__init__()
        self.w13 = param(EX, 2 * IP, HX)
        self.w2 = param(EX, HX, IP)
        self.w13.weight_loader = _gate_up_loader
        self.w2.weight_loader = _down_loader

    def _clear_padding(self):
        pass

    def process_weights_after_loading(self):
        self._clear_padding()
        # The kernel layout: each half, and w2's columns, reversed (real rows last).
        self.w13.copy_(torch.cat([self.w13[:, :IP].flip(1), self.w13[:, IP:].flip(1)], dim=1))
        self.w2.copy_(self.w2.flip(2))

    def forward(self, x):
        h = torch.einsum("th,eoh->teo", x, self.w13)
        gate, up = h.split(IP, dim=2)
        return torch.einsum("tei,ehi->th", F.silu(gate) * up, self.w2)


class InPlaceConvertFixed(InPlaceConvertBuggy):
    def _clear_padding(self):
        self.w13[:, IR:IP].zero_()
        self.w13[:, IP + IR :].zero_()
        self.w2[:, :, IR:].zero_()


_Z10_CKPT = checkpoints({
    "gate_proj": ((EX, IR, HX), torch.float32),
    "up_proj": ((EX, IR, HX), torch.float32),
    "down_proj": ((EX, HX, IR), torch.float32),
})


BUGS = [
    Bug("Z09", "vLLM", "vllm-project/vllm#50523", "C", "re-created padded weights carry garbage in the pad",
        ("w13_weight",), PaddedRematerializeBuggy, PaddedRematerializeFixed, (6, KR),
        options={"make_checkpoint": _Z09_CKPT, "load": load_shards},
        needs={"recreate_parameters": True, "compare_state": True},
        gap="a reload writes into the existing tensors, whose pads keep construction's zeros (needs: parameters "
            "re-created filled with a sentinel before each reload, as layerwise reload does)"),
    Bug("Z10", "vLLM", "vllm-project/vllm#54699", "C", "padding zeroed only at creation, in-place conversion",
        ("w13", "w2"), InPlaceConvertBuggy, InPlaceConvertFixed, (6, HX),
        options={"make_checkpoint": _Z10_CKPT, "load": load_shards}, needs={"compare_state": True},
        gap="no address moves: the value check fails but names the forward, not the padded `w13` and `w2` "
            "(needs: each reachable tensor compared with a cold load's, by name)"),
    Bug("Z11", "vLLM", "vllm-project/vllm#46009", "C", "ROCm MoE padding by rebinding .data",
        ("weight",), RocmPaddedBuggy, RocmPaddedFixed, (6, K),
        values_must_change=True),
    Bug("Z12", "vLLM", "vllm-project/vllm#40390", "B", "AITER MoE shuffle into new tensors",
        ("w13",), AiterShuffleBuggy, AiterShuffleFixed, (6, HD)),
    Bug("Z22", "vLLM-Ascend", "vllm-project/vllm-ascend#13902", "B", "MXFP8 weight and scale transposed into new storage",
        ("weight", "weight_scale"), Mxfp8TransposeBuggy, Mxfp8TransposeFixed, (6, K)),
    Bug("Z33", "TensorRT-LLM", "NVIDIA/TensorRT-LLM#11267", "B", "updates installed as a new resmoothed parameter",
        ("weight",), ResmoothBuggy, ResmoothFixed, (6, K), options={"load": _load_resmoothed},
        values_must_change=True),
]
