"""check_reload: the reload protocol of the C++ harness, on a Python layer.

A Python layer (a ``torch.nn.Module``, its load function, its
post-processing and its forward) is adapted to the C++ ``ReloadSubject``
(layer_subject.py) and run through the very protocol the C++ backends go
through: cold load, a traced forward (the captured read set), many reloads
of value-changing checkpoints in the normal and the direct-reload mode, and
after each reload the checks a captured CUDA graph relies on. See
``check_reload`` for the list.
"""
from __future__ import annotations

import contextlib
import gc
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from . import device_clean as _device_clean
from ._loader import _C
from .compiler import first_calls_as_later_ones, watch_compilations
from .errors import ReloadCheckError
from .host_reads import noting_host_reads
from .layer_subject import (
    MODES,
    ForwardFn,
    LayerOrFactory,
    LayerSubject,
    LoadFn,
    ProcessFn,
    whole_number,
)
from .report import ReloadReport
from .sleep import Caches
from .steps import reload_steps, step_parameters, steps_doc

__all__ = ["check_reload", "ReloadReport", "MODES"]


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
    module_caches: Caches | None = None,
    allow_constant_output: bool = False,
    **steps: Any,
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

    In each mode, "normal" and "direct" (``modes`` names those the layer
    claims; the verdict counts only them, and a mode not claimed ends at its
    first reload with a violation): a cold load, one
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
      ``memory_tolerance_bytes``).

    The harness steps (listed below, from the C++ step table) add to that:
    what an engine does between reloads (a sleep, re-created parameters),
    checks that name the culprit (``compare_state``: every tensor and host
    number against a cold load's of the same checkpoint, by name;
    ``host_numbers``: every number against its captured value) and memory
    bounds. ``module_caches`` (``{"name": dict}``) are module-level caches
    post-processing reads: slept with the layer, compared by name under
    ``compare_state``, and emptied for every cold load made aside.

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

    A check that would test nothing is refused: two different checkpoints
    must give two different outputs of the forward (a module instance whose
    closures hold its own tensors reads the instance's never-loaded tensors
    in every copy the check makes: pass a factory); pass
    ``allow_constant_output=True`` for a layer whose output truly ignores
    its weights for the example input. A reload that raises once the cold
    load and its forward ran (its load or post-processing, a sleep before
    it, the forward after it) is the violation ``reload``, with the step and
    what it raised.

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
    arguments = dict(locals())  # for the look at a value failure's culprit, below
    arguments["steps"] = dict(steps)
    reloads = whole_number("reloads", reloads, 1, example=10)
    seed = whole_number("seed", seed, 0, example=1)
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
        subject = LayerSubject(
            layer, example_input, load, process, forward, make_checkpoint, modes, dev, name, undeclared,
            expect_violation, memory_tolerance_bytes, allow_constant_output,
        )
        subject.module_caches = dict(module_caches or {})
        options = _C.RunOptions()
        options.reloads = int(reloads)
        options.device = dev
        options.seed = int(seed)
        options.trace = bool(trace)
        options.steps, own_sleep = reload_steps(steps)
        if own_sleep is not None:
            subject.own_sleep = own_sleep
        watch_compilations()  # torch.compile's compilations are not the forward's work
        # A forward's tolist() is a read of values; a graph's first call runs as its later ones.
        with noting_host_reads(), first_calls_as_later_ones():
            report = _C.run_subject(subject, options)
        _raise_for_a_cold_load_that_failed(subject, report)
        if device_clean:
            _device_clean.probe(subject, subject.build_layer(), subject.draw_input(0))
        layout = "" if report.ok() else subject.layout_hint()
    result = ReloadReport(report, options, [layout] if layout else [])
    culprit = _name_the_culprit(result, arguments)
    if culprit:
        result.notes.append(culprit)
    if not result.ok:
        from .glossary import kinds_in  # a failure's reader only

        kinds = kinds_in(result)
        if kinds:
            result.notes.append("What these mean and how to fix them: docs/violations.md ("
                                + ", ".join(f"#{k.anchor}" for k in kinds) + ")")
    return result


