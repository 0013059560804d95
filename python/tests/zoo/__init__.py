"""The bug zoo: reload bugs that shipped in inference engines, re-created as
pairs of plain-torch layers that run on a CPU.

Each ``Bug`` is one row of the research catalogue (``Z01`` .. ``Z38``): the
layer as it shipped (``buggy``) and as its fix left it (``fixed``), the
upstream thread, the mechanism class, and ``names``, the tensors or
attributes the upstream fix named. ``check_reload`` on the buggy layer must
flag every one of those names; on the fixed layer it must pass.

The layers are written from the catalogue's descriptions of each thread, in
this project's words; none imports an engine. They are device-clean: every
tensor a layer makes after construction is made on the device of the weights
it is given, so ``check_reload(..., device="cuda")`` runs the same pairs on
a GPU.

``needs`` names the ``check_reload`` options a row needs that the checker
may not have yet (sleep and wake, re-created parameters, ...); ``gap`` says
why a row is not caught today. The tests pass ``needs`` through only where
``check_reload`` takes the option, so a row marked not caught starts passing
(and its strict xfail fails) when the capability lands.

Modules, one per mechanism family: ``derived`` (A, D), ``repack`` (B, C),
``kernel_objects`` (F), ``first_forward`` (E, G), ``post_processing`` (O1,
O5), ``machinery`` (O3), ``sleep`` (O2, O4).
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

import reloadsafe

#: The mechanism classes of the catalogue.
MECHANISMS = {
    "A": "derived tensor rebuilt as a new attribute",
    "B": "repack into new storage",
    "C": "padding or stride change",
    "D": "value baked at capture as a host number",
    "E": "state made by the first forward",
    "F": "tensor held by a kernel object, closure or partial",
    "G": "memory growth across reloads",
    "H": "op sequence changes",
    "O1": "post-processing not idempotent",
    "O2": "sleep discards state outside the restored set",
    "O3": "the reload machinery overwrites a buffer or alias",
    "O4": "stale module-global cache",
    "O5": "weight_loader lost on re-registration",
}


@dataclasses.dataclass(frozen=True)
class Bug:
    """One catalogue row as a pair of layers.

    ``outcome`` is what the buggy layer gets: ``"violation"`` (the report
    is not ok and flags every name in ``names``) or ``"raises"`` (the
    reload cannot even load: the report flags ``reload``, what it raised
    naming one of ``names``; Note [A reload that raises] in
    conformance/harness/protocol.cc). ``options`` are passed to
    ``check_reload`` for both layers (a load function, checkpoints, an
    input); ``needs`` are options the row needs that may not exist yet.
    """

    id: str
    engine: str
    thread: str
    mechanism: str
    title: str
    names: tuple[str, ...]
    buggy: Callable[[], torch.nn.Module]
    fixed: Callable[[], torch.nn.Module]
    input_shape: tuple[int, ...]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Options for the fixed layer only, over ``options`` (where the fix is
    #: in the engine's machinery, the load function, not in the layer).
    fixed_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    needs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    gap: str | None = None
    outcome: str = "violation"
    #: Why a check on CUDA cannot catch the row, where it cannot (the CUDA
    #: test is then a strict xfail, so catching it there is noticed).
    cuda_gap: str | None = None
    #: The buggy layer's report has no value violation ("forward", "replay")
    #: when every reload loads the same weights: only new values show it.
    values_must_change: bool = False

    @property
    def mechanism_class(self) -> str:
        """The primary class (the first letter group of ``mechanism``)."""
        return self.mechanism.split()[0]

    def example_input(self, seed: int) -> torch.Tensor:
        return torch.randn(*self.input_shape, generator=torch.Generator().manual_seed(seed))

    def missing(self) -> list[str]:
        """The options of ``needs`` that ``check_reload`` does not take."""
        have = inspect.signature(reloadsafe.check_reload).parameters
        return [k for k in self.needs if k not in have]

    def layer(self, kind: str) -> Callable[[], torch.nn.Module]:
        """The ``"buggy"`` or the ``"fixed"`` layer's factory."""
        return {"buggy": self.buggy, "fixed": self.fixed}[kind]

    def check_options(self, kind: str) -> dict[str, Any]:
        """The ``check_reload`` options of the ``"buggy"`` or ``"fixed"``
        layer: ``options``, the options of ``needs`` that ``check_reload``
        takes, and for the fixed layer ``fixed_options`` over both (the
        fixed engine helper in place of the buggy one)."""
        have = inspect.signature(reloadsafe.check_reload).parameters
        out = dict(self.options)
        out.update({k: v for k, v in self.needs.items() if k in have})
        if kind == "fixed":
            out.update(self.fixed_options)
        return out


def _collect() -> list[Bug]:
    from . import derived, first_forward, kernel_objects, machinery, post_processing, repack, sleep

    bugs: list[Bug] = []
    for module in (kernel_objects, derived, repack, first_forward, post_processing, machinery, sleep):
        bugs += module.BUGS
    return sorted(bugs, key=lambda b: b.id)


BUGS: list[Bug] = _collect()


def flags(flagged: Iterable[str], name: str) -> bool:
    """Whether ``name`` is a whole component of one of the ``flagged``
    names: ``act_perm`` in ``kernel.act_perm.keywords['index']``, not in
    ``act_perm_inv``."""
    pattern = re.compile(r"(^|[.\[' (])" + re.escape(name) + r"($|[.\[\]' )])")
    return any(pattern.search(f) for f in flagged)


def raised_naming(report: Any, names: tuple[str, ...]) -> bool:
    """Whether ``report`` flags ``reload`` in every mode with what the
    reload raised naming one of ``names`` (quoted, as reloadsafe's errors
    quote a tensor's name; which one depends on the order the load meets
    them)."""
    for mode in report.modes.values():
        raised = [v for v in mode["violations"] if v["tensor"] == "reload"]
        if not raised or not any(f"'{n}'" in raised[0]["after"] for n in names):
            return False
    return True


def by_id(bug_id: str) -> Bug:
    return next(b for b in BUGS if b.id == bug_id)
