"""check_reload: the reload protocol of the C++ harness, on a Python layer.

A Python layer (a ``torch.nn.Module``, its load function, its
post-processing and its forward) is adapted to the C++ ``ReloadSubject``
(conformance/harness/protocol.h) and run through the very protocol the C++
backends go through: cold load, a traced forward (the captured read set),
many reloads of value-changing checkpoints in the normal and the
direct-reload mode, and after each reload the checks a captured CUDA graph
relies on. See ``check_reload`` for the list.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import gc
import json
import numbers
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Callable, Union

import torch
from torch.utils._device import DeviceContext, _device_constructors
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._loader import _C
from .compiler import watch_compilations
from .errors import ReloadCheckError, ReloadViolation
from .loading import (
    Checkpoint,
    CheckpointDrawer,
    checkpoint_layouts,
    describe,
    is_dense,
    load_checkpoint,
)
from .sleep import LEVELS, Caches, cache_tensors, caches_emptied
from .walk import named_numbers, named_objects, named_tensors, tensor_parts

__all__ = ["check_reload", "ReloadReport", "MODES"]

#: The reload modes: "normal" (post-processing as after a first load) and
#: "direct" (inside ``direct_reload()``, where a weight may use all of its old
#: storage).
MODES = ("normal", "direct")

LayerOrFactory = Union[torch.nn.Module, Callable[[], torch.nn.Module]]
LoadFn = Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], None]
ProcessFn = Callable[[torch.nn.Module], None]
ForwardFn = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


class ReloadReport:
    """What ``check_reload`` found, for one layer.

    ``ok`` is the verdict; ``table()`` is for people (the C++ harness's
    table, with every violation by name and, for a traced read, op and
    argument); ``json()`` is for machines (the C++ harness's JSON schema);
    ``modes`` has the details per mode as plain dicts.
    """

    def __init__(self, report: Any, options: Any, hint: str = "") -> None:
        self._report = report
        self._options = options
        self._hint = hint

    @property
    def name(self) -> str:
        return self._report.name

    @property
    def ok(self) -> bool:
        """True when every declared mode is clean (for a negative control:
        when the expected violation was flagged)."""
        return bool(self._report.ok())

    def json(self) -> str:
        """The report in the C++ harness's JSON schema (one backend)."""
        return _C.to_json([self._report], self._options)

    def to_dict(self) -> dict[str, Any]:
        """``json()`` parsed: this layer's entry (name, ok, and per mode the
        violations, warnings, flagged names, read counts and memory)."""
        return json.loads(self.json())["backends"][0]

    def table(self) -> str:
        """The verdict table with every listed violation and warning (and,
        for a failed check whose load leaves a tensor in another layout than
        the checkpoint's, a note saying so)."""
        table = _C.to_table([self._report])
        return f"{table}{self._hint}\n" if self._hint else table

    @property
    def modes(self) -> dict[str, dict[str, Any]]:
        """Per mode ("normal", "direct"): the JSON entry of that mode."""
        return self.to_dict()["modes"]

    @property
    def flagged(self) -> list[str]:
        """Every distinct tensor name and traced read flagged, in any mode."""
        out: list[str] = []
        for m in self._report.modes:
            out += [f for f in m.flagged if f not in out]
        return out

    @property
    def errors(self) -> list[str]:
        return [m.error for m in self._report.modes if m.error]

    def raise_for_violations(self) -> ReloadReport:
        """Raises ``ReloadViolation`` with the table unless ``ok``."""
        if not self.ok:
            raise ReloadViolation(self.table(), self)
        return self

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<ReloadReport {self.name!r} ok={self.ok}>"


class _LayerSubject(_C.ReloadSubject):
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
        self.memory_tolerance_bytes = _whole_number("memory_tolerance_bytes", memory_tolerance_bytes, 0, example=4096)
        self.example_input = example_input
        self.module_caches: Caches = {}
        self._layout_notes: list[str] | None = None
        # The module caches emptied from each mode's cold load to its
        # release, so each mode starts from empty caches and the process
        # gets back what they held (what the C++ harness does).
        self._mode_caches: contextlib.ExitStack | None = None
        self.own_sleep: Callable[[torch.nn.Module], None] | None = None  # sleep=function

        probe = self.new_layer()
        n_weights = sum(1 for _ in probe.parameters()) + sum(1 for _ in probe.buffers())
        if n_weights == 0:
            raise ReloadCheckError(
                f"check_reload: the layer {self.name} ({type(probe).__name__}) has no parameters or "
                "buffers, so there is nothing to load or reload: register its weights as "
                "torch.nn.Parameter (or buffers) and load checkpoints into them"
            )
        if make_checkpoint is None:
            self._check_drawable(probe)
        self.layouts = checkpoint_layouts(probe)
        self.drawer = CheckpointDrawer(self.layouts)  # one random draw per tensor, then copies
        if make_checkpoint is None and not self.layouts:
            raise ReloadCheckError(
                f"check_reload: every parameter of {self.name} is empty, so no checkpoint can be "
                "drawn from them: pass make_checkpoint=lambda seed: {name: tensor, ...}"
            )
        self.first_checkpoint = self.draw_checkpoint(0)

    def _check_drawable(self, probe: torch.nn.Module) -> None:
        """Checkpoints are drawn from the fresh layer's parameters, as dense
        tensors: a parameter that is not dense (mkldnn, sparse, quantized)
        cannot be drawn or loaded by default, and a layer whose non-empty
        weights are all buffers has nothing to draw. Both are named."""
        params = [(n, p) for n, p in probe.named_parameters(remove_duplicate=True) if p.numel() > 0]
        for name, p in params:
            if not is_dense(p):
                raise ReloadCheckError(
                    f"check_reload: {self.name}: parameter '{name}' is {describe(p)}, from which no "
                    "checkpoint can be drawn and into which the default loader cannot write. An engine "
                    f"loads a dense checkpoint: keep '{name}' a dense (strided) tensor of the checkpoint's "
                    f"dtype and {_pack_hint(p)} in post-processing (process_weights_after_loading), or "
                    "pass make_checkpoint= (and load= for this tensor)"
                )
        if params:
            return
        buffers = [(n, b) for n, b in probe.named_buffers(remove_duplicate=True) if b.numel() > 0]
        if buffers:
            listed = ", ".join(f"'{n}' ({describe(b)})" for n, b in buffers[:4])
            odd = next(((n, b) for n, b in buffers if not is_dense(b)), None)
            hint = (
                f"; keep '{odd[0]}' dense, as a checkpoint holds it, and {_pack_hint(odd[1])} in post-processing"
                if odd is not None
                else ""
            )
            raise ReloadCheckError(
                f"check_reload: {self.name} has no non-empty parameters, only buffers ({listed}), and "
                "checkpoints are drawn from parameters: register the tensors the checkpoint holds as "
                f"torch.nn.Parameter, or pass make_checkpoint=lambda seed: {{name: tensor, ...}}{hint}"
            )

    # What the protocol calls.
    def info(self) -> Any:
        return _C.SubjectInfo(
            self.name,
            self.description,
            [_C.ReloadMode.normal if m == "normal" else _C.ReloadMode.direct for m in self.modes],
            self.expect_violation is not None,
            self.expect_violation or "",
            self.memory_tolerance_bytes,
        )

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
        return [
            _C.NamedNumber(n, float(v), isinstance(v, int))
            for n, v in named_numbers(layer)
            if n not in self.undeclared
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
                        f"check_reload: make_checkpoint({seed}) gave '{k}' as {_layout(v)}, but seed 0 gave "
                        f"{_layout(f) if f is not None else 'no such tensor'}: every checkpoint must have the "
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
                        f"is still on the meta device ({_layout(t)}, no data): build the layer's tensors on "
                        "a real device, or load every meta tensor from the checkpoint (its weight_loader "
                        "must give it memory, as reloadsafe.default_weight_loader does, before writing)"
                    )

    def layout_notes(self) -> list[str]:
        """Where a load leaves a parameter or buffer in another shape or dtype
        than the checkpoint tensor of its name (the first checkpoint, loaded
        into a new layer): a hint for a failure, never a refusal. An engine's
        loader may pad (a vocabulary), pack (bitsandbytes) or quantize
        (online FP8) in the load itself; what is judged is what the forward
        reads after it."""
        if self._layout_notes is None:
            self._layout_notes = []
            layer = self.new_layer()
            with torch.no_grad():
                self.load_fn(layer, self.first_checkpoint)
            for name, t in self.first_checkpoint.items():
                target = _parameter_or_buffer(layer, name)
                if target is not None and (target.shape != t.shape or target.dtype != t.dtype):
                    self._layout_notes.append(
                        f"after load, '{name}' is {_layout(target)} where the checkpoint has {_layout(t)}"
                    )
        return self._layout_notes

    def layout_hint(self) -> str:
        """``layout_notes`` as a sentence for an error or a failed report,
        or "" when every loaded tensor keeps the checkpoint's layout."""
        try:
            notes = self.layout_notes()
        except Exception:  # the hint is for a failure already reported; it adds no second one
            return ""
        if not notes:
            return ""
        listed = "; ".join(notes[:3]) + (f"; and {len(notes) - 3} more" if len(notes) > 3 else "")
        return (
            "Note: " + listed + " (a loader may pad, pack or quantize into its parameter; "
            "one that should not replaced the parameter with the checkpoint's tensor instead of "
            "loading into it)"
        )

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

    def preflight(self, device_clean: bool = False) -> None:
        """Cold load, forward, reload, forward once in plain Python, so a
        broken step is reported as an exception naming the step, not as a
        protocol error (and, where the layer mixes devices, the tensors that
        are not on the check's device). With ``device_clean`` the same steps
        run once more with torch's default device set to ``meta`` (Note
        [Device-clean layers])."""
        x = self.draw_input(0)
        layer = None
        step = "building the layer"
        try:
            layer = self.new_layer()
            step = "load or post-processing of a cold load"
            self.load_and_process(layer, self.first_checkpoint)
            layer.eval()  # as cold_loaded leaves it
            step = "forward"
            self.run_forward(layer, x)
            step = "load or post-processing of a reload"
            self.load_and_process(layer, self.draw_checkpoint(1))
            step = "forward after a reload"
            self.run_forward(layer, x)
            if device_clean:
                del layer
                layer = self.new_layer()
                self._device_clean(layer, x)
        except ReloadCheckError:
            raise
        except Exception as e:
            stray = self._stray(layer, self.device) if layer is not None else ""
            hint = self.layout_hint()
            raise ReloadCheckError(
                f"check_reload: {self.name}: the {step} raised {type(e).__name__}: {e}. "
                + (f"The layer mixes devices: {stray}. " if stray else "")
                + f"Fix that step of the layer, or the example input (shape {tuple(x.shape)}, "
                f"{x.dtype}), before checking reloads"
                + (f". {hint}" if hint else "")
            ) from e
        finally:
            del layer
            gc.collect()

    # Note [Device-clean layers]
    # A layer is device-clean when every tensor it makes in loading,
    # post-processing and forward is made on the device of the weights it is
    # given (device=w.device, torch.empty_like, w.new_zeros); one that calls
    # torch.zeros(16, 64) without a device works on a CPU and breaks on a GPU
    # ("Expected all tensors to be on the same device"). On a CPU machine the
    # probe runs the steps with torch's default device set to meta: a tensor
    # made without a device lands there, where the walk finds it by name (or
    # an op mixing it with the CPU weights raises), while every tensor made
    # from the weights stays on the CPU.
    #
    # Meta stands in for a GPU machine's CPU, and differs from it where a
    # correct layer can tell (_DefaultDeviceProbe does what the GPU machine
    # does instead):
    # - a 0-dim tensor made without a device: CUDA's elementwise ops read a
    #   0-dim CPU tensor as a number, so w * torch.tensor(0.5) runs on a GPU;
    #   one on meta beside CPU weights raises. It is made on the CPU, as on
    #   the GPU machine, and the walk does not name 0-dim tensors. A [1] or
    #   [64, 1] tensor is no number to CUDA and is still named. (A kernel
    #   that reads a 0-dim tensor's memory, a matmul's bias or a custom op's
    #   scale, still fails on a GPU with a CPU one; the probe does not see
    #   that.)
    # - torch.tensor / as_tensor / asarray of a tensor keep that tensor's
    #   device when no device is given and none is set: on the GPU machine
    #   torch.tensor(w) is on w's device, under the probe it would be meta.
    # - t.data = v between a tensor made without a device and one on the
    #   weights' device: set_data moves between CPU and CUDA tensors (both
    #   dense backends) but refuses meta. t takes v's data, as on a GPU (so
    #   nn.Linear(64, 32) built without a device, its weight's .data set to
    #   the loaded weight, is clean; a weight whose .data is set to a tensor
    #   made without a device lands on meta and is named).
    # - copying a tensor made without a device into one on the weights'
    #   device (dst.copy_(src), dst[:] = src) and moving one there
    #   (t.to(w.device), t.to(w)): CPU to CUDA copies are legal, but meta has
    #   no data to copy. The destination keeps its memory and its values; a
    #   moved tensor is made on the weights' device, zeroed: the probe judges
    #   where tensors are, not what they hold. A move to a device written as
    #   a string (t.to("cpu"), t.cpu()) is left to meta, which has nothing to
    #   copy (the probe cannot follow it, below): on a GPU it would leave the
    #   tensor on the CPU, not on the weights' device.
    # A step that reads the values of a tensor made without a device on the
    # host (t.item(), t.tolist()), or runs an op with no meta kernel on one,
    # still raises under the probe; the error says the probe cannot follow
    # it (_reads_meta_data), not that the layer is not device-clean.

    def _device_clean(self, layer: torch.nn.Module, x: torch.Tensor) -> None:
        probe = torch.device("meta") if self.device.type == "cpu" else torch.device("cpu")
        how = f"with torch's default device set to {probe.type} (a device-clean probe)"
        step = f"load or post-processing {how}"
        try:
            with _DefaultDeviceProbe(probe, self.device):
                self.load_and_process(layer, self.first_checkpoint, check_meta=False)
                self._check_devices(layer, step, probe)
                step = f"forward {how}"
                self._check_output(self.run_forward(layer, x), step, probe)
                self._check_devices(layer, step, probe)
        except ReloadCheckError:
            raise
        except Exception as e:
            stray = self._stray(layer, self.device)
            if _reads_meta_data(e):
                raise ReloadCheckError(
                    f"check_reload: {self.name}: the device-clean probe cannot follow the {step}: it "
                    f"raised {type(e).__name__}: {e}. The step reads the values of a tensor made without "
                    "a device, or runs an op with no meta kernel on it (on a GPU machine it is a CPU "
                    "tensor; under the probe a meta tensor, which has no data), so the probe cannot tell "
                    "whether the layer is device-clean. Make that tensor with device=w.device, or check "
                    "the layer without device_clean"
                ) from e
            raise ReloadCheckError(
                f"check_reload: {self.name} is not device-clean: the {step} raised {type(e).__name__}: {e}"
                + (f" ({stray})" if stray else "")
                + ". Make every tensor on the device of the weights it comes from (device=w.device, "
                "torch.empty_like(w), w.new_zeros(...)), never with torch's default device"
            ) from e

    def _stray(self, layer: torch.nn.Module, device: torch.device, on: bool = False, scalars: bool = True) -> str:
        """The non-empty tensors ``layer`` reaches that are not on
        ``device`` (with ``on``: that are on ``device``), named; without
        ``scalars``, 0-dim ones are left out."""
        found = []
        for n in named_tensors(layer):
            t = n.tensor
            if t.numel() > 0 and (scalars or t.dim() > 0) and (t.device.type == device.type) == on:
                found.append(f"'{n.name}' is on {t.device} ({_layout(t)})")
        return "; ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")

    def _check_devices(self, layer: torch.nn.Module, step: str, probe: torch.device) -> None:
        """No tensor of ``layer`` is on ``probe``, the default device of a
        device-clean probe: one that is was made without a device. A 0-dim
        one is not named: CUDA's elementwise ops read a 0-dim CPU tensor as
        a number (Note [Device-clean layers])."""
        stray = self._stray(layer, probe, on=True, scalars=False)
        if stray:
            raise ReloadCheckError(
                f"check_reload: {self.name} is not device-clean: after the {step}, {stray}, but the "
                f"weights are on {self.device}: make every tensor on the device of the weights it comes "
                "from (device=w.device, torch.empty_like(w), w.new_zeros(...)), never with torch's "
                "default device"
            )

    def _check_output(self, out: torch.Tensor, step: str, probe: torch.device) -> None:
        if out.device.type == probe.type:
            raise ReloadCheckError(
                f"check_reload: {self.name} is not device-clean: the {step} returned a tensor on "
                f"{out.device} ({_layout(out)}): the forward makes its output without a device; make "
                "it on the input's or the weights' device"
            )


