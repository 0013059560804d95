"""Class O3: bugs in the reload machinery itself (vLLM's layerwise reload),
not in a layer. Here the machinery is the load function handed to
``check_reload``: on a reload (not the first load) it does what layerwise
reload's copy-back did, and the fixed one what the fix made it do.

reloadsafe's utilities have no layerwise copy-back of buffers (they refill,
replace and move single tensors), so here these two are layer pairs with the
machinery as their load function; what the utilities themselves do in the
same situations is pinned by golden cases L26-L29 (golden/FORMAT.md)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import reloadsafe

from . import Bug
from ._layers import param

H, NE = 16, 4


# Z15 -- vLLM #44371: the copy-back wrote every buffer, loaded or not, from a
# re-created module: Gemma 4's router root_size (a non-persistent buffer set
# from the config after construction) came back as the constructor's 1.0.


class Router(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = param(NE, H)
        self.register_buffer("root_size", torch.tensor(1.0), persistent=False)

    def forward(self, x):
        return F.linear(x * self.root_size, self.proj)


def gemma_router():
    r = Router()
    r.root_size.fill_(H**-0.5)  # from the model config, after construction
    return r


def _layerwise_load(copy_back_all: bool):
    def load(layer, ckpt):
        if getattr(layer, "_loaded_once", False):  # a reload goes through layerwise reload
            fresh = type(layer)().to(layer.proj.device)  # re-created from the constructor
            for name, buf in layer.named_buffers():
                if copy_back_all or name in ckpt:
                    buf.copy_(fresh.get_buffer(name))
        reloadsafe.load_checkpoint(layer, ckpt)
        layer._loaded_once = True

    return load


# Z16 -- vLLM #42481: a buffer aliasing a child parameter (Mamba2's
# conv_weights, a view of conv1d.weight) was snapshotted as an independent
# buffer and copied back over the freshly loaded weight.

C, KW = 8, 4


class MambaConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1d = torch.nn.Conv1d(C, C, KW, groups=C, bias=False)
        self.conv1d.weight.requires_grad_(False)
        self.register_buffer("conv_weights", self.conv1d.weight.view(C, KW), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        # Moving the module moves the buffer on its own: point it at the
        # moved weight again, so it stays an alias on every device.
        super()._apply(fn, *args, **kwargs)
        self.conv_weights = self.conv1d.weight.view(C, KW)
        return self

    def forward(self, x):
        window = x.view(-1, C, KW)
        return (window * self.conv_weights).sum(-1)


def _snapshot_load(skip_aliases: bool):
    def load(layer, ckpt):
        reloading = getattr(layer, "_loaded_once", False)
        param_storages = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        saved = {
            n: b.clone()
            for n, b in layer.named_buffers()
            if not (skip_aliases and b.untyped_storage().data_ptr() in param_storages)
        }
        reloadsafe.load_checkpoint(layer, ckpt)
        if reloading:  # "preserve" the buffers across the reload
            for n, b in layer.named_buffers():
                if n in saved:
                    b.copy_(saved[n])
        layer._loaded_once = True

    return load


_NOTE = ("a bug of the engine's reload machinery, re-created as the load function; the value check fails "
         "but names the forward (needs: each reachable tensor compared with a cold load's, by name)")

BUGS = [
    Bug("Z15", "vLLM", "vllm-project/vllm#44371", "O3", "copy-back overwrote an unloaded non-persistent buffer",
        ("root_size",), gemma_router, gemma_router, (6, H), needs={"compare_state": True}, gap=_NOTE,
        options={"load": _layerwise_load(copy_back_all=True)},
        fixed_options={"load": _layerwise_load(copy_back_all=False)}),
    Bug("Z16", "vLLM", "vllm-project/vllm#42481", "O3", "a buffer aliasing conv1d.weight copied back over it",
        ("conv1d.weight",), MambaConv, MambaConv, (6, C * KW), needs={"compare_state": True}, gap=_NOTE,
        options={"load": _snapshot_load(skip_aliases=False)},
        fixed_options={"load": _snapshot_load(skip_aliases=True)},
        values_must_change=True),
]
