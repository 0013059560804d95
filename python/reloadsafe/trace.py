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

It is the C++ ReadTrace (conformance/harness/read_trace.h) on a dispatcher
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

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from ._loader import _C
from .walk import named_tensors

__all__ = ["trace", "Trace", "TensorRead", "OpCall"]


@dataclass(frozen=True)
class TensorRead:
    """One tensor argument of one op, as the op received it."""

    op: str  #: the op's name with overload, "aten::mm" / "aten::add.Tensor"
    op_index: int  #: index of the op in the trace
    depth: int  #: 0: called by the traced code; n: called inside a depth n-1 op
    arg: int  #: index of the argument in the op's schema
    arg_name: str  #: the schema's name for it ("self", "mat2")
    element: Optional[int]  #: index in a Tensor[] argument, else None
    written: bool  #: the schema says the op writes it (in-place, out=)
    external: bool  #: see the module docstring
    storage: int  #: the storage's identity (compare only)
    storage_data_ptr: int
    storage_nbytes: int
    data_ptr: int
    storage_offset: int  #: in elements
    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    layout: str  #: "Float[16, 64] stride [64, 1] offset 0 on cpu"

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
class OpCall:
    """One op call seen by the trace."""

    name: str
    depth: int
    reads: Tuple[TensorRead, ...]


class Trace:
    """A read trace; use it as a context manager (``with trace() as t``).
    Recording stops when the block ends (also on an exception)."""

    def __init__(self, nested: bool = True) -> None:
        self._nested = nested
        self._native: Optional[object] = None
        self._ops: Optional[List[OpCall]] = None
        self._entered = False

    def __enter__(self) -> "Trace":
        if self._entered:
            raise RuntimeError("reloadsafe.trace(): a trace is entered once; make a new one")
        self._entered = True
        self._native = _C.ReadTrace(self._nested)
        return self

    def __exit__(self, *exc: object) -> None:
        self._native.stop()  # type: ignore[union-attr]
        self._ops = [_op(i, op) for i, op in enumerate(self._native.ops())]  # type: ignore[union-attr]
        self._native = None  # releases the C++ trace and what it kept

    @property
    def ops(self) -> List[OpCall]:
        """Every op seen, in call order."""
        if self._ops is None:
            raise RuntimeError("reloadsafe.trace(): the results are there once the with block has ended")
        return self._ops

    def reads(self) -> Iterator[TensorRead]:
        """Every tensor argument of every op, in call order."""
        for op in self.ops:
            yield from op.reads

    def external_reads(self) -> List[TensorRead]:
        """The reads whose storage existed before the block: what a captured
        graph would read from memory it does not own."""
        return [r for r in self.reads() if r.external]

    def named_reads(self, module: torch.nn.Module) -> List[Tuple[TensorRead, Optional[str]]]:
        """Each external read with the name (``named_tensors(module)``) of the
        tensor whose storage it reads, or None when the module does not reach
        it (a kernel object outside the module, a global)."""
        by_storage: Dict[int, str] = {}
        for nt in named_tensors(module):
            if nt.tensor.device.type != "meta":
                by_storage.setdefault(nt.tensor.untyped_storage().data_ptr(), nt.name)
        return [(r, by_storage.get(r.storage_data_ptr)) for r in self.external_reads()]

    def format(self, module: Optional[torch.nn.Module] = None) -> str:
        """The external reads as a table: op and argument, name (with a
        module) and layout."""
        rows = self.named_reads(module) if module is not None else [(r, None) for r in self.external_reads()]
        lines = []
        for r, name in rows:
            label = name if name is not None else ("undeclared" if module is not None else "")
            lines.append(f"{r.where:<36} {label:<28} {r.layout}")
        return "\n".join(lines)


def trace(*, nested: bool = True) -> Trace:
    """A read trace of the ``with`` block (see the module docstring).
    ``nested=False`` records only the ops the block calls, not the ops they
    call internally."""
    return Trace(nested=nested)


def _op(index: int, op: object) -> OpCall:
    reads = tuple(
        TensorRead(
            op=op.name, op_index=index, depth=op.depth, arg=r.arg, arg_name=r.arg_name,
            element=None if r.element < 0 else r.element, written=r.written, external=r.external,
            storage=r.storage, storage_data_ptr=r.storage_data, storage_nbytes=r.storage_nbytes,
            data_ptr=r.data_ptr, storage_offset=r.storage_offset, sizes=tuple(r.sizes),
            strides=tuple(r.strides), dtype=r.dtype, device=r.device, layout=r.layout,
        )
        for r in op.reads
    )
    return OpCall(name=op.name, depth=op.depth, reads=reads)
