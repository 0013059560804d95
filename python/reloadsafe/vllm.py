"""Checking vLLM's own layers with ``check_reload``.

vLLM builds a layer inside its configuration context
(``set_current_vllm_config``), loads a checkpoint through each parameter's
``weight_loader`` (a fused layer takes each unfused checkpoint tensor with a
shard id: "q"/"k"/"v" for ``QKVParallelLinear``, 0/1 for
``MergedColumnParallelLinear``), post-processes with its model loader's
``process_weights_after_loading(model, model_config, device)``, and reloads
in one of two ways: the same loaders and post-processing again, or its
layerwise reload (``vllm/model_executor/model_loader/reload``:
``record_metadata_for_reloading`` when the model is built, then per reload
``initialize_layerwise_reload`` -> the loaders -> ``finalize_layerwise_reload``:
the loaders write into fresh tensors, which are post-processed and then
copied into the tensors the layer had). This module gives ``check_reload`` those steps::

    import reloadsafe
    from reloadsafe import vllm as rv

    with rv.one_process_world(config):  # vLLM's parallel layers, tensor parallel size 1
        loading = rv.VllmLoading(config, {"q": ("weight", "q"), "k": ("weight", "k"),
                                          "v": ("weight", "v")}, reload="layerwise")
        report = reloadsafe.check_reload(
            rv.layer_factory(config, lambda: QKVParallelLinear(64, 16, 4, 2)), x,
            load=loading.load, process=loading.process,
            forward=rv.in_config(config, lambda layer, x: layer(x)[0]),
            make_checkpoint=lambda seed: {"q": ..., "k": ..., "v": ...})

A whole engine's weight syncs (``collective_rpc("reload_weights", ...)``,
a worker extension calling the model runner) are checked by
``check_engine`` (``reloadsafe.vllm_engine``, re-exported here)::

    report = rv.check_engine(llm, rv.reload_from_iterator, reloads=2)
    assert report.ok, report.format()

``vllm`` is imported inside the functions that need it, never by
``import reloadsafe`` or ``import reloadsafe.vllm``: vLLM is no dependency of
the package. Written against vLLM 0.33.
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .errors import ReloadCheckError
from .layer_copies import reloads_by_identity
from .vllm_engine import (
    CPU_PLATFORM_REBUILDS,
    EngineCheckpoint,
    EngineReload,
    EngineReport,
    check_engine,
    engine_args_of,
    model_runner_of,
    reload_from_checkpoint,
    reload_from_iterator,
    reload_streamed,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
else:
    VllmConfig = Any

__all__ = [
    "CPU_PLATFORM_REBUILDS",
    "EngineCheckpoint",
    "EngineReload",
    "EngineReport",
    "RELOAD_WAYS",
    "ShardId",
    "Shards",
    "VllmLoading",
    "check_engine",
    "engine_args_of",
    "in_config",
    "layer_factory",
    "load_through_weight_loaders",
    "model_runner_of",
    "one_process_world",
    "rank_world",
    "reload_from_checkpoint",
    "reload_from_iterator",
    "reload_streamed",
    "vllm_config_context",
]

#: A weight loader's shard id: "q"/"k"/"v" for QKVParallelLinear, the index
#: of the merged output for MergedColumnParallelLinear, None for a tensor
#: loaded whole.
ShardId = str | int | None

#: Checkpoint tensor name -> (parameter name in the layer, shard id). A name
#: not in the map is loaded whole into the parameter of that name.
Shards = Mapping[str, tuple[str, ShardId]]

#: How ``VllmLoading`` reloads: "loaders" (the weight loaders and
#: post-processing again, as on a first load) or "layerwise" (vLLM's
#: layerwise reload, what ``reload_weights`` and the weight-transfer engines
#: run).
RELOAD_WAYS = ("loaders", "layerwise")

_F = TypeVar("_F", bound=Callable[..., Any])


@contextlib.contextmanager
def vllm_config_context(vllm_config: VllmConfig) -> Iterator[None]:
    """``vllm_config`` as vLLM's current configuration for the block
    (``set_current_vllm_config``): layers read it when they are built
    (custom-op dispatch, quantization methods) and some when they load or
    post-process."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vllm_config):
        yield


