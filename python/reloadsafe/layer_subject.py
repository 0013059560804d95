"""A Python layer as the protocol's subject (conformance/harness/subject.h):
``check_reload``'s arguments about the layer, validated here, and the steps
the protocol calls on it (build, load, post-process, forward, name what it
holds), with the post-processing an engine's loader runs by default."""
from __future__ import annotations

import contextlib
import copy
import functools
import gc
import numbers
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Callable, Union

import torch

from ._loader import _C
from .errors import ReloadCheckError
from .loading import (
    Checkpoint,
    CheckpointDrawer,
    check_drawable,
    checkpoint_layouts,
    layout,
    layout_hint,
    layout_notes,
    load_checkpoint,
)
from .sleep import Caches, cache_tensors, caches_emptied
from .walk import named_numbers, named_objects, named_tensors, shared_object_names, tensor_parts

__all__ = ["LayerSubject", "MODES", "process_weights_after_loading", "whole_number"]

#: The reload modes: "normal" (post-processing as after a first load) and
#: "direct" (inside ``direct_reload()``, where a weight may use all of its old
#: storage).
MODES = ("normal", "direct")

LayerOrFactory = Union[torch.nn.Module, Callable[[], torch.nn.Module]]
LoadFn = Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], None]
ProcessFn = Callable[[torch.nn.Module], None]
ForwardFn = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


