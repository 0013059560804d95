"""The read trace: which tensors a piece of code hands to operators.

``trace()`` records, for every operator call made on the current thread
inside its ``with`` block, the operator and every tensor argument: the storage
it lives on, its data pointer, byte offset, sizes, strides, dtype and device,
and whether it is *external* (its storage existed before the block and was
not produced by an op inside it; views of an external storage are external)::

    with reloadsafe.trace() as t:
        layer(x)
    for read in t.external_reads():
        print(read.where, read.layout, hex(read.data_ptr))
    print(t.format(layer))    # names from reloadsafe.named_tensors(layer)

Tensor subclasses and opaque objects. A tensor that dispatches in Python (a
``__torch_dispatch__`` wrapper subclass, as torchao holds a quantized weight)
is recorded as a read with ``subclass=True`` and no storage fields (nothing
touches its storage). A subclass working through ``__torch_function__``
(torchao's) calls its ops on the inner tensors in the open, and
``named_reads`` names those reads by ``named_tensors``' flattened names
(``weight.qdata``). Inside a ``__torch_dispatch__`` PyTorch excludes the
trace's dispatch key; there the trace observes through RecordFunction, so the
ops the subclass calls on its inner tensors are recorded one level deeper than
the op on the wrapper, with the same names (``nested=False`` leaves them out,
as every op inside another). A TorchScript
custom-class object handed to an op (fbgemm's packed weight in
``quantized::linear_dynamic``) is an ``ObjectRead`` in ``OpCall.objects``,
with its class name and identity; ``named_object_reads`` names it by
``named_objects``.

It is the C++ ReadTrace (conformance/trace/read_trace.h) on a dispatcher
mode key, so it sees every op that goes through PyTorch's dispatcher: ATen ops
and custom ops (``torch.ops.*``, ``torch.library``), whether called from Python
or from C++.

What it cannot see: a kernel launched without the dispatcher (a raw Triton
launch, a CUDA kernel called through ctypes or a pybind11 extension that does
not register an op, a pointer handed to a library); work on other threads;
and storages created without an op inside the block (e.g. by ``from_blob``
over fresh memory), which count as external. On a GPU, ``check_reload``'s
graph replay still catches a stale read by such a kernel.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ._loader import _C
from .compiler import first_calls_as_later_ones, watch_compilations
from .walk import named_objects, named_tensors

__all__ = ["trace", "Trace", "TensorRead", "ObjectRead", "OpCall"]


@dataclass(frozen=True)
class TensorRead:
    """One tensor argument of one op, as the op received it."""

    op: str  #: the op's name with overload, "aten::mm" / "aten::add.Tensor"
    op_index: int  #: index of the op in the trace
    depth: int  #: 0: called by the traced code; n: called inside a depth n-1 op
    arg: int  #: index of the argument in the op's schema
    arg_name: str  #: the schema's name for it ("self", "mat2")
    element: int | None  #: index in a Tensor[] argument, else None
    written: bool  #: the schema says the op writes it (in-place, out=)
    external: bool  #: see the module docstring
    #: a tensor that dispatches in Python (a wrapper subclass): no storage
    #: identity, every storage field 0; its inner tensors' reads follow
    subclass: bool
    #: for a tensor an opaque object reported (its packed weight), the
    #: object's identity (ObjectRead.identity); 0 for an argument of the op
    object: int
    storage: int  #: the storage's identity (compare only)
    storage_data_ptr: int
    storage_nbytes: int
    data_ptr: int
    storage_offset: int  #: in elements
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    layout: str  #: "Float[16, 64] stride [64, 1] offset 0 on cpu"
    #: for an external read on the CPU, its storage's allocation sequence
    #: number, if a CPU census numbered it (a trace does inside its block;
    #: ``_C.CpuCensus()`` around more code), else 0: whether the storage was
    #: made after a point in time (``_C.cpu_allocation_epoch()``)
    allocation_epoch: int = 0

    @property
    def byte_offset(self) -> int:
        """Bytes from the start of the storage to the first element."""
        return self.storage_offset * self.dtype.itemsize

    @property
    def where(self) -> str:
        """"aten::mm arg 1 (mat2)"."""
        el = f"[{self.element}]" if self.element is not None else ""
        return f"{self.op} arg {self.arg}{el} ({self.arg_name})"


@dataclass(frozen=True)
class ObjectRead:
    """One opaque (TorchScript custom-class) object argument of one op: a
    packed weight or a kernel handle, recorded by class and identity."""

    op: str  #: the op's name with overload, "quantized::linear_dynamic"
    op_index: int
    depth: int
    arg: int  #: index of the argument in the op's schema
    arg_name: str
    class_name: str  #: "quantized.LinearPackedParamsBase"
    identity: int  #: the object's identity (compare only; see reloadsafe._C.object_identity)
    payload: int  #: identity of the C++ instance it holds (compare only)

    @property
    def where(self) -> str:
        """"quantized::linear_dynamic arg 1 (W_prepack)"."""
        return f"{self.op} arg {self.arg} ({self.arg_name})"


@dataclass(frozen=True)
class OpCall:
    """One op call seen by the trace: its tensor arguments (``reads``) and
    its opaque-object arguments (``objects``)."""

    name: str
    depth: int
    reads: tuple[TensorRead, ...]
    objects: tuple[ObjectRead, ...] = ()


class Trace:
    """A read trace; use it as a context manager (``with trace() as t``).
    Recording stops when the block ends (also on an exception)."""

    def __init__(self, nested: bool = True) -> None:
        self._nested = nested
        self._native: object | None = None
        self._restore = contextlib.ExitStack()  # what __enter__ set, put back by __exit__
        self._ops: list[OpCall] | None = None
        self._entered = False

    def __enter__(self) -> Trace:
        if self._entered:
            raise RuntimeError("reloadsafe.trace(): a trace is entered once; make a new one")
        self._entered = True
        watch_compilations()  # a compilation inside the block is not the block's work
        with contextlib.ExitStack() as stack:
            # A compiled graph's first call inside the block runs as its later ones.
            stack.enter_context(first_calls_as_later_ones())
            self._native = _C.ReadTrace(self._nested)
            self._restore = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._native.stop()  # type: ignore[union-attr]
        self._restore.close()
        self._ops = [_op(i, op) for i, op in enumerate(self._native.ops())]  # type: ignore[union-attr]
        self._native = None  # releases the C++ trace and what it kept

    @property
    def ops(self) -> list[OpCall]:
        """Every op seen, in call order."""
        if self._ops is None:
            raise RuntimeError("reloadsafe.trace(): the results are there once the with block has ended")
        return self._ops

    def reads(self) -> Iterator[TensorRead]:
        """Every tensor argument of every op, in call order."""
        for op in self.ops:
            yield from op.reads

    def external_reads(self) -> list[TensorRead]:
        """The reads whose storage existed before the block: what a captured
        graph would read from memory it does not own."""
        return [r for r in self.reads() if r.external]

    def object_reads(self) -> list[ObjectRead]:
        """Every opaque-object argument of every op, in call order."""
        return [o for op in self.ops for o in op.objects]

    def named_reads(self, module: torch.nn.Module) -> list[tuple[TensorRead, str | None]]:
        """Each external read with the name (``named_tensors(module)``) of the
        tensor whose storage it reads, or None when the module does not reach
        it (a kernel object outside the module, a global) and for a
        wrapper-subclass read (it has no storage of its own). Only data
        pointers the trace recorded are compared: no storage of a wrapper,
        sparse or mkldnn tensor is touched."""
        by_storage: dict[int, str] = {}
        for nt in named_tensors(module):
            ptr = _storage_data_ptr(nt.tensor)
            if ptr:
                by_storage.setdefault(ptr, nt.name)
        return [
            (r, None if r.subclass or not r.storage_data_ptr else by_storage.get(r.storage_data_ptr))
            for r in self.external_reads()
        ]

    def named_object_reads(self, module: torch.nn.Module) -> list[tuple[ObjectRead, str | None]]:
        """Each opaque-object read with the name (``named_objects(module)``)
        of the object, or None when the module does not reach it."""
        by_identity = {_C.object_identity(no.obj): no.name for no in named_objects(module)}
        return [(o, by_identity.get(o.identity)) for o in self.object_reads()]

    def format(self, module: torch.nn.Module | None = None) -> str:
        """The external reads and the object reads as a table: op and
        argument, name (with a module) and layout (for an object, its
        class)."""
        rows = self.named_reads(module) if module is not None else [(r, None) for r in self.external_reads()]
        lines = []
        for r, name in rows:
            if r.subclass:
                label = "(subclass wrapper: no storage of its own)"
            else:
                label = name if name is not None else ("undeclared" if module is not None else "")
            lines.append(f"{r.where:<36} {label:<28} {r.layout}")
        objects = (
            self.named_object_reads(module) if module is not None else [(o, None) for o in self.object_reads()]
        )
        for o, name in objects:
            label = name if name is not None else ("undeclared" if module is not None else "")
            lines.append(f"{o.where:<36} {label:<28} object {o.class_name}")
        return "\n".join(lines)


def _storage_data_ptr(t: torch.Tensor) -> int:
    """The data pointer of ``t``'s storage, or 0 where it has none to compare
    (meta, sparse, mkldnn, an empty storage)."""
    if t.layout != torch.strided or t.device.type == "meta":
        return 0
    storage = t.untyped_storage()
    return storage.data_ptr() if storage.nbytes() > 0 else 0


def trace(*, nested: bool = True) -> Trace:
    """A read trace of the ``with`` block (see the module docstring).
    ``nested=False`` records only the ops the block calls, not the ops they
    call internally."""
    return Trace(nested=nested)


def _op(index: int, op: Any) -> OpCall:
    reads = tuple(
        TensorRead(
            op=op.name, op_index=index, depth=op.depth, arg=r.arg, arg_name=r.arg_name,
            element=None if r.element < 0 else r.element, written=r.written, external=r.external,
            subclass=r.subclass, object=r.object,
            storage=r.storage, storage_data_ptr=r.storage_data, storage_nbytes=r.storage_nbytes,
            data_ptr=r.data_ptr, storage_offset=r.storage_offset, sizes=tuple(r.sizes),
            strides=tuple(r.strides), dtype=r.dtype, device=r.device, layout=r.layout,
            allocation_epoch=r.allocation_epoch,
        )
        for r in op.reads
    )
    objects = tuple(
        ObjectRead(
            op=op.name, op_index=index, depth=op.depth, arg=o.arg, arg_name=o.arg_name,
            class_name=o.class_name, identity=o.identity, payload=o.payload,
        )
        for o in op.objects
    )
    return OpCall(name=op.name, depth=op.depth, reads=reads, objects=objects)