#: Constructors that, given a tensor, keep its device when no device is given.
_FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray)
_SET_DATA = torch.Tensor.data.__set__

#: What torch raises where an op needs the data of a meta tensor, or has no
#: meta kernel: under the device-clean probe, a step that reads the values
#: of a tensor made without a device, or runs an op meta cannot run.
_META_HAS_NO_DATA = re.compile(
    r"cannot be called on meta tensors|Cannot copy out of meta tensor|can't convert meta device type tensor"
    r"|with Meta tensors, but there was no fake impl or Meta kernel|could not find the fake impl for this operator"
    r"|as a correct data-independent implementation does not exist"
    r"|with arguments from the '\w*Meta' backend"
)


def _leaves(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """``t``, or the tensors that hold its bytes (walk.tensor_parts), each
    taken apart the same way."""
    parts = tensor_parts(t)
    if parts is None:
        yield t
    else:
        for _, part in parts:
            yield from _leaves(part)


def _reads_meta_data(e: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if _META_HAS_NO_DATA.search(str(cur)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _plain(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not is_traceable_wrapper_subclass(x)


def _basic_index(index: Any) -> bool:
    """An index of ints, slices, ``...`` and ``None`` only: assigning
    through it copies into a view (copy_), whatever the value's device."""
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


class _DefaultDeviceProbe(DeviceContext):
    """torch's default device set to ``probe`` for a device-clean probe;
    where ``probe`` is meta (a CPU check), what a GPU machine does with a
    tensor made without a device (a CPU one there) where meta does
    otherwise: Note [Device-clean layers]."""

    def __init__(self, probe: torch.device, weights: torch.device) -> None:
        super().__init__(probe)
        self.weights = weights
        self.emulate = probe.type == "meta" and weights.type != "meta"

    def _on_weights(self, t: Any) -> bool:
        return _plain(t) and t.device.type == self.weights.type

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if not self.emulate:
            return super().__torch_function__(func, types, args, kwargs)
        if func in _device_constructors() and kwargs.get("device") is None:
            if func in _FROM_DATA and args and isinstance(args[0], torch.Tensor):
                return func(*args, **kwargs)  # on its data's device, as with no default device set
            kwargs.pop("device", None)
            out = func(*args, device=self.device, **kwargs)
            if isinstance(out, torch.Tensor) and out.dim() == 0 and "out" not in kwargs:
                out = func(*args, device=torch.device("cpu"), **kwargs)  # a number to CUDA's elementwise ops
            return out
        if func == _SET_DATA and len(args) == 2 and _plain(args[0]) and _plain(args[1]):
            t, v = args
            if t.is_meta != v.is_meta and self._on_weights(v if t.is_meta else t):
                # set_data between a GPU machine's CPU and CUDA; t takes v's data.
                alias = v.detach()
                if t.requires_grad and (alias.is_floating_point() or alias.is_complex()):
                    alias.requires_grad_(True)
                torch._C._swap_tensor_impl(t, alias)
                return None
        elif func is torch.Tensor.copy_ and len(args) >= 2 and self._on_weights(args[0]) and _plain(args[1]):
            if args[1].is_meta:
                return args[0]  # a legal copy into the weights' device; the values are not the probe's
        elif func is torch.Tensor.__setitem__ and len(args) == 3 and self._on_weights(args[0]):
            if _plain(args[2]) and args[2].is_meta and _basic_index(args[1]):
                return None  # the same copy, into a view
        elif func is torch.Tensor.to and args and _plain(args[0]) and args[0].is_meta:
            target = args[1] if len(args) > 1 else kwargs.get("device", kwargs.get("other"))
            if isinstance(target, torch.Tensor):
                target_device, dtype = target.device, target.dtype
            elif isinstance(target, torch.device):
                target_device = target
                given = [a for a in args[2:] if isinstance(a, torch.dtype)]
                dtype = kwargs.get("dtype", given[0] if given else args[0].dtype)
            else:
                target_device = None
            if target_device is not None and target_device.type == self.weights.type:
                return torch.zeros(args[0].shape, dtype=dtype, device=target_device)
        return func(*args, **kwargs)


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


def _parameter_or_buffer(layer: torch.nn.Module, name: str) -> torch.Tensor | None:
    try:
        return layer.get_parameter(name)
    except AttributeError:
        try:
            return layer.get_buffer(name)
        except AttributeError:
            return None


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


def _layout(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _pack_hint(t: torch.Tensor) -> str:
    """What to do in post-processing to get from a dense tensor to ``t``'s form."""
    if t.layout == torch._mkldnn:  # type: ignore[attr-defined, unused-ignore]  # torch's types do not export _mkldnn; unused without torch installed
        return "convert it (to_mkldnn, torch.utils.mkldnn) or pack it"
    if t.layout != torch.strided:
        return f"make it {str(t.layout).replace('torch.', '')}"
    return "quantize or pack it (torch.quantize_per_tensor, a prepack op)"


def _whole_number(name: str, value: Any, minimum: int, example: int) -> int:
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


def check_reload(
    layer: LayerOrFactory,
    example_input: torch.Tensor | Callable[[int], torch.Tensor],
    *,
    load: LoadFn | None = None,
    process: ProcessFn | None = None,
    forward: ForwardFn | None = None,
    make_checkpoint: Callable[[int], Mapping[str, torch.Tensor]] | None = None,
    reloads: int = _C.DEFAULT_RELOADS,
    modes: Sequence[str] = MODES,
    device: str | torch.device | None = None,
    seed: int = 1,
    name: str | None = None,
    undeclared: Iterable[str] = (),
    memory_tolerance_bytes: int = 0,
    expect_violation: str | None = None,
    trace: bool = True,
    device_clean: bool = False,
    compare_state: bool = False,
    compare_forward_state: bool = False,
    sleep: int | Callable[[torch.nn.Module], None] | None = None,
    module_caches: Caches | None = None,
    recreate_parameters: bool = False,
    host_numbers: bool = False,
    cold_footprint_tolerance_bytes: int | None = None,
    reload_peak_budget_bytes: int | None = None,
) -> ReloadReport:
    """Checks that reloading weights into a layer keeps every address a
    captured CUDA graph of its forward reads.

    ``layer`` is a function returning a fresh ``torch.nn.Module`` (preferred)
    or a module (deep-copied before its first load for the fresh cold loads).
    A checkpoint is loaded by ``load(layer, checkpoint)`` (default: through
    each parameter's ``weight_loader(param, tensor)``, or a copy in the
    checkpoint's layout); then ``process(layer)`` runs (default:
    ``process_weights_after_loading(layer)``: each module's
    ``quant_method.process_weights_after_loading(module)``, then
    ``layer.process_weights_after_loading()``, where they exist); the forward is
    ``forward(layer, x)`` (default: ``layer(x)``) on ``example_input`` (a
    tensor, or a function of a seed). Checkpoints come from
    ``make_checkpoint(seed)`` or are drawn from the fresh layer's parameters
    (same names and layouts, new values each time). After its cold load
    (load and post-processing) a layer is put in eval mode, as an engine's
    loader leaves it.

    For each mode in ``modes`` ("normal", "direct"): a cold load, one
    warm-up forward, then the forward traced (the captured read set: every
    op and every tensor it reads, as a CUDA graph would bake them in), and
    ``reloads`` reloads. After each reload:

    - every tensor reachable from the module (``named_tensors``: parameters,
      buffers, attributes, tensors in containers, partials, closures and plain
      objects, the inner tensors of a tensor subclass such as
      ``qweight.qdata``; empty ones and ``undeclared`` names excepted) kept
      its name, address, storage, storage size and layout;
    - the traced forward issues the captured op sequence and every external
      read is at the captured address, storage and layout (tensors the module
      does not reach, such as one held in a kernel object outside it, are
      named "undeclared tensor"), and every opaque object an op reads (a
      packed weight, named by ``named_objects`` where the module reaches it)
      is the captured object;
    - replaying the captured ops, and the live forward, equal the forward of
      a fresh cold load of the same checkpoint;
    - the checkpoint, the input and a canary are unchanged;
    - live tensor memory does not grow after the first reload (beyond
      ``memory_tolerance_bytes``), and, with ``cold_footprint_tolerance_bytes``,
      after no reload exceeds the cold load's by more than that (an extra
      copy kept from the first reload on), and, with
      ``reload_peak_budget_bytes``, never held more than that above the
      bytes live before the reload while it loaded and post-processed (a
      second copy of the weights staged before the first is freed);
    - with ``compare_state``: every tensor and host number (``int``,
      ``float``) the module reaches holds what a cold load of the same
      checkpoint holds, by name (reloadsafe/state.py); one that does not is
      a violation named by it, "not idempotent" where loading the same
      checkpoint twice already changes it, else "differs from a cold load"
      (a stale derived tensor, a host number a graph bakes in, padding left
      from an earlier pass). State the forward makes is not compared.

    ``compare_forward_state``: the same comparison right after every
    reload's forward, against a cold load that ran one forward on the same
    input, so state the first forward makes (a tile schedule, a workspace
    a kernel fills once) and that a sleep discarded is named. For layers
    whose forward state does not depend on how many forwards ran.

    ``sleep`` (1 or 2) puts the layer to sleep and wakes it before every
    reload, as an engine's sleep mode does between RL steps
    (reloadsafe/sleep.py): every storage the layer reaches is discarded in
    place (floats NaN, integers 0), then wake restores the registered
    buffers (level 2; level 1 everything the cold load made, so only what a
    forward made since is lost) from a host copy, and the
    reload loads and post-processes. ``sleep`` may instead be a function
    ``(layer) -> None`` that is the engine's own sleep and wake (a memory
    saver that keeps host copies), run in place of the emulation before
    every reload: on a CPU check the memory it keeps is counted with the
    layer's, so a helper that keeps one more host copy per cycle (torch
    memory saver #71) fails the growth check. ``module_caches`` (``{"name": dict}``)
    are module-level caches post-processing reads: slept with the layer,
    compared by name under ``compare_state``, and emptied for every cold
    load made aside.

    ``recreate_parameters`` reloads the way layerwise reload does (vLLM's
    ``reload_weights``): before each reload's load every parameter's storage
    is filled with a sentinel (NaN, integers -1), as memory re-created
    uninitialised would hold, so padding or any element the loader does not
    write, and that only construction zeroed, shows.

    ``host_numbers``: every ``int`` and ``float`` the module reaches (an
    attribute, a kernel object's field) keeps the value it had when the
    forward was captured; a reload that changes one is a violation named by
    its attribute ("host number changed since the capture"): a CUDA graph
    bakes such a number into its launch (reloadsafe/state.py).

    ``compare_state``, ``compare_forward_state``, ``sleep``,
    ``recreate_parameters``, ``host_numbers``, ``cold_footprint_tolerance_bytes``
    and ``reload_peak_budget_bytes`` are steps of the C++ protocol
    (``ReloadSteps`` in conformance/harness/run_options.h), which a C++
    backend takes with ``reload_harness --sleep 2`` and the like.

    Returns a ``ReloadReport``; ``report.ok`` is the verdict and
    ``report.table()`` names every violation. ``expect_violation`` marks a
    negative control: the report is ok when that tensor name or read (op
    name prefix, "memory", "op sequence") is flagged.

    A layer built on the meta device is checked as an engine loads it: its
    meta tensors get memory (on ``device``) when the checkpoint is loaded
    into them; one still on meta after loading is an error.

    When a step raises and the layer mixes devices, the error names the
    tensors that are not on ``device``, with the step. ``device_clean``
    also runs load, post-processing and forward once with torch's default
    device set to ``meta`` (on a CPU check), so a layer that would break on a
    GPU because it makes a tensor without a device is named on a CPU. What
    a GPU takes beside its weights passes (Note [Device-clean layers]): a
    0-dim tensor made without a device (CUDA's elementwise ops read a 0-dim
    CPU tensor as a number; a [1] or [64, 1] one is still named), ``t.data =
    w`` for a ``t`` made without a device (a ``torch.nn.Linear`` built
    without one and given the loaded weight), copying or moving a tensor made
    without a device into the weights' device (``copy_``, ``t[:] = ...``,
    ``t.to(w.device)``), and ``torch.as_tensor(w)``. A 0-dim tensor that a
    kernel reads from memory (a matmul's bias, a custom op's scale) fails on
    a GPU and is not named. A step that reads a value of a tensor made
    without a device (``t.item()``), or runs an op with no meta kernel on
    one, raises ``ReloadCheckError`` saying the probe cannot follow it.

    Bad input (not a module, a module that cannot be deep-copied, a forward
    or load that raises, a layer without parameters, a parameter that is not
    dense (mkldnn, sparse, quantized) with no ``make_checkpoint``, a tensor
    left on the meta device, ``reloads``/``seed`` that are not whole numbers)
    raises ``ReloadCheckError`` naming what to fix. A load may leave a
    parameter in another layout than the checkpoint's (padded, packed,
    quantized in the loader): what the forward reads is judged, and a failed
    check notes each such layout.

    Real code (docs/real-code.md): what torch.compile does while compiling
    is left out of the trace; with no ``process``, vLLM's
    ``quant_method.process_weights_after_loading(module)`` runs for every
    module that has one, then the layer's own hook; a forward whose ops
    follow the weights (an MoE loop over the experts that got tokens) and
    memory that the layers the check builds aside keep alive are warnings.

    On CUDA (``device="cuda"``) the protocol runs on the device, and its
    graph step captures the forward as a CUDA graph once and replays it right
    after every reload, with the graph's output poisoned and every device
    block freed since the capture zeroed first; a replay that differs from a fresh cold
    load is the violation ``cuda graph replay`` (the same C++ protocol as
    ``reload_harness --device cuda``).
    """
    reloads = _whole_number("reloads", reloads, 1, example=10)
    seed = _whole_number("seed", seed, 0, example=1)
    try:
        dev = torch.device(device) if device is not None else torch.device("cpu")
    except (RuntimeError, TypeError) as e:
        raise ReloadCheckError(
            f"check_reload: device={device!r} is not a device ({e}): pass 'cpu', 'cuda' or a torch.device"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ReloadCheckError("check_reload: device='cuda' but torch.cuda.is_available() is False")
    if dev.type == "cuda" and _C.cuda_unavailable_reason():
        raise ReloadCheckError(f"check_reload: device='cuda', but {_C.cuda_unavailable_reason()}")
    with _collections_see_only_the_check():
        subject = _LayerSubject(
            layer, example_input, load, process, forward, make_checkpoint, modes, dev, name, undeclared,
            expect_violation, memory_tolerance_bytes,
        )
        subject.module_caches = dict(module_caches or {})
        options = _C.RunOptions()
        options.reloads = int(reloads)
        options.device = dev
        options.seed = int(seed)
        options.trace = bool(trace)
        steps = _C.ReloadSteps()
        if callable(sleep):
            subject.own_sleep = sleep
            steps.sleep_level = max(LEVELS)  # the step runs; the subject's own sleep takes it
        elif sleep is not None:
            if isinstance(sleep, bool) or sleep not in LEVELS:
                raise ReloadCheckError(
                    f"check_reload: sleep must be one of {LEVELS}, a function (layer) -> None that is the "
                    f"engine's own sleep and wake, or None; got {sleep!r}")
            steps.sleep_level = int(sleep)
        steps.recreate_parameters = bool(recreate_parameters)
        steps.host_numbers = bool(host_numbers)
        steps.compare_state = bool(compare_state)
        steps.compare_forward_state = bool(compare_forward_state)
        if cold_footprint_tolerance_bytes is not None:
            steps.cold_footprint_tolerance_bytes = _whole_number(
                "cold_footprint_tolerance_bytes", cold_footprint_tolerance_bytes, 0, example=4096)
        if reload_peak_budget_bytes is not None:
            steps.reload_peak_budget_bytes = _whole_number(
                "reload_peak_budget_bytes", reload_peak_budget_bytes, 0, example=1 << 20)
        options.steps = steps
        watch_compilations()  # torch.compile's compilations are not the forward's work
        subject.preflight(device_clean=device_clean)
        report = _C.run_subject(subject, options)
        hint = "" if report.ok() else subject.layout_hint()
    return ReloadReport(report, options, f"  {hint}" if hint else "")


@contextlib.contextmanager
def _collections_see_only_the_check() -> Iterator[None]:
    """Every reload ends with ``gc.collect()`` (storages that only reference
    cycles keep are freed before memory is counted). A full collection walks
    every object of the process, hundreds of thousands with torch and a
    quantization library imported, and was 90% of a check's time. The
    storages a check frees were made during the check, by objects made during
    it, so what existed before is frozen (``gc.freeze``) while the check runs
    and each collection walks only what the check made. Where the caller has
    frozen objects of its own, nothing is frozen (unfreezing at the end would
    unfreeze theirs too): the check is then slower, never different."""
    freeze = gc.get_freeze_count() == 0
    if freeze:
        # No full collection first: it alone cost 0.18-0.5 s per check (with
        # torch imported), as much as a check of a small layer. Garbage the
        # caller left is frozen with the rest and collected after the check
        # instead of before it; the census counts none of it (it was
        # allocated before the check's census scope).
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()