class LayerSubject(_C.ReloadSubject):
    """A Python layer as the protocol's subject (conformance/harness/subject.h):
    check_reload's arguments about the layer, validated here and nowhere
    else, and the steps the protocol calls (``info``, ``draw_checkpoint``,
    ``draw_input``, ``cold_load``, ``reload``, ``forward``, ``cold_forward``,
    ``named_tensors``, ``named_objects``, ``release``) on one live layer."""

    def __init__(
        self,
        layer: LayerOrFactory,
        example_input: torch.Tensor | Callable[[int], torch.Tensor],
        load: LoadFn | None,
        process: ProcessFn | None,
        forward: ForwardFn | None,
        make_checkpoint: Callable[[int], Mapping[str, torch.Tensor]] | None,
        modes: Sequence[str],
        device: torch.device,
        name: str | None,
        undeclared: Iterable[str],
        expect_violation: str | None,
        memory_tolerance_bytes: Any,
        allow_constant_output: bool = False,
    ) -> None:
        _C.ReloadSubject.__init__(self)
        self.live: torch.nn.Module | None = None
        if isinstance(layer, torch.nn.Module):
            # A pristine copy made before anything is loaded: every cold load
            # starts from a copy of it, and the caller's module is left as it
            # is. Functions and closures are shared by deepcopy: pass a
            # factory when they hold tensors.
            template = _deep_copy(layer)
            self.factory: Callable[[], torch.nn.Module] = lambda: copy.deepcopy(template)
            default_name = type(layer).__name__
        elif callable(layer):
            self.factory = layer
            default_name = getattr(layer, "__name__", type(layer).__name__)
        else:
            raise ReloadCheckError(
                f"check_reload: `layer` must be a torch.nn.Module or a function returning one, "
                f"got {type(layer).__name__}"
            )
        self.name = name or default_name
        self.description = ""
        self.device = device
        if isinstance(modes, str):
            raise ReloadCheckError(
                f"check_reload: modes must be a sequence of modes, got the string {modes!r}: pass modes=({modes!r},)"
            )
        for m in modes:
            if m not in MODES:
                raise ReloadCheckError(f"check_reload: unknown mode {m!r}; the modes are {MODES}")
        if not modes:
            raise ReloadCheckError("check_reload: `modes` is empty; give 'normal', 'direct' or both")
        self.modes = tuple(modes)
        self.load_fn = load or functools.partial(load_checkpoint, device=device)
        self.process_fn = process
        self.forward_fn = forward
        self.user_checkpoint = make_checkpoint
        self.undeclared = set(undeclared)
        self.expect_violation = expect_violation
        self.memory_tolerance_bytes = whole_number("memory_tolerance_bytes", memory_tolerance_bytes, 0, example=4096)
        self.example_input = example_input
        self.allow_constant_output = bool(allow_constant_output)
        self.module_caches: Caches = {}
        self._layout_notes: list[str] | None = None
        # The module caches emptied from each mode's cold load to its
        # release, so each mode starts from empty caches and the process
        # gets back what they held (what the C++ harness does).
        self._mode_caches: contextlib.ExitStack | None = None
        self.own_sleep: Callable[[torch.nn.Module], None] | None = None  # sleep=function

        probe = self.new_layer()
        # What two layers of the factory share is no layer's state: a host
        # number there (vLLM's quant_config counting quantization time)
        # changes with every layer built, the check's own included.
        self.shared = tuple(shared_object_names(probe, self.new_layer()))
        # Numbers two cold loads of one checkpoint disagree on (preflight).
        self.volatile: frozenset[str] = frozenset()
        n_weights = sum(1 for _ in probe.parameters()) + sum(1 for _ in probe.buffers())
        if n_weights == 0:
            raise ReloadCheckError(
                f"check_reload: the layer {self.name} ({type(probe).__name__}) has no parameters or "
                "buffers, so there is nothing to load or reload: register its weights as "
                "torch.nn.Parameter (or buffers) and load checkpoints into them"
            )
        if make_checkpoint is None:
            check_drawable(self.name, probe)
        self.layouts = checkpoint_layouts(probe)
        self.drawer = CheckpointDrawer(self.layouts)  # one random draw per tensor, then copies
        if make_checkpoint is None and not self.layouts:
            raise ReloadCheckError(
                f"check_reload: every parameter of {self.name} is empty, so no checkpoint can be "
                "drawn from them: pass make_checkpoint=lambda seed: {name: tensor, ...}"
            )
        self.first_checkpoint = self.draw_checkpoint(0)

    # What the protocol calls.
    def info(self) -> Any:
        info = _C.SubjectInfo(
            self.name,
            self.description,
            [_C.ReloadMode.normal if m == "normal" else _C.ReloadMode.direct for m in self.modes],
            self.expect_violation is not None,
            self.expect_violation or "",
            self.memory_tolerance_bytes,
        )
        # Where torch.compile is loaded, the forward may run code compiled
        # for the thread's dispatch keys: warmed up under the trace's key too.
        info.warm_up_under_trace = "torch._dynamo" in sys.modules
        return info

    def cold_load(self, ckpt: Checkpoint) -> None:
        self._end_mode_caches()
        self._mode_caches = contextlib.ExitStack()
        self._mode_caches.enter_context(caches_emptied(self.module_caches))
        self.live = self.cold_loaded(ckpt)

    def _end_mode_caches(self) -> None:
        if self._mode_caches is not None:
            self._mode_caches.close()
            self._mode_caches = None

    def reload(self, mode: Any, ckpt: Checkpoint) -> None:
        assert self.live is not None
        self.load_and_process(self.live, ckpt)
        gc.collect()  # storages kept only by reference cycles are freed before the census

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.live is not None
        return self.run_forward(self.live, x)

    def named_tensors(self) -> list[Any]:
        assert self.live is not None
        out = []
        for nt in named_tensors(self.live):
            declared = nt.tensor.numel() > 0 and nt.name not in self.undeclared
            out.append(_C.NamedTensor(nt.name, nt.tensor, declared))
        return out

    # What the protocol's steps (ReloadSteps) ask of the layer.
    def sleep_and_wake(self, level: int) -> bool:
        if self.own_sleep is None:
            return False
        assert self.live is not None
        with torch.no_grad():
            self.own_sleep(self.live)
        return True

    def parameters(self) -> list[torch.Tensor]:
        """The registered parameters, a tensor subclass as its inner
        tensors (what holds the bytes): what a layerwise reload re-creates."""
        assert self.live is not None
        return [leaf for p in self.live.parameters() for leaf in _leaves(p)]

    def buffers(self) -> list[torch.Tensor]:
        """The registered buffers, non-persistent ones included, as
        ``parameters``: what a wake restores from its host copy."""
        assert self.live is not None
        return [leaf for _, b in self.live.named_buffers() for leaf in _leaves(b)]

    def cache_tensors(self) -> list[Any]:
        return [_C.NamedTensor(n, t, False) for n, t in cache_tensors(self.module_caches)]

    def named_numbers(self) -> list[Any]:
        assert self.live is not None
        return self._numbers(self.live)

    def _numbers(self, layer: torch.nn.Module) -> list[Any]:
        """The host numbers ``layer`` reaches, but those of objects every
        layer of the factory shares, those no load decides (Note [Numbers
        that no load decides] in preflight.py) and ``undeclared`` names."""
        return [
            _C.NamedNumber(n, float(v), isinstance(v, int))
            for n, v in named_numbers(layer)
            if n not in self.undeclared and n not in self.volatile and not _under(n, self.shared)
        ]

    def has_cold_state(self) -> bool:
        return True

    def cold_state(self, ckpt: Checkpoint, loads: int, forward_input: torch.Tensor | None) -> Any:
        """A new layer that loads and post-processes ``ckpt`` ``loads``
        times (in eval mode after the first, as a cold load leaves it), then
        runs its forward on ``forward_input`` if given, with the module
        caches emptied for it and put back after: its tensors (its caches'
        included) and host numbers, ``undeclared`` names left out."""
        with caches_emptied(self.module_caches) as caches:
            layer = self.new_layer()
            for i in range(loads):
                self.load_and_process(layer, ckpt)
                if i == 0:
                    layer.eval()
            if forward_input is not None:
                self.run_forward(layer, forward_input)
        tensors = [_C.NamedTensor(nt.name, nt.tensor, True) for nt in named_tensors(layer)
                   if nt.name not in self.undeclared]
        tensors += [_C.NamedTensor(n, t, True) for n, t in cache_tensors(caches)]
        return _C.LayerState(tensors, self._numbers(layer))

    def named_objects(self) -> list[Any]:
        assert self.live is not None
        return [_C.NamedObject(no.name, no.obj) for no in named_objects(self.live)]

    def release(self) -> None:
        self.live = None
        self._end_mode_caches()
        gc.collect()

    # The steps, on any layer of this subject.
    def new_layer(self) -> torch.nn.Module:
        """A new layer on the check's device, not loaded."""
        layer = self.factory()
        if not isinstance(layer, torch.nn.Module):
            raise ReloadCheckError(
                f"check_reload: the layer factory returned {type(layer).__name__}, not a torch.nn.Module"
            )
        if any(t.is_meta for t in (*layer.parameters(), *layer.buffers())):
            # A layer built on the meta device (deferred initialisation, an
            # engine's online quantization): its tensors get memory when the
            # checkpoint is loaded into them, so they are left where they are
            # (the default loader materialises them on the check's device);
            # one still on meta after loading is an error (_check_no_meta).
            return layer._apply(lambda t: t if t.is_meta else t.to(self.device))
        return layer.to(self.device)

    def cold_forward(self, ckpt: Checkpoint, x: torch.Tensor) -> torch.Tensor:
        """The forward on ``x`` of a cold load of ``ckpt`` into a new layer,
        made with the module caches emptied for it and put back after, so a
        corrupted cache cannot corrupt the reference too."""
        with caches_emptied(self.module_caches):
            layer = self.cold_loaded(ckpt)
        return self.run_forward(layer, x)

    def cold_loaded(self, ckpt: Checkpoint) -> torch.nn.Module:
        """A new layer with ``ckpt`` loaded and post-processed, then put in
        eval mode, as an engine's loader leaves a model: a library may take
        another path in inference (bitsandbytes' Linear4bit repacks its
        weight in its first eval forward on CPUs with AVX512-BF16), and a
        training-mode forward (dropout) is not repeatable. A reload does not
        call ``eval()`` again, as an engine's reload does not."""
        layer = self.new_layer()
        self.load_and_process(layer, ckpt)
        return layer.eval()

    def draw_checkpoint(self, seed: int) -> Checkpoint:
        if self.user_checkpoint is None:
            return self.drawer(seed)
        ckpt = self.user_checkpoint(seed)
        if not isinstance(ckpt, Mapping) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in ckpt.items()
        ):
            raise ReloadCheckError("check_reload: make_checkpoint(seed) must return a dict of name -> tensor")
        ckpt = dict(ckpt)
        first = getattr(self, "first_checkpoint", None)
        if first is not None:
            for k, v in ckpt.items():
                f = first.get(k)
                if f is None or f.shape != v.shape or f.dtype != v.dtype:
                    raise ReloadCheckError(
                        f"check_reload: make_checkpoint({seed}) gave '{k}' as {layout(v)}, but seed 0 gave "
                        f"{layout(f) if f is not None else 'no such tensor'}: every checkpoint must have the "
                        "same names and layouts, only different values"
                    )
        return ckpt

    def load_and_process(self, layer: torch.nn.Module, ckpt: Checkpoint, check_meta: bool = True) -> None:
        """Load ``ckpt`` into ``layer`` and post-process it. Without
        ``check_meta`` (the device-clean probe, where a tensor on meta is one
        made without a device, named by the probe) a tensor left on meta is
        not an error here."""
        with torch.no_grad():
            self.load_fn(layer, ckpt)
            if self.process_fn is not None:
                self.process_fn(layer)
            else:
                process_weights_after_loading(layer)
            if check_meta:
                self._check_no_meta(layer)

    def _check_no_meta(self, layer: torch.nn.Module) -> None:
        """After load and post-processing no non-empty parameter or buffer is
        left on the meta device (it has no data for the forward to read)."""
        for kind, items in (("parameter", layer.named_parameters()), ("buffer", layer.named_buffers())):
            for name, t in items:
                if t.is_meta and t.numel() > 0:
                    raise ReloadCheckError(
                        f"check_reload: after load and post-processing, {kind} '{name}' of {self.name} "
                        f"is still on the meta device ({layout(t)}, no data): build the layer's tensors on "
                        "a real device, or load every meta tensor from the checkpoint (its weight_loader "
                        "must give it memory, as reloadsafe.default_weight_loader does, before writing)"
                    )

    def layout_hint(self) -> str:
        """What the first checkpoint, loaded into a new layer, leaves in
        another layout than the checkpoint's (loading.layout_notes), as a
        note for an error or a failed report; "" when nothing, or when the
        load itself fails (the failure is reported already)."""
        if self._layout_notes is None:
            try:
                layer = self.new_layer()
                with torch.no_grad():
                    self.load_fn(layer, self.first_checkpoint)
                self._layout_notes = layout_notes(layer, self.first_checkpoint)
            except Exception:  # the hint is for a failure already reported; it adds no second one
                self._layout_notes = []
        return layout_hint(self._layout_notes)

    def run_forward(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = self.forward_fn(layer, x) if self.forward_fn is not None else layer(x)
        if not isinstance(out, torch.Tensor):
            raise ReloadCheckError(
                f"check_reload: the forward returned {type(out).__name__}, not a tensor: pass forward= "
                "a function (layer, x) -> tensor"
            )
        return out

    def draw_input(self, seed: int) -> torch.Tensor:
        x = self.example_input(seed) if callable(self.example_input) else self.example_input
        if not isinstance(x, torch.Tensor):
            raise ReloadCheckError(
                f"check_reload: example_input must be a tensor or a function seed -> tensor, got {type(x).__name__}"
            )
        return x.to(self.device)


def _under(name: str, prefixes: Sequence[str]) -> bool:
    """Whether ``name`` is reached through one of ``prefixes`` (a walk's
    names: ``stats.seconds`` is under ``stats``)."""
    return any(name.startswith(p) and name[len(p):len(p) + 1] in (".", "[") for p in prefixes)


def _leaves(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """``t``, or the tensors that hold its bytes (walk.tensor_parts), each
    taken apart the same way."""
    parts = tensor_parts(t)
    if parts is None:
        yield t
    else:
        for _, part in parts:
            yield from _leaves(part)


def process_weights_after_loading(layer: torch.nn.Module) -> None:
    """The post-processing ``check_reload`` runs when given no ``process``,
    as an engine's model loader runs it: vLLM's convention first (every
    module, the layer itself included, whose ``quant_method`` has
    ``process_weights_after_loading`` gets ``quant_method.
    process_weights_after_loading(module)``), then the layer's own
    ``process_weights_after_loading()`` if it has one."""
    for module in layer.modules():
        hook = getattr(getattr(module, "quant_method", None), "process_weights_after_loading", None)
        if callable(hook):
            hook(module)
    own = getattr(layer, "process_weights_after_loading", None)
    if callable(own):
        own()


def _deep_copy(layer: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``layer``, or a ReloadCheckError telling to pass a
    factory where the layer cannot be copied (vLLM's parameters take their
    loader as a constructor argument, which deepcopy does not pass)."""
    try:
        return copy.deepcopy(layer)
    except Exception as e:
        kind = type(layer).__name__
        raise ReloadCheckError(
            f"check_reload: the layer ({kind}) cannot be deep-copied ({type(e).__name__}: {e}), and "
            "every cold load needs a new layer: pass a factory that builds one instead of the module, "
            f"e.g. check_reload(lambda: {kind}(...), ...), inside whatever context building it needs "
            "(vLLM's set_current_vllm_config)"
        ) from e



def whole_number(name: str, value: Any, minimum: int, example: int) -> int:
    """``value`` as an int of at least ``minimum``; a ReloadCheckError for a
    string, a float, a bool or anything that is not a whole number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ReloadCheckError(
            f"check_reload: {name} must be an int, got {type(value).__name__} {value!r}: pass a whole "
            f"number, e.g. {name}={example}"
        )
    if value < minimum:
        raise ReloadCheckError(f"check_reload: {name} must be at least {minimum}, got {value}")
    return int(value)