# The step keywords come from the C++ step table (steps.py): the signature
# and the docstring show each, as if written out.
check_reload.__signature__ = inspect.signature(check_reload).replace(  # type: ignore[attr-defined]
    parameters=[p for p in inspect.signature(check_reload).parameters.values()
                if p.kind is not inspect.Parameter.VAR_KEYWORD] + step_parameters())
# The docstring is cleaned first: Python 3.13 strips its indentation at
# compile time and 3.10-3.12 do not, so indenting the steps to match would
# give two texts.
check_reload.__doc__ = inspect.cleandoc(check_reload.__doc__ or "") + "\n\n" + steps_doc() + "\n"


def _raise_for_a_cold_load_that_failed(subject: LayerSubject, report: Any) -> None:
    """Bad input is raised, not reported: when the first mode's cold load
    (drawing its input and checkpoint, the load and post-processing, the
    forward, the capture) failed before any reload, the layer or the input
    is what to fix (Note [The cold load a run starts from] in
    conformance/harness/cold_start.h). A ReloadCheckError a step of the layer
    raised is raised as it is (it says what to fix); any other failure as a
    ReloadCheckError with the protocol's message, which names the step and
    the seeds, and what the layer held off the check's device."""
    first = report.modes[0]
    if not first.error or first.reloads_done > 0:
        return
    raised = subject.raised
    if isinstance(raised, ReloadCheckError):
        raise raised
    message = f"check_reload: {subject.name}: {first.error.splitlines()[0]}"
    if raised is not None:  # a step of the layer raised: say what to look at
        if subject.raised_stray:
            message += f". The layer mixes devices: {subject.raised_stray}"
        x = subject.example_input
        shape = f" (shape {tuple(x.shape)}, {x.dtype})" if isinstance(x, torch.Tensor) else ""
        message += f". Fix that step of the layer, or the example input{shape}, before checking reloads"
        hint = subject.layout_hint()  # loads a layer: only where the layer's own step failed
        if hint:
            message += f". {hint}"
    raise ReloadCheckError(message) from raised


#: The violations that say values differ, and name no tensor or number.
_VALUES_ONLY = frozenset({"forward", "replay", "cuda graph replay"})


def _name_the_culprit(report: ReloadReport, arguments: dict[str, Any]) -> str:
    """Note [Naming a value failure's culprit]: a check that fails only on
    values (the forward or a replay differs from a cold load) names no
    tensor. The usual culprits (a number the post-processing computes into
    a Python float, a derived tensor a reload does not refresh) are what
    ``host_numbers`` and ``compare_state`` name, so the check runs again
    with both, a few reloads, and says what they named, or that they named
    nothing."""
    flagged = set(report.flagged)
    if report.ok or report.errors or arguments["expect_violation"] is not None:
        return ""
    if not flagged or not flagged <= _VALUES_ONLY:
        return ""
    steps = arguments["steps"]
    if steps.get("compare_state") and steps.get("host_numbers"):
        return ""
    again_arguments = {k: v for k, v in arguments.items() if k != "steps"}
    again_arguments.update(steps, compare_state=True, host_numbers=True,
                           reloads=min(int(arguments["reloads"]), 4))
    try:
        again = check_reload(**again_arguments)
    except Exception:  # noqa: BLE001 - the note adds to a failure already reported
        return ""
    named: dict[str, str] = {}
    for mode in again.modes.values():
        for v in mode["violations"]:
            if v["tensor"] not in _VALUES_ONLY:
                named.setdefault(v["tensor"], v["what"])
    if not named:
        return ("host_numbers=True and compare_state=True name nothing more: what the forward reads "
                "stale is no tensor or number the layer reaches (a pointer a kernel kept, another "
                "thread's work)")
    listed = "; ".join(f"'{n}' ({what})" for n, what in list(named.items())[:5])
    more = f"; and {len(named) - 5} more" if len(named) > 5 else ""
    return (f"The values differ, and host_numbers=True, compare_state=True name why: {listed}{more}. "
            "Pass them to check_reload to have these in the report")


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