def in_config(vllm_config: VllmConfig, fn: _F) -> _F:
    """``fn`` run inside ``vllm_config_context(vllm_config)``: a forward (or
    any step) for ``check_reload`` that needs vLLM's configuration."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with vllm_config_context(vllm_config):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


@contextlib.contextmanager
def one_process_world(vllm_config: VllmConfig, backend: str = "gloo") -> Iterator[None]:
    """vLLM's distributed state as a world of this one process (tensor and
    pipeline parallel size 1) for the block, which vLLM's parallel layers
    need to be built; torn down at the end. Where the state is already
    initialized it is used as it is and left alone. ``backend`` is the
    torch.distributed backend ("gloo" works on a CPU)."""
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )

    if model_parallel_is_initialized():
        yield
        return
    with vllm_config_context(vllm_config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend=backend,
        )
        initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()


@contextlib.contextmanager
def rank_world(vllm_config: VllmConfig) -> Iterator[None]:
    """vLLM's distributed state over the ``torch.distributed`` world this
    process has joined (a rank of ``reloadsafe.check_ranks``), tensor
    parallel over all of it, for the block: vLLM's parallel layers built
    inside take this rank's shard, and their weight loaders narrow a whole
    checkpoint to it. At the end vLLM's groups are torn down; the world is
    left to whoever started it."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state
    from vllm.distributed.parallel_state import (
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )

    if not dist.is_initialized():
        raise ReloadCheckError(
            "rank_world: this process has joined no torch.distributed world; run the check on every rank "
            "with reloadsafe.check_ranks (or init_process_group first), or use one_process_world")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # vLLM's CPU communicator names the shared memory of a world's groups
    # after VLLM_DIST_IDENT, which vLLM's CPU worker sets: the same on every
    # rank of one world, another for each world.
    set_ident = "VLLM_DIST_IDENT" not in os.environ
    if set_ident:
        ident: list[str | None] = [f"reloadsafe-{uuid.uuid4().hex[:12]}" if rank == 0 else None]
        dist.broadcast_object_list(ident, src=0)
        os.environ["VLLM_DIST_IDENT"] = str(ident[0])
    try:
        with vllm_config_context(vllm_config):
            # The world exists: vLLM builds its groups on it and starts none.
            init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank,
                                         distributed_init_method="env://", backend=str(dist.get_backend()))
            initialize_model_parallel(world_size, 1)
        try:
            yield
        finally:
            destroy_model_parallel()
            # destroy_distributed_environment would destroy the process
            # group too, which the rank's starter still uses: vLLM's own
            # world group only.
            world = getattr(parallel_state, "_WORLD", None)
            if world is not None:
                world.destroy()
                parallel_state._WORLD = None
    finally:
        if set_ident:
            os.environ.pop("VLLM_DIST_IDENT", None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def layer_factory(
    vllm_config: VllmConfig,
    build: Callable[[], torch.nn.Module],
    *,
    record_for_reload: bool = True,
) -> Callable[[], torch.nn.Module]:
    """A layer factory for ``check_reload``: each call runs ``build()``
    inside vLLM's configuration context and, with ``record_for_reload``,
    records the new layer's metadata for vLLM's layerwise reload
    (``record_metadata_for_reloading``), as vLLM's ``initialize_model`` does
    for a model it builds. vLLM's layers cannot be deep-copied (their
    parameters take the loader as a constructor argument), so
    ``check_reload`` needs a factory for its fresh cold loads."""

    def make() -> torch.nn.Module:
        with vllm_config_context(vllm_config):
            layer = build()
            if record_for_reload:
                from vllm.model_executor.model_loader.reload import record_metadata_for_reloading

                record_metadata_for_reloading(layer)
                # The metadata is vLLM's per module object: a copy of the
                # layer would not reload as it does.
                reloads_by_identity(layer)
        return layer

    make.__name__ = getattr(build, "__name__", "vllm_layer")
    return make


def load_through_weight_loaders(
    layer: torch.nn.Module, checkpoint: Mapping[str, torch.Tensor], shards: Shards | None = None
) -> None:
    """Loads ``checkpoint`` into ``layer`` as vLLM's model code does: for
    each checkpoint tensor the parameter ``shards`` maps it to (by default
    the parameter of its name), through that parameter's ``weight_loader``
    (``weight_loader(param, tensor)``, or ``weight_loader(param, tensor,
    shard_id)`` for a shard), else vLLM's ``default_weight_loader``. The
    parameter is looked up for every tensor, so a layerwise reload's
    replacement parameters (on the meta device, with wrapped loaders) are the
    ones loaded into."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    shards = shards or {}
    for name, tensor in checkpoint.items():
        param_name, shard_id = shards.get(name, (name, None))
        param = layer.get_parameter(param_name)
        loader = getattr(param, "weight_loader", default_weight_loader)
        if shard_id is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard_id)


class VllmLoading:
    """``load=`` and ``process=`` for ``check_reload`` over a vLLM layer:
    the load through the weight loaders and the post-processing of vLLM's
    model loader, both inside vLLM's configuration context, and reloads the
    way ``reload`` names:

    - "loaders": every load, reloads included, goes through the weight
      loaders and is post-processed (``process``) again;
    - "layerwise": a layer's first load is a load through the loaders
      post-processed by ``process``; every later load of it is vLLM's
      layerwise reload (``initialize_layerwise_reload``, the loaders,
      ``finalize_layerwise_reload``), which post-processes on its own, so
      ``process`` does nothing after it. The layer must have been built by
      ``layer_factory(..., record_for_reload=True)``.

    ``shards`` maps checkpoint names to (parameter, shard id), as for
    ``load_through_weight_loaders``.
    """

    def __init__(self, vllm_config: VllmConfig, shards: Shards | None = None, *, reload: str = "loaders") -> None:
        if reload not in RELOAD_WAYS:
            raise ValueError(f"VllmLoading: reload must be one of {RELOAD_WAYS}, got {reload!r}")
        self.vllm_config = vllm_config
        self.shards: Shards = dict(shards or {})
        self.reload = reload
        # Layers loaded at least once, and those whose latest load still
        # waits for post-processing (a first load, or any load with
        # reload="loaders"). Weak: check_reload builds and drops many layers.
        self._loaded: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._unprocessed: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    def load(self, layer: torch.nn.Module, checkpoint: Mapping[str, torch.Tensor]) -> None:
        """Loads ``checkpoint`` into ``layer``: through the weight loaders,
        or, for a layer loaded before and ``reload="layerwise"``, through
        vLLM's layerwise reload."""
        with vllm_config_context(self.vllm_config):
            if self.reload == "layerwise" and layer in self._loaded:
                from vllm.model_executor.model_loader.reload import (
                    finalize_layerwise_reload,
                    initialize_layerwise_reload,
                )

                initialize_layerwise_reload(layer)
                load_through_weight_loaders(layer, checkpoint, self.shards)
                finalize_layerwise_reload(layer, self.vllm_config.model_config)
                self._unprocessed.discard(layer)
            else:
                load_through_weight_loaders(layer, checkpoint, self.shards)
                self._unprocessed.add(layer)
        self._loaded.add(layer)

    def process(self, layer: torch.nn.Module) -> None:
        """vLLM's post-processing after a load (its model loader's
        ``process_weights_after_loading``: each module's
        ``quant_method.process_weights_after_loading(module)``, and what else
        vLLM runs there), unless the latest load was a layerwise reload,
        which post-processed already."""
        if layer not in self._unprocessed:
            return
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        with vllm_config_context(self.vllm_config):
            device = torch.device(self.vllm_config.device_config.device)
            process_weights_after_loading(layer, self.vllm_config.model_config, device)
        self._unprocessed.discard(layer)
