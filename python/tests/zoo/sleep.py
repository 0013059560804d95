"""Classes O2 and O4 (and E under sleep): what an engine's sleep mode loses.
Sleep level 2 (vLLM; SGLang's memory-saver pause) discards the contents of
every storage while keeping its address; wake restores the parameters from
the checkpoint (the reload) and the registered buffers from a host copy.
A tensor the forward or post-processing reads that is neither (a plain
attribute, a kernel object's state, a module-global cache) comes back as
garbage. Without a sleep step in the check every one of these layers
passes: each row needs ``sleep=2`` (and Z20, Z29 the module-level caches)."""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from . import Bug
from ._layers import param

N, K, E, H = 16, 32, 4, 16


# Z18 -- vLLM #25800 / #28783: FP8 KV-cache scales kept outside the
# registered buffers; level-2 sleep discards them and nothing restores them.


class KvScaleAttrBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k_proj = param(N, K)
        self._k_scale = None

    def process_weights_after_loading(self):
        if self._k_scale is None:  # the synthesized default when the checkpoint has none
            self._k_scale = torch.ones(1, device=self.k_proj.device)

    def forward(self, x):
        return F.linear(x, self.k_proj) * self._k_scale


class KvScaleAttrFixed(KvScaleAttrBuggy):
    def __init__(self):
        super().__init__()
        del self._k_scale
        self.register_buffer("_k_scale", torch.ones(1))  # inside the saved-and-restored set


# Z19 -- vLLM #49774: the draft model's non-persistent buffers were not in the
# sleep snapshot (only the target model's were).


def _rope_cache(n, device):
    pos = torch.arange(n, device=device, dtype=torch.float32)
    return torch.cat([pos.cos(), pos.sin()])


class _Drafter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.zeros(2 * K), persistent=False)


class DraftBuffersBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = param(N, K)
        self._drafter = [_Drafter()]  # the drafter sits beside the model, not in it
        self._rope_ready = False

    def process_weights_after_loading(self):
        if not self._rope_ready:  # computed once, at the first load
            d = self._drafter[0]
            d.to(self.proj.device)
            d.cos_sin_cache.copy_(_rope_cache(K, self.proj.device))
            self._rope_ready = True

    def _cache(self):
        return self._drafter[0].cos_sin_cache

    def forward(self, x):
        return F.linear(x * self._cache()[:K], self.proj)


class DraftBuffersFixed(DraftBuffersBuggy):
    def __init__(self):
        super().__init__()
        self.drafter = self._drafter.pop()  # registered: its buffers are snapshotted too

    def process_weights_after_loading(self):
        if not self._rope_ready:
            self.drafter.cos_sin_cache.copy_(_rope_cache(K, self.proj.device))
            self._rope_ready = True

    def _cache(self):
        return self.drafter.cos_sin_cache


# Z24 -- vllm-ascend #13352: a dispatcher (a plain object) owns the
# expert-id map, made once behind an `is None` guard; level-2 wake restores
# only the module's buffers.


class _Dispatcher:
    def __init__(self):
        self.expert_ids_per_ep_rank = None


class DispatcherIdsBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = param(E, N, K)
        self.dispatcher = _Dispatcher()

    def _ids(self):
        return self.dispatcher.expert_ids_per_ep_rank

    def process_weights_after_loading(self):
        if self.dispatcher.expert_ids_per_ep_rank is None:
            self.dispatcher.expert_ids_per_ep_rank = torch.arange(E - 1, -1, -1, device=self.experts.device)

    def forward(self, x):
        w = self.experts.index_select(0, self._ids())
        return torch.einsum("tk,enk->tn", x, w)


class DispatcherIdsFixed(DispatcherIdsBuggy):
    def __init__(self):
        super().__init__()
        self.register_buffer("expert_ids_per_ep_rank", torch.arange(E - 1, -1, -1), persistent=False)

    def process_weights_after_loading(self):
        pass

    def _ids(self):
        return self.expert_ids_per_ep_rank


