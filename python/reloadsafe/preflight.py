"""The first steps of ``check_reload`` in plain Python, before the protocol
runs: a broken step is reported naming the step, not as a protocol error."""
from __future__ import annotations

import gc
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from .device_clean import probe as device_clean_probe
from .device_clean import stray
from .errors import ReloadCheckError
from .walk import named_numbers

if TYPE_CHECKING:
    from .layer_subject import LayerSubject

__all__ = ["preflight"]


def preflight(subject: LayerSubject, device_clean: bool = False, numbers: bool = False) -> None:
    """Cold load and forward once in plain Python, so a broken step is
    reported as an exception naming the step, not as a protocol error (and,
    where the layer mixes devices, the tensors that are not on the check's
    device). A reload that raises once these ran is the reload's bug, which
    the protocol reports as a violation (Note [A reload that raises] in
    conformance/harness/protocol.cc). With ``device_clean`` the same steps
    run once more with torch's default device set to ``meta`` (Note
    [Device-clean layers])."""
    x = subject.draw_input(0)
    layer = None
    step = "building the layer"
    try:
        layer = subject.build_layer()
        step = "load or post-processing of a cold load"
        subject.load_and_process(layer, subject.first_checkpoint)
        layer.eval()  # as LayerHandle leaves it after its first load
        step = "forward"
        out = subject.run_forward(layer, x)
        step = "drawing checkpoint 1"
        second = subject.draw_checkpoint(1)
        step = "load or post-processing of a cold load of checkpoint 1"
        other = subject.build_layer()
        subject.load_and_process(other, second)
        other.eval()
        step = "forward of the cold load of checkpoint 1"
        _refuse_a_vacuous_check(subject, type(other).__name__, subject.first_checkpoint, second, out,
                                subject.run_forward(other, x))
        del other
        if numbers:
            step = "a second cold load of checkpoint 0"
            twin = subject.build_layer()
            subject.load_and_process(twin, subject.first_checkpoint)
            subject.volatile = _volatile_numbers(layer, twin)
            del twin
        if device_clean:
            del layer
            layer = subject.build_layer()
            device_clean_probe(subject, layer, x)
    except ReloadCheckError:
        raise
    except Exception as e:
        mixed = stray(layer, subject.device) if layer is not None else ""
        hint = subject.layout_hint()
        raise ReloadCheckError(
            f"check_reload: {subject.name}: the {step} raised {type(e).__name__}: {e}. "
            + (f"The layer mixes devices: {mixed}. " if mixed else "")
            + f"Fix that step of the layer, or the example input (shape {tuple(x.shape)}, "
            f"{x.dtype}), before checking reloads"
            + (f". {hint}" if hint else "")
        ) from e
    finally:
        del layer
        gc.collect()


def _refuse_a_vacuous_check(subject: LayerSubject, kind: str, first: Mapping[str, torch.Tensor],
                            second: Mapping[str, torch.Tensor], out: torch.Tensor, other: torch.Tensor) -> None:
    """Note [A check that tests nothing]: two different checkpoints must give
    two different outputs, or no reload can show a stale read. A module
    instance whose functions or closures hold its own tensors is the usual
    cause: deepcopy shares functions, so every copy the check makes reads
    the instance's never-loaded tensors."""
    if subject.allow_constant_output or all(torch.equal(first[k], second[k]) for k in first):
        return  # told to, or the same weights (a same-weights reload is a check of its own)
    if out.shape == other.shape and out.dtype == other.dtype and torch.equal(out, other):
        raise ReloadCheckError(
            f"check_reload: {subject.name}: the forward gives the same output (shape {tuple(out.shape)}) "
            "for two different checkpoints (seeds 0 and 1), so no reload can show a stale read: the "
            "forward does not read what the load writes. A module instance whose functions or closures "
            "hold its own tensors is the usual cause: deepcopy shares functions, so each copy the check "
            "makes reads the instance's tensors, never loaded; pass a factory that builds the layer "
            f"(check_reload(lambda: {kind}(...), ...)). For a layer whose output "
            "truly does not depend on its weights for this input, pass allow_constant_output=True"
        )


def _volatile_numbers(a: torch.nn.Module, b: torch.nn.Module) -> frozenset[str]:
    """Note [Numbers that no load decides]: the host numbers that two cold
    loads of the same checkpoint leave at other values (a timing, a count
    kept across layers): no function of the weights, so neither a cold load
    nor the capture says what they should hold, and host_numbers and
    compare_state leave them out."""
    def values(layer: torch.nn.Module) -> dict[str, float]:
        return {n: float(v) for n, v in named_numbers(layer)}

    first, second = values(a), values(b)
    return frozenset(n for n, v in first.items()
                     if n in second and v != second[n] and not (math.isnan(v) and math.isnan(second[n])))
