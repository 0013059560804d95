"""A Python layer as the protocol's subject (conformance/harness/subject.h):
``check_reload``'s arguments about the layer, validated here, and what only
the subject knows: how to build a layer, load it, post-process it (by
default as an engine's loader does), run its forward and name what it
holds. Which layers are built when, the loads made aside and what is
compared are the protocol's (conformance/harness/layer_life.h)."""
from __future__ import annotations

import contextlib
import copy
import functools
import gc
import numbers
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import torch

from ._loader import _C
from .errors import ReloadCheckError
from .layer_copies import LayerAsBuilt
from .loading import (
    Checkpoint,
    CheckpointDrawer,
    Layouts,
    check_drawable,
    checkpoint_layouts,
    layout,
    layout_hint,
    layout_notes,
    load_checkpoint,
    process_weights_after_loading,
)
from .sleep import Caches, cache_tensors, caches_emptied
from .walk import named_numbers, named_objects, named_tensors, shared_object_names, tensor_parts

__all__ = ["LayerHandle", "LayerSubject", "MODES", "whole_number"]

#: The reload modes: "normal" (post-processing as after a first load) and
#: "direct" (inside ``direct_reload()``, where a weight may use all of its old
#: storage).
MODES = ("normal", "direct")

LayerOrFactory: TypeAlias = torch.nn.Module | Callable[[], torch.nn.Module]
LoadFn = Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], None]
ProcessFn = Callable[[torch.nn.Module], None]
ForwardFn = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


