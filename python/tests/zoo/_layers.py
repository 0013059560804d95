"""Small helpers the zoo's layers share: frozen parameters, the copy-or-bind
idiom the fixes use, and checkpoints whose names are not the layer's
parameters (an engine's sharded checkpoint, loaded by its own load function)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

import reloadsafe
from reloadsafe import CheckpointDrawer

Checkpoint = dict[str, torch.Tensor]


def param(*shape: int, dtype: torch.dtype = torch.float32) -> torch.nn.Parameter:
    """A frozen parameter, as an engine creates a weight before loading."""
    return torch.nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)


def bind_or_assign(owner: object, name: str, new: torch.Tensor) -> None:
    """The fixes' idiom (vLLM's ``replace_parameter(prefer_copy=True)``,
    SGLang's ``bind_or_assign``): copy ``new`` into the tensor ``owner``
    already holds under ``name`` when shape, strides, dtype and device match,
    else bind it (the first post-processing)."""
    old = getattr(owner, name, None)
    if (
        isinstance(old, torch.Tensor)
        and old.shape == new.shape
        and old.stride() == new.stride()
        and old.dtype == new.dtype
        and old.device == new.device
    ):
        old.copy_(new)
    else:
        setattr(owner, name, new)


def checkpoints(layouts: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> Callable[[int], Checkpoint]:
    """``make_checkpoint`` for a checkpoint with these names and layouts,
    new values for every seed (reloadsafe's own draw)."""
    drawer = CheckpointDrawer(dict(layouts))
    return drawer


def ab_cycle(make_checkpoint: Callable[[int], Checkpoint]) -> Callable[[int], Checkpoint]:
    """Checkpoints that cycle A -> B -> A -> B ...: the cold load and every
    even reload get checkpoint A, every odd reload B, in a run whose seed is
    below ``reload_seed(0, 1)`` (reload r's seed is ``reload_seed(seed, r)``,
    a multiple of that stride above the run's; see
    conformance/harness/run_options.h)."""
    stride = reloadsafe._C.reload_seed(0, 1)

    def cycle(seed: int) -> Checkpoint:
        return make_checkpoint((seed // stride) % 2)

    return cycle


def same_weights(make_checkpoint: Callable[[int], Checkpoint]) -> Callable[[int], Checkpoint]:
    """Checkpoints that are all the same: a same-weights reload."""
    return lambda seed: make_checkpoint(0)


def default_checkpoints(layer: Callable[[], torch.nn.Module]) -> Callable[[int], Checkpoint]:
    """The checkpoints ``check_reload`` draws by default for ``layer``."""
    probe = layer()
    layouts = {n: (tuple(p.shape), p.dtype) for n, p in probe.named_parameters() if p.numel() > 0}
    return checkpoints(layouts)


def load_shards(layer: torch.nn.Module, ckpt: Mapping[str, torch.Tensor]) -> None:
    """An engine's ``load_weights``: each checkpoint name is mapped by the
    layer's ``shard_map`` ({checkpoint name: (parameter name, shard id)}) to a
    parameter, whose ``weight_loader(param, tensor, shard_id)`` places it;
    names not in the map load through reloadsafe's default loader."""
    shard_map: Mapping[str, tuple[str, str]] = getattr(layer, "shard_map", {})
    rest = {}
    for name, t in ckpt.items():
        if name in shard_map:
            pname, shard = shard_map[name]
            p = layer.get_parameter(pname)
            p.weight_loader(p, t, shard)
        else:
            rest[name] = t
    reloadsafe.load_checkpoint(layer, rest)