# Z30 -- SGLang #32718: a kernel's tile schedule written by the first forward
# (at capture) and only read by later ones; pausing the graph pool discards
# it.


class _TileKernel:
    def __init__(self):
        self.meta = None


class CaptureStateBuggy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(N, K)
        self.kernel = _TileKernel()

    def _meta(self, device):
        if self.kernel.meta is None:
            self.kernel.meta = torch.arange(E + 1, device=device)
        return self.kernel.meta

    def forward(self, x):
        tiles = self._meta(x.device)
        return F.linear(x, self.weight) + tiles[-1].to(x.dtype)


class CaptureStateFixed(CaptureStateBuggy):
    def __init__(self):
        super().__init__()
        self.register_buffer("tile_meta", torch.arange(E + 1), persistent=False)

    def _meta(self, device):
        return self.tile_meta


# Z20 -- vLLM #49695 and Z29 -- SGLang #28676: a module-global cache of
# permutation indices, keyed by shape, read by post-processing. It survives
# sleep with garbage contents and the next reload's shuffle uses it.

_cache_permute_indices: dict[tuple, torch.Tensor] = {}
_flashinfer_trtllm_shuffle_row_indices_cache_mxfp8: dict[tuple, torch.Tensor] = {}


def _row_perm(n, device):
    return torch.arange(n, device=device).view(2, n // 2).t().reshape(n)  # interleave the halves


class GlobalPermCacheBuggy(torch.nn.Module):
    cache = _cache_permute_indices

    def __init__(self):
        super().__init__()
        self.w13 = param(E, 2 * N, H)
        self.register_buffer("w13_shuffled", torch.zeros(E, 2 * N, H), persistent=False)

    def _perm(self):
        key = (type(self).__name__, 2 * N, str(self.w13.device))
        if key not in self.cache:
            self.cache[key] = _row_perm(2 * N, self.w13.device)
        return self.cache[key]

    def process_weights_after_loading(self):
        self.w13_shuffled.copy_(self.w13.index_select(1, self._perm()))

    def forward(self, x):
        h = torch.einsum("th,eoh->teo", x, self.w13_shuffled)
        return (F.silu(h[..., 0::2]) * h[..., 1::2]).sum(dim=1)


class GlobalPermCacheFixed(GlobalPermCacheBuggy):
    def __init__(self):
        super().__init__()
        self.register_buffer("permute_indices", torch.zeros(2 * N, dtype=torch.int64), persistent=False)
        self._have_perm = False

    def _perm(self):
        if not self._have_perm:  # kept in a registered buffer, restored on wake
            self.permute_indices.copy_(_row_perm(2 * N, self.w13.device))
            self._have_perm = True
        return self.permute_indices


class ShuffleRowCacheBuggy(GlobalPermCacheBuggy):
    cache = _flashinfer_trtllm_shuffle_row_indices_cache_mxfp8


class ShuffleRowCacheFixed(ShuffleRowCacheBuggy):
    def process_weights_after_loading(self):
        self.cache.clear()  # clear_mxfp8_shuffle_index_cache() from the weight-load funnel
        super().process_weights_after_loading()


# Z38 -- torch_memory_saver #71: with CPU backup on, every pause/resume cycle
# made new host copies of the weights and kept the earlier cycles' too; the
# pinned host memory grew from cycle to cycle (in the thread until the leaked
# pages overlapped the weights). The bug is in the engine's sleep helper,
# not in a layer: the pair is the helper, run as check_reload's own sleep
# (``sleep=helper``) on the same plain layer.


class BackedUpLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = param(N, K)

    def forward(self, x):
        return F.linear(x, self.weight)


class CpuBackupSleep:
    """Pause with a host copy of every parameter, then resume from it.
    ``keep_old``: the copies of every cycle stay in a list nothing clears
    (the leak); otherwise one copy per parameter is refilled each cycle."""

    def __init__(self, keep_old: bool) -> None:
        self.keep_old = keep_old
        self._copies: weakref.WeakKeyDictionary[torch.nn.Module, list[list[torch.Tensor]]] = (
            weakref.WeakKeyDictionary())

    def __call__(self, layer: torch.nn.Module) -> None:
        params = [p.detach() for p in layer.parameters()]
        cycles = self._copies.setdefault(layer, [])
        if self.keep_old or not cycles:
            cycles.append([p.to("cpu", copy=True) for p in params])
        else:
            for host, p in zip(cycles[-1], params, strict=True):
                host.copy_(p)
        for p in params:
            p.fill_(float("nan"))  # paused: the device pages are released
        for host, p in zip(cycles[-1], params, strict=True):
            p.copy_(host)  # resumed from the newest copy


_SLEEP = "needs sleep and wake (level 2) between reloads"

BUGS = [
    Bug("Z18", "vLLM", "vllm-project/vllm#25800", "O2", "FP8 KV-cache scales lost by level-2 sleep",
        ("_k_scale",), KvScaleAttrBuggy, KvScaleAttrFixed, (6, K), needs={"sleep": 2, "compare_state": True},
        gap=f"{_SLEEP}: `_k_scale` is a plain attribute, outside what wake restores"),
    Bug("Z19", "vLLM", "vllm-project/vllm#49774", "O2", "draft-model buffers not saved across level-2 sleep",
        ("cos_sin_cache",), DraftBuffersBuggy, DraftBuffersFixed, (6, K), needs={"sleep": 2, "compare_state": True},
        gap=f"{_SLEEP}: the drafter's buffers are not the model's"),
    Bug("Z20", "vLLM", "vllm-project/vllm#49695", "O4 (+F)", "global permute-index cache after sleep",
        ("_cache_permute_indices",), GlobalPermCacheBuggy, GlobalPermCacheFixed, (6, H),
        needs={"sleep": 2, "compare_state": True, "module_caches": {"_cache_permute_indices": _cache_permute_indices}},
        gap=f"{_SLEEP}, and the module-global cache named as one the check walks (post-processing reads it, "
            "the forward does not)"),
    Bug("Z24", "vLLM-Ascend", "vllm-project/vllm-ascend#13352", "O2", "dispatcher-owned expert ids lost on wake",
        ("expert_ids_per_ep_rank",), DispatcherIdsBuggy, DispatcherIdsFixed, (6, K), needs={"sleep": 2, "compare_state": True},
        gap=f"{_SLEEP}: the ids live on a plain object"),
    Bug("Z29", "SGLang", "sgl-project/sglang#28676", "O4", "module-global shuffle-index cache after pause/resume",
        ("_flashinfer_trtllm_shuffle_row_indices_cache_mxfp8",), ShuffleRowCacheBuggy, ShuffleRowCacheFixed, (6, H),
        needs={"sleep": 2, "compare_state": True, "module_caches": {
            "_flashinfer_trtllm_shuffle_row_indices_cache_mxfp8": _flashinfer_trtllm_shuffle_row_indices_cache_mxfp8}},
        gap=f"{_SLEEP}, and the module-global cache named as one the check walks"),
    Bug("Z38", "torch_memory_saver", "fzyzcjy/torch_memory_saver#71", "G",
        "host backups kept per pause/resume cycle", ("memory",), BackedUpLinear, BackedUpLinear, (6, K),
        needs={"sleep": CpuBackupSleep(keep_old=True)}, fixed_options={"sleep": CpuBackupSleep(keep_old=False)},
        cuda_gap="the copies are host memory, which a check on CUDA does not count (it counts device bytes)"),
    Bug("Z30", "SGLang", "sgl-project/sglang#32718", "E", "capture-time kernel state discarded by pause",
        ("meta",), CaptureStateBuggy, CaptureStateFixed, (6, K),
        needs={"sleep": 2, "compare_forward_state": True},
        gap="with sleep=2 the value checks fail, but the tile schedule is state the first forward makes: only "
            "the state after a forward, compared with a cold load's after one forward, names it"),
]