def _noting_raises(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of a LayerSubject or a LayerHandle, noting on the subject
    the first exception a step of the layer raised (and what the layer then
    held off the check's device), for the error check.py raises when the
    protocol could not make its cold load. The exception still propagates:
    the protocol decides what it is (Note [The cold load a run starts from],
    Note [A reload that raises])."""

    @functools.wraps(method)
    def noting(self: Any, *args: Any) -> Any:
        try:
            return method(self, *args)
        except Exception as e:
            subject = self if isinstance(self, LayerSubject) else self.subject
            if subject.raised is None and getattr(self, "note_raises", True):
                from .device_clean import stray  # the error's reader only

                subject.raised = e
                module = getattr(self, "module", None)
                subject.raised_stray = stray(module, subject.device) if module is not None else ""
            raise

    return noting


class LayerSubject(_C.ReloadSubject):
    """A Python layer as the protocol's subject (conformance/harness/subject.h):
    check_reload's arguments about the layer, validated here and nowhere
    else, and what the protocol asks of a subject (``info``,
    ``draw_checkpoint``, ``draw_input``, ``new_layer``, and the module
    caches: ``cache_tensors``, ``empty_caches``, ``restore_caches``)."""

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
        # The caches emptied by each empty_caches() not yet restored,
        # innermost last.
        self._emptied: list[contextlib.ExitStack] = []
        self.own_sleep: Callable[[torch.nn.Module], None] | None = None  # sleep=function

        probe = self.build_layer()
        # The probe is the first layer the protocol asks for (the first
        # mode's live layer): built once, not twice. Layers loaded aside are
        # copies of it as built, where it can be kept without its
        # parameters' bytes (Note [Layers made aside by copying]).
        self._as_built = LayerAsBuilt.of(probe)
        self._last_on_checkpoint: weakref.ref[torch.nn.Module] | None = None
        self._copies_outlive = False  # copy_of_new_layer
        self._fresh: torch.nn.Module | None = probe
        # What two layers of the factory share is no layer's state (vLLM's
        # quant_config counting quantization time changes with every layer
        # built, the check's own included): found where numbers are first
        # asked for (_shared_names), since it takes a layer more.
        self._shared: tuple[str, ...] | None = None
        self.kind = type(probe).__name__
        # What a step of the layer raised first, and the tensors the layer
        # then held off the check's device: for the error of a cold load the
        # protocol could not make (check.py).
        self.raised: BaseException | None = None
        self.raised_stray = ""
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
        self.drawer = CheckpointDrawer(self.layouts)  # the protocol's generator, as C++ subjects draw
        if make_checkpoint is None and not self.layouts:
            raise ReloadCheckError(
                f"check_reload: every parameter of {self.name} is empty, so no checkpoint can be "
                "drawn from them: pass make_checkpoint=lambda seed: {name: tensor, ...}"
            )
        # The names and layouts of seed 0's checkpoint, which every other
        # must have (draw_checkpoint): only they are kept, and seed 0's
        # checkpoint is drawn again where a hint needs it (the check holds
        # one checkpoint at a time).
        self._first_layouts: Layouts | None = None
        if make_checkpoint is not None:
            self._first_layouts = {k: (tuple(v.shape), v.dtype) for k, v in self.draw_checkpoint(0).items()}

    @property
    def first_checkpoint(self) -> Checkpoint:
        """Seed 0's checkpoint, drawn anew: for hints and probes made
        outside the protocol."""
        return self.draw_checkpoint(0)

    # What the protocol asks of a subject.
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
        # Left out of every comparison of values: what the author marked as
        # free to change (the protocol adds the numbers no load decides).
        info.free_names = sorted(self.undeclared)
        # Note [A check that tests nothing] (cold_start.h): the refusal's
        # advice, in Python's terms.
        info.constant_output_allowed = self.allow_constant_output
        info.constant_output_hint = (
            "A module instance whose functions or closures hold its own tensors is the usual cause: "
            "deepcopy shares functions, so each copy the check makes reads the instance's tensors, "
            f"never loaded; pass a factory that builds the layer (check_reload(lambda: {self.kind}(...), "
            "...)). For a layer whose output truly does not depend on its weights for this input, "
            "pass allow_constant_output=True")
        return info

    @_noting_raises
    def new_layer(self) -> LayerHandle:
        layer, self._fresh = self._fresh, None
        return LayerHandle(self, layer if layer is not None else self.build_layer())

    def copy_of_new_layer(self, on: Checkpoint | None) -> LayerHandle | None:
        """A copy of the layer as built (LayerAsBuilt), made on ``on``'s
        tensors where given, or None where the layer cannot be kept so; what
        it raises is not the layer's.

        A copy on a checkpoint is made only while none outlives its use: a
        factory or library that keeps every layer it loaded (a registry)
        would keep each one's checkpoint too, which the memory census would
        take for the reload's growth (the checkpoint was drawn for the
        reload). Once the last one is still alive (after a collection) when
        the next is asked for, every later copy has memory of its own."""
        if self._as_built is None:
            return None
        if on is not None and (self._copies_outlive or _alive(self._last_on_checkpoint)):
            self._copies_outlive = True
            on = None
        module = self._as_built.copy(on)
        if on is not None:
            self._last_on_checkpoint = weakref.ref(module)
        return LayerHandle(self, module, note_raises=False)

    def cache_tensors(self) -> list[Any]:
        return [_C.NamedTensor(n, t, False) for n, t in cache_tensors(self.module_caches)]

    def empty_caches(self) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(caches_emptied(self.module_caches))
        self._emptied.append(stack)

    def restore_caches(self) -> None:
        self._emptied.pop().close()
        if not self._emptied:
            # The end of a mode, whose layers the protocol has let go of:
            # storages that only reference cycles keep are freed before the
            # next mode's census.
            gc.collect()

    def numbers(self, layer: torch.nn.Module) -> list[Any]:
        """The host numbers ``layer`` reaches, but those of objects every
        layer of the factory shares (the protocol leaves out
        ``SubjectInfo.free_names``)."""
        shared = self._shared_names(layer)
        return [
            _C.NamedNumber(n, float(v), isinstance(v, int))
            for n, v in named_numbers(layer)
            if not _under(n, shared)
        ]

    def _shared_names(self, layer: torch.nn.Module) -> tuple[str, ...]:
        """The names of what ``layer`` shares with a layer the factory builds
        anew (walk.shared_object_names), found once."""
        if self._shared is None:
            self._shared = tuple(shared_object_names(layer, self.build_layer()))
        return self._shared

    # The steps, on any layer of this subject.
    def build_layer(self) -> torch.nn.Module:
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

    @_noting_raises
    def draw_checkpoint(self, seed: int) -> Checkpoint:
        if self.user_checkpoint is None:
            return self.drawer(seed)
        ckpt = self.user_checkpoint(seed)
        if not isinstance(ckpt, Mapping) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in ckpt.items()
        ):
            raise ReloadCheckError("check_reload: make_checkpoint(seed) must return a dict of name -> tensor")
        ckpt = dict(ckpt)
        first = self._first_layouts
        if first is not None:
            for k, v in ckpt.items():
                f = first.get(k)
                if f is None or f[0] != tuple(v.shape) or f[1] != v.dtype:
                    was = f"{str(f[1]).replace('torch.', '')}{list(f[0])}" if f is not None else "no such tensor"
                    raise ReloadCheckError(
                        f"check_reload: make_checkpoint({seed}) gave '{k}' as {layout(v)}, but seed 0 gave "
                        f"{was}: every checkpoint must have the same names and layouts, only different values"
                    )
        return ckpt

    def load(self, layer: torch.nn.Module, ckpt: Checkpoint) -> None:
        """Load ``ckpt`` into ``layer`` through the loaders."""
        with torch.no_grad():
            self.load_fn(layer, ckpt)

    def process(self, layer: torch.nn.Module, check_meta: bool = True) -> None:
        """Post-process ``layer``. Without ``check_meta`` (the device-clean
        probe, where a tensor on meta is one made without a device, named by
        the probe) a tensor left on meta is not an error here."""
        with torch.no_grad():
            if self.process_fn is not None:
                self.process_fn(layer)
            else:
                process_weights_after_loading(layer)
        if check_meta:
            self._check_no_meta(layer)

    def load_and_process(self, layer: torch.nn.Module, ckpt: Checkpoint, check_meta: bool = True) -> None:
        """``load`` then ``process``, as one load of the protocol does."""
        self.load(layer, ckpt)
        self.process(layer, check_meta)

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
                layer = self._as_built.copy() if self._as_built is not None else self.build_layer()
                first = self.first_checkpoint
                with torch.no_grad():
                    self.load_fn(layer, first)
                self._layout_notes = layout_notes(layer, first)
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

    @_noting_raises
    def draw_input(self, seed: int) -> torch.Tensor:
        x = self.example_input(seed) if callable(self.example_input) else self.example_input
        if not isinstance(x, torch.Tensor):
            raise ReloadCheckError(
                f"check_reload: example_input must be a tensor or a function seed -> tensor, got {type(x).__name__}"
            )
        return x.to(self.device)


class LayerHandle(_C.SubjectLayer):
    """One layer of a LayerSubject, as the protocol holds it
    (conformance/harness/subject.h): its load, post-processing and forward,
    and what it holds by name. After its first post-processing the layer is
    put in eval mode, as an engine's loader leaves a model: a library may
    take another path in inference (bitsandbytes' Linear4bit repacks its
    weight in its first eval forward on CPUs with AVX512-BF16), and a
    training-mode forward (dropout) is not repeatable; a reload does not call
    ``eval()`` again, as an engine's reload does not."""

    def __init__(self, subject: LayerSubject, module: torch.nn.Module, note_raises: bool = True) -> None:
        _C.SubjectLayer.__init__(self)
        self.subject = subject
        self.module = module
        self.loads = 0
        # What a step raises is noted for the subject's errors (_noting_raises),
        # but on a copy the protocol is only trying (copy_of_new_layer).
        self.note_raises = note_raises

    @_noting_raises
    def load(self, ckpt: Checkpoint) -> None:
        self.subject.load(self.module, ckpt)

    @_noting_raises
    def process(self) -> None:
        self.subject.process(self.module)
        self.loads += 1
        if self.loads == 1:
            self.module.eval()
        else:
            gc.collect()  # storages a reload left only to reference cycles are freed before the census

    @_noting_raises
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.subject.run_forward(self.module, x)

    def named_tensors(self) -> list[Any]:
        undeclared = self.subject.undeclared
        return [_C.NamedTensor(nt.name, nt.tensor, nt.tensor.numel() > 0 and nt.name not in undeclared)
                for nt in named_tensors(self.module)]

    def named_objects(self) -> list[Any]:
        return [_C.NamedObject(no.name, no.obj) for no in named_objects(self.module)]

    def named_numbers(self) -> list[Any]:
        return self.subject.numbers(self.module)

    def parameters(self) -> list[torch.Tensor]:
        """The registered parameters, a tensor subclass as its inner
        tensors (what holds the bytes): what a layerwise reload re-creates."""
        return [leaf for p in self.module.parameters() for leaf in _leaves(p)]

    def buffers(self) -> list[torch.Tensor]:
        """The registered buffers, non-persistent ones included, as
        ``parameters``: what a wake restores from its host copy."""
        return [leaf for _, b in self.module.named_buffers() for leaf in _leaves(b)]

    def sleep_and_wake(self, level: int) -> bool:
        own = self.subject.own_sleep
        if own is None:
            return False
        with torch.no_grad():
            own(self.module)
        return True


def _alive(ref: weakref.ref[torch.nn.Module] | None) -> bool:
    """Whether what ``ref`` refers to is alive, after a collection if it
    seems to be (a module in a reference cycle is freed only by one)."""
    if ref is None or ref() is None:
        return False
    gc.collect()
    return ref() is not None


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
