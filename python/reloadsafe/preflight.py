"""The first steps of ``check_reload`` in plain Python, before the protocol
runs: a broken step is reported naming the step, not as a protocol error."""
from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from .device_clean import probe as device_clean_probe
from .device_clean import stray
from .errors import ReloadCheckError

if TYPE_CHECKING:
    from .layer_subject import LayerSubject

__all__ = ["preflight"]


def preflight(subject: LayerSubject, device_clean: bool = False) -> None:
    """Cold load, forward, reload, forward once in plain Python, so a
    broken step is reported as an exception naming the step, not as a
    protocol error (and, where the layer mixes devices, the tensors that
    are not on the check's device). With ``device_clean`` the same steps
    run once more with torch's default device set to ``meta`` (Note
    [Device-clean layers])."""
    x = subject.draw_input(0)
    layer = None
    step = "building the layer"
    try:
        layer = subject.new_layer()
        step = "load or post-processing of a cold load"
        subject.load_and_process(layer, subject.first_checkpoint)
        layer.eval()  # as cold_loaded leaves it
        step = "forward"
        subject.run_forward(layer, x)
        step = "load or post-processing of a reload"
        subject.load_and_process(layer, subject.draw_checkpoint(1))
        step = "forward after a reload"
        subject.run_forward(layer, x)
        if device_clean:
            del layer
            layer = subject.new_layer()
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
