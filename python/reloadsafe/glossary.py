"""The glossary of what a check reports: every violation and warning kind,
what it means, the usual cause in an engine (a row of the bug zoo,
docs/bug-zoo.md, as the example), how to fix it, and what names it.

docs/violations.md is generated from ``KINDS`` (``python -m
reloadsafe.glossary docs/violations.md``; python/tests/test_glossary.py
fails when the committed page is stale), and ``kinds_in(report)`` tells a
report's reader which entries apply.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["KINDS", "Kind", "kinds_in", "page"]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of violation or warning, as a report shows it."""

    anchor: str  #: the page's anchor: ``docs/violations.md#<anchor>``
    title: str  #: how the report words it
    warning: bool  #: a warning (the verdict holds) rather than a violation
    means: str
    cause: str  #: the usual cause in an engine, with a zoo row
    fix: str
    named_by: str  #: the check (or option) that reports it
    #: what in a violation's "<tensor>: <what>" (or a warning's message)
    #: shows this kind
    marks: tuple[str, ...]


KINDS: tuple[Kind, ...] = (
    Kind("address", "address, storage: a tensor moved", False,
         "A tensor the layer reaches (or the forward reads) is at another data pointer, or on another "
         "storage, than when the forward was captured: a CUDA graph still reads the old address.",
         "Post-processing binds a new tensor instead of refilling the old one: a repack, a transpose, "
         "a `.contiguous()`, a kernel object built anew (Z01, Z11, Z21).",
         "Write the new values into the tensor the graph captured: `old.copy_(new)` where shapes agree, "
         "`reloadsafe.in_own_storage(old, new)` to place a repacked layout in the old bytes, or keep the "
         "kernel object and refill its tensors.",
         "every check", ("address", "storage")),
    Kind("storage-resized", "storage resized or moved", False,
         "The same storage object holds its bytes elsewhere or in another size: a resize moved it.",
         "`resize_`, `set_` or a storage swap on a tensor the graph reads.",
         "Never grow or shrink a storage a graph reads; place new layouts inside it "
         "(`reloadsafe.in_own_storage`).", "every check", ("storage resized or moved",)),
    Kind("layout", "layout", False,
         "Same bytes, another shape, stride, offset or dtype: the graph reads them as the captured "
         "layout.",
         "A loader writing the checkpoint's layout into a parameter post-processing left transposed "
         "(vLLM 0.33's compressed-tensors W8A8 FP8 loaders; Z35).",
         "Keep the captured layout after every reload: load into a checkpoint-layout view and repack "
         "into the kernel layout in place.", "every check", ("layout",)),
    Kind("missing", "missing, new declared tensor", False,
         "A tensor the layer held at capture is gone, or a new one appeared.",
         "Post-processing deletes a source or creates state lazily (Z07, Z08, Z13).",
         "Keep every tensor the forward reads for the layer's life; create state at the first load, "
         "not later.", "every check", ("missing", "new declared tensor")),
    Kind("made-inside", "now made inside the forward", False,
         "The capture read this tensor from outside the forward; now the forward makes it.",
         "A reload drops a cached tensor that the forward then rebuilds on every call.",
         "Rebuild derived tensors in post-processing, in place.", "the read trace",
         ("now made inside the forward",)),
    Kind("object", "object replaced, object re-made in place", False,
         "An opaque kernel object (a TorchBind packed weight) the forward hands an op is another one, or "
         "its C++ instance changed.",
         "Post-processing packs the weights into a new object on every reload (fbgemm's prepack; Z01).",
         "Keep the object and refill what it holds, or keep a packed projection fixed.",
         "the read trace", ("object replaced", "object re-made in place")),
    Kind("op-sequence", "op sequence", False,
         "The forward after a reload runs other ops than the captured forward: a graph replays the "
         "captured ones.",
         "A reload drops a derived tensor that the forward rebuilds lazily (Z35).",
         "Keep derived tensors across reloads and refill them in post-processing.", "the read trace",
         ("op sequence:",)),
    Kind("forward", "forward differs from a cold load", False,
         "The live layer's forward after the reload differs from a fresh layer loaded with the same "
         "checkpoint.",
         "Post-processing that skips reloads, or reads what an earlier load left (Z13, Z18).",
         "Make post-processing a function of the checkpoint alone; `compare_state=True` names the "
         "tensor that differs.", "every check", ("differs from a cold load of the same checkpoint",)),
    Kind("replay", "replay differs from a cold load", False,
         "The captured ops, replayed on the captured addresses (as a graph replays), compute another "
         "output than a fresh cold load: some read is stale.",
         "A number computed in post-processing and handed to an op as a Python float (Z37), a tensor "
         "read through a copy kept outside the layer.",
         "Keep such numbers in tensors refilled in place; `host_numbers=True` names the number.",
         "the read trace", ("the captured ops, replayed",)),
    Kind("cuda-graph", "cuda graph replay", False,
         "On a GPU, the forward captured as a CUDA graph and replayed after the reload differs from a "
         "cold load.", "Any of the above that the trace cannot see (a raw kernel launch).",
         "As for the kind the CPU check names, or keep every pointer a kernel holds refilled.",
         "`device=\"cuda\"`", ("the captured graph, replayed",)),
    Kind("memory", "memory", False,
         "Live tensor memory grew over the reloads, or a reload exceeded the cold load's footprint or "
         "its peak budget.",
         "A staging copy or a history kept per reload (Z34, Z38).",
         "Free or reuse what each reload makes; keep one staging buffer for the layer's life.",
         "every check (growth); `cold_footprint_tolerance_bytes`, `reload_peak_budget_bytes`",
         ("grew by", "footprint after reload", "peak")),
    Kind("host-number", "host number changed since the capture", False,
         "An `int` or `float` the layer reaches changed since the capture: a graph bakes the old value "
         "into its launches.", "A scale kept as a Python float (Z37).",
         "Keep the value in a tensor refilled in place.", "`host_numbers=True`",
         ("host number changed since the capture",)),
    Kind("state", "differs from a cold load, not idempotent", False,
         "A tensor or number the layer reaches holds another value than a cold load of the same "
         "checkpoint; \"not idempotent\" where loading the checkpoint twice already changes it.",
         "Padding only construction zeroed (Z09), a scale compounded on every load (Z31), state a "
         "sleep discarded (Z18, Z19).",
         "Derive every tensor from the checkpoint alone, on every load.",
         "`compare_state=True`, `compare_forward_state=True`",
         ("differs from a cold load of the same checkpoint", "not idempotent",
          "after the forward, differs from a cold load")),
    Kind("reload", "reload raised", False,
         "A step of the reload (its load or post-processing, a sleep before it, the forward after it) "
         "raised where the cold load did not: the layer cannot be reloaded in place.",
         "Post-processing that deletes its sources (Z28) or leaves a layout its loader cannot write "
         "(Z36); vLLM 0.33's layerwise reload of the W4A8 int layer.",
         "Keep every parameter the loaders write in the checkpoint's layout; repack into separate "
         "tensors.", "every check", ("raised where the cold load did not",)),
    Kind("written", "checkpoint, input or canary: bytes changed", False,
         "The load wrote into the checkpoint, the forward into its input, or something into memory "
         "that is nobody's.", "A loader that converts the checkpoint in place; an in-place op on the "
         "input.", "Copy before converting; never write the input.", "every check", ("bytes changed",)),
    Kind("undeclared", "read but not declared", True,
         "The forward reads a tensor the layer does not reach (or a C++ backend does not declare); it "
         "is checked like a declared one. A compiled graph's constants (Python data copied by "
         "lift_fresh_copy) are checked the same way and not reported.",
         "A tensor held by a kernel object outside the layer (Z02).",
         "Reach it from the layer (an attribute), or declare it.", "the read trace", ("read but not declared",)),
    Kind("not-replayed", "not replayed", True,
         "The captured ops cannot be replayed (an op draws random numbers; code outside the dispatcher "
         "made a tensor, as Inductor's kernels do, or filled one an `empty()` made, as a kernel called "
         "through its own binding does); the live forward is still compared.",
         "torch.compile with Inductor; dropout in training mode.",
         "Nothing to fix in the layer; check a compiled forward with `backend=\"aot_eager\"` to trace "
         "every op (docs/real-code.md).", "the read trace", ("not replayed",)),
    Kind("ops-follow-weights", "ops follow the weights' values", True,
         "The forward's ops, the numbers it hands them or where in a weight they read depend on the "
         "values it computes and reads on the host (an MoE loop over the experts that got tokens, split "
         "sizes from `tolist()`, an expert's slice of a fused weight); a cold load makes the same calls. "
         "No graph can capture such a forward as one.",
         "Hugging Face's eager MoE layers (the values read with `.item()`, `nonzero` or `tolist()`).",
         "Nothing to fix for the reload.", "the read trace",
         ("ops follow the weights' values",)),
    Kind("forward-state", "made by every forward", True,
         "The forward binds a name to a tensor its own ops make at every call (state a prefill starts "
         "afresh); a graph keeps such tensors in its own memory, so the name's address is not checked. "
         "What the forward reads of it is: state carried over from the previous call is a read from "
         "outside, and flagged where it moves.",
         "Hugging Face's Recurrent Gemma (its recurrent and convolution state).",
         "Nothing to fix for the reload; a decode step that carries state should write it in place.",
         "the read trace", ("made by every forward",)),
    Kind("built-aside", "layers built aside keep memory", True,
         "The layers the check builds aside (cold loads) stay alive: the factory or a library keeps "
         "every layer it builds. Not counted as the reloads' growth.",
         "vLLM's layerwise-reload metadata keeping online-quantized layers alive.",
         "Nothing to fix for the reload; a leak of the factory's.", "every check",
         ("layers built aside",)),
)


def kinds_in(report: Any) -> list[Kind]:
    """The kinds a ``ReloadReport``'s violations and warnings show, each
    once, in the glossary's order."""
    texts: list[str] = []
    for mode in report.modes.values():
        texts += [f"{v['tensor']}: {v['what']}" for v in mode["violations"]]
        texts += [w["message"] for w in mode["warnings"]]
    return [k for k in KINDS if any(mark in t for t in texts for mark in k.marks)]


def page() -> str:
    """docs/violations.md."""
    out = [
        "# What a check reports",
        "",
        "<!-- Generated by `python -m reloadsafe.glossary docs/violations.md` from",
        "python/reloadsafe/glossary.py; python/tests/test_glossary.py fails when it is stale. -->",
        "",
        "Every kind of violation (the verdict fails) and warning (it holds) that `check_reload` and",
        "`reload_harness` report: what it means, the usual cause in an engine (with a row of",
        "[the bug zoo](bug-zoo.md) as the example), how to fix it, and what reports it. A failed",
        "report's table ends with the entries that apply.",
        "",
    ]
    for kind in KINDS:
        out += [f'<a id="{kind.anchor}"></a>', "",
                f"## {kind.title}{' (warning)' if kind.warning else ''}", "",
                f"- **Means:** {kind.means}",
                f"- **Usual cause:** {kind.cause}",
                f"- **Fix:** {kind.fix}",
                f"- **Reported by:** {kind.named_by}", ""]
    return "\n".join(out)


def _main(argv: Iterable[str]) -> int:
    args = list(argv)
    if len(args) != 1:
        print("usage: python -m reloadsafe.glossary OUT.md", file=sys.stderr)
        return 2
    with open(args[0], "w") as f:
        f.write(page())
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
