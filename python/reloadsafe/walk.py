"""Every tensor reachable from a ``torch.nn.Module``, with a dotted name.

A captured CUDA graph reads every tensor the forward reads, wherever the layer
keeps it: parameters and buffers, but also plain tensor attributes, tensors in
lists and dicts, the arguments of a ``functools.partial`` that wraps a kernel,
the closure cells of a lambda, and the attributes of a kernel object. A reload
that rebuilds any of them moves an address the graph holds. ``named_tensors``
finds them all and names each the way you would reach it in Python::

    weight                               a parameter
    layer.scale                          a tensor attribute of submodule `layer`
    layer.cache[0]                       an element of a list or tuple attribute
    layer.tables['perm']                 a value of a dict attribute
    layer.kernel.keywords['scale']       a keyword argument of a functools.partial
    layer.kernel.args[1]                 a positional argument of a functools.partial
    layer.fn.__closure__[0]              a closure cell of a function, lambda or bound method
    layer.fn.__defaults__[0]             a default argument value
    layer.cfg.workspace                  an attribute of a plain object
    layer.fn.__self__.workspace          an attribute of a bound method's object
    qweight.qdata, qweight.scale         inner tensors of a tensor subclass (below)
    mask._values, mask._indices          the parts of a sparse tensor (below)
    weight.quant_state.absmax            an attribute set on a tensor object

Tensor subclasses. A traceable wrapper subclass (``__torch_dispatch__`` with
``__tensor_flatten__``, the way torchao and other quantizers hold a quantized
weight) has no memory of its own: its inner tensors are the payload and the
scales, and they are what a captured graph reads. ``named_tensors`` never
returns the wrapper; it returns its inner tensors, named by the attribute
names ``__tensor_flatten__`` gives (``qweight.qdata``), descending into an
inner tensor that is itself a wrapper (``weight.inner.qdata``). Nothing here
touches a wrapper's storage or data pointer.

Sparse tensors. A sparse tensor (COO, CSR, CSC, BSR, BSC) has no storage of
its own either: its index and value tensors hold the bytes kernels read.
``named_tensors`` returns those, named by the method that gives each
(``mask._values``, ``mask._indices``; ``w.crow_indices``, ``w.col_indices``,
``w.values`` for the compressed layouts).

Opaque objects. ``named_objects`` finds the TorchScript custom-class objects
(``torch.ScriptObject``, e.g. fbgemm's packed ``LinearPackedParamsBase``) the
module reaches the same way: a kernel reads what the object holds, so an
object replaced by a reload is an address a captured graph loses.

The walk is cycle-safe (each object is entered once) and depth-limited
(``max_depth`` hops below a module attribute; submodules do not count). It
does not follow a function's globals, classes, Python modules, or objects
without a ``__dict__``/``__slots__`` (C extension objects such as torch ops),
so a tensor kept only there is not found here; the read trace still sees it
when the forward reads it.
"""
from __future__ import annotations

import contextlib
import functools
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._loader import _C

__all__ = ["NamedObject", "NamedTensor", "named_numbers", "named_objects", "named_tensors"]

#: Default for ``named_tensors(max_depth=...)``.
DEFAULT_MAX_DEPTH = 8


@dataclass(frozen=True)
class NamedTensor:
    """One tensor reachable from a module.

    ``kind`` says how it is held: ``"parameter"``, ``"buffer"`` (both
    ``registered``), ``"attribute"`` (a plain tensor attribute of a module),
    ``"container"`` (inside a list, tuple, set or dict), ``"partial"`` (an
    argument of a ``functools.partial``), ``"closure"`` (a closure cell or
    default of a function) or ``"object"`` (an attribute of a plain object).
    An inner tensor of a wrapper subclass has the kind of its wrapper.
    """

    name: str
    tensor: torch.Tensor
    kind: str

    @property
    def registered(self) -> bool:
        """Whether the module registers it: a parameter or a buffer."""
        return self.kind in ("parameter", "buffer")

    @property
    def declared(self) -> bool:
        """Deprecated: ``registered``. (In the harness a *declared* tensor is
        one the check holds to its address, whatever its kind.)"""
        warnings.warn(
            "NamedTensor.declared is deprecated: use NamedTensor.registered (a parameter or a "
            "buffer); check_reload declares every reachable tensor not named in undeclared=",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.registered


@dataclass(frozen=True)
class NamedObject:
    """One TorchScript custom-class object (``torch.ScriptObject``) reachable
    from a module, e.g. the packed weight of ``torch.ops.quantized.linear_dynamic``.
    ``kind`` says how it is held, as for ``NamedTensor``."""

    name: str
    obj: torch.ScriptObject
    kind: str


# Objects whose insides are never walked: they hold no per-layer tensors, and
# walking them would wander into the interpreter or torch's internals.
_OPAQUE = (
    type,
    types.ModuleType,
    types.BuiltinFunctionType,
    types.BuiltinMethodType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    str,
    bytes,
    bytearray,
    int,
    float,
    complex,
    bool,
    type(None),
    torch.dtype,
    torch.device,
    torch.Size,
    torch.layout,
    torch.memory_format,
    torch.Generator,
)


def tensor_parts(t: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
    """The tensors that hold ``t``'s bytes, each with the name that reaches it
    from ``t``: a sparse tensor's index and value tensors (``_values``), a
    traceable wrapper subclass's inner tensors (``qdata``; the wrapper has no
    storage a kernel reads). None for a tensor that holds its own bytes."""
    if t.layout != torch.strided:
        sparse = _C.sparse_parts(t)  # the C++ trace's table (sparse_parts.h)
        if sparse is not None:
            return sparse
    if is_traceable_wrapper_subclass(t):
        inner_names, _ = t.__tensor_flatten__()
        inner = [(n, getattr(t, n, None)) for n in inner_names]
        return [(n, v) for n, v in inner if isinstance(v, torch.Tensor)]
    return None


def _is_opaque(cls: type) -> bool:
    """Whether objects of type ``cls`` are walked no further."""
    if issubclass(cls, _OPAQUE):
        return True
    # torch.ops packets and overloads, torch.library objects, etc.: C++-backed
    # objects whose attributes lead into torch itself.
    module = getattr(cls, "__module__", "") or ""
    return module.startswith(("torch._ops", "torch._C", "torch.library", "torch._library"))


def _key(k: Any) -> str:
    if isinstance(k, (str, int, bool, float)) or k is None:
        return f"[{k!r}]"
    return f"[{type(k).__name__}@{id(k):#x}]"


class _Walker:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.seen_tensors: set[int] = set()
        self.entered: set[int] = set()
        self.out: list[NamedTensor] = []
        self.objects: list[NamedObject] = []
        # Host numbers (int and float, not bool) under every name they are
        # reached by: a forward that reads one bakes it into a capture.
        self.numbers: list[tuple[str, int | float]] = []
        # Tensors whose own attributes (``t.__dict__``) are still to walk:
        # walked after every module's parameters and buffers, so a tensor an
        # attribute also reaches keeps its declared name.
        self.tensor_attrs: list[tuple[str, torch.Tensor, int]] = []
        # Every object and module entered, by identity, with the name it was
        # first reached by (shared_object_names).
        self.object_names: dict[int, str] = {}

    def add(self, name: str, t: torch.Tensor, kind: str, depth: int = 0) -> None:
        if id(t) in self.seen_tensors:
            return
        self.seen_tensors.add(id(t))
        parts = tensor_parts(t)
        if parts is None:
            self.out.append(NamedTensor(name, t, kind))
        else:  # named by what holds its bytes (see the module docstring)
            for part_name, part in parts:
                self.add(f"{name}.{part_name}", part, kind, depth)
        self.tensor_attrs.append((name, t, depth))

    def add_object(self, name: str, obj: torch.ScriptObject, kind: str) -> None:
        if id(obj) in self.entered:
            return
        self.entered.add(id(obj))
        self.objects.append(NamedObject(name, obj, kind))

    def pending_tensor_attrs(self) -> None:
        """The attributes set on tensor objects (``param.quant_state``,
        a wrapper's metadata), walked like a plain object's."""
        i = 0
        while i < len(self.tensor_attrs):  # walking may find more tensors
            name, t, depth = self.tensor_attrs[i]
            i += 1
            if depth >= self.max_depth:
                continue
            try:
                attrs = dict(vars(t))
            except TypeError:
                continue
            for k, v in attrs.items():
                self.value(f"{name}.{k}", v, depth + 1, "object")

    def module(self, prefix: str, m: torch.nn.Module) -> None:
        """Parameters and buffers of the whole tree first (so a tensor that is
        also referenced elsewhere keeps its declared name), then every other
        attribute of every module."""
        if id(m) in self.entered:
            return
        mods = [(n, sub) for n, sub in m.named_modules(prefix=prefix, remove_duplicate=True)]
        for n, sub in mods:
            self.entered.add(id(sub))
            self.object_names.setdefault(id(sub), n)
        for n, sub in mods:
            for pn, p in sub._parameters.items():
                if p is not None:
                    self.add(_join(n, pn), p, "parameter")
            for bn, b in sub._buffers.items():
                if b is not None:
                    self.add(_join(n, bn), b, "buffer")
        for n, sub in mods:
            for an, value in vars(sub).items():
                if an in ("_parameters", "_buffers", "_modules"):
                    continue
                self.value(_join(n, an), value, 0, "attribute")

    def value(self, name: str, obj: Any, depth: int, kind: str) -> None:
        # By the object's own type, never its __class__: an object whose
        # __getattribute__ does work (transformers' configs, which every
        # layer of a model holds) is asked nothing to be classified.
        cls = type(obj)
        if issubclass(cls, (int, float)) and cls is not bool:
            self.numbers.append((name, obj))
            return
        if id(obj) in self.entered:  # an object, container or module walked already
            return
        if issubclass(cls, torch.Tensor):
            self.add(name, obj, kind, depth)
            return
        if issubclass(cls, torch.ScriptObject):
            self.add_object(name, obj, kind)
            return
        if issubclass(cls, torch.nn.Module):
            self.module(name, obj)  # a module held outside _modules
            return
        if _is_opaque(cls) or depth >= self.max_depth:
            return
        self.entered.add(id(obj))
        self.object_names[id(obj)] = name
        d = depth + 1
        if issubclass(cls, (dict, types.MappingProxyType)):
            for k, v in list(obj.items()):
                self.value(name + _key(k), v, d, "container")
        elif issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a namedtuple
            for f in obj._fields:
                self.value(f"{name}.{f}", getattr(obj, f), d, "container")
        elif issubclass(cls, (list, tuple)):
            for i, v in enumerate(obj):
                self.value(f"{name}[{i}]", v, d, "container")
        elif issubclass(cls, (set, frozenset)):
            for v in obj:
                if isinstance(v, torch.Tensor):
                    self.value(f"{name}{{{id(v):#x}}}", v, d, "container")
        elif issubclass(cls, functools.partial):
            self.value(f"{name}.func", obj.func, d, "partial")
            for i, v in enumerate(obj.args):
                self.value(f"{name}.args[{i}]", v, d, "partial")
            for k, v in (obj.keywords or {}).items():
                self.value(f"{name}.keywords[{k!r}]", v, d, "partial")
            self.attributes(name, obj, d)
        elif issubclass(cls, types.MethodType):
            if isinstance(obj.__func__, types.FunctionType):
                self.function(name, obj.__func__, d)
            else:  # any callable bound as a method (torchao binds a functools.partial)
                self.value(f"{name}.__func__", obj.__func__, d, "object")
            self.value(f"{name}.__self__", obj.__self__, d, "object")
        elif issubclass(cls, types.FunctionType):
            self.function(name, obj, d)
        else:
            self.attributes(name, obj, d)

    def function(self, name: str, fn: types.FunctionType, depth: int) -> None:
        # A bound method forwards these attributes to its function, so
        # `layer.fn.__closure__[0]` names the cell for both.
        for i, cell in enumerate(fn.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.value(f"{name}.__closure__[{i}]", contents, depth, "closure")
        for i, v in enumerate(fn.__defaults__ or ()):
            self.value(f"{name}.__defaults__[{i}]", v, depth, "closure")
        for k, v in (fn.__kwdefaults__ or {}).items():
            self.value(f"{name}.__kwdefaults__[{k!r}]", v, depth, "closure")
        for k, v in vars(fn).items():  # attributes set on the function object
            self.value(f"{name}.{k}", v, depth, "object")

    def attributes(self, name: str, obj: Any, depth: int) -> None:
        attrs: dict[str, Any] = {}
        for cls in type(obj).__mro__:
            slots = cls.__dict__.get("__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots:
                if not isinstance(slot, str) or slot in ("__dict__", "__weakref__"):
                    continue
                with contextlib.suppress(AttributeError):
                    attrs.setdefault(slot, getattr(obj, slot))
        with contextlib.suppress(TypeError):
            attrs.update(vars(obj))
        for k, v in attrs.items():
            self.value(f"{name}.{k}", v, depth, "object")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _walk(what: str, module: torch.nn.Module, max_depth: int) -> _Walker:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{what}: expected a torch.nn.Module, got {type(module).__name__}")
    if max_depth < 0:
        raise ValueError(f"{what}: max_depth must be >= 0, got {max_depth}")
    w = _Walker(max_depth)
    w.module("", module)
    w.pending_tensor_attrs()
    return w


def named_tensors(module: torch.nn.Module, *, max_depth: int = DEFAULT_MAX_DEPTH) -> list[NamedTensor]:
    """Every distinct tensor reachable from ``module``, each once, under the
    first name it is found by: parameters and buffers of the whole module tree
    first (in ``named_parameters`` / ``named_buffers`` order), then tensor
    attributes, tensors in containers, ``functools.partial`` arguments,
    closure cells and defaults of functions and bound methods, attributes of
    plain objects, and last attributes set on tensor objects, following each
    reference at most ``max_depth`` hops below a module attribute.

    A traceable wrapper subclass (``torch.utils._python_dispatch.
    is_traceable_wrapper_subclass``) is not returned itself: its inner
    tensors are, recursively, as ``<name>.<inner>`` with the names its
    ``__tensor_flatten__`` gives.

    Raises ``TypeError`` if ``module`` is not a ``torch.nn.Module``.
    """
    return _walk("named_tensors", module, max_depth).out


def named_objects(module: torch.nn.Module, *, max_depth: int = DEFAULT_MAX_DEPTH) -> list[NamedObject]:
    """Every distinct TorchScript custom-class object (``torch.ScriptObject``:
    fbgemm's packed linear weights, a ``torch.classes`` kernel handle)
    reachable from ``module``, each once, under the first name it is found by
    and by the same walk as ``named_tensors`` (attributes of modules and of
    plain objects, containers, partials, closures). The objects are not
    entered: what they hold is theirs.

    Raises ``TypeError`` if ``module`` is not a ``torch.nn.Module``.
    """
    return _walk("named_objects", module, max_depth).objects


def named_numbers(module: torch.nn.Module, *, max_depth: int = DEFAULT_MAX_DEPTH) -> list[tuple[str, int | float]]:
    """Every Python ``int`` and ``float`` (not ``bool``) reachable from
    ``module`` by the walk of ``named_tensors`` (module attributes, containers,
    partials, closures, plain objects), as ``(name, value)``: the host numbers
    a forward may read and a captured graph bakes in (``_k_scale_float``).
    A number reached by several names is listed under each.

    Raises ``TypeError`` if ``module`` is not a ``torch.nn.Module``.
    """
    return _walk("named_numbers", module, max_depth).numbers


def shared_object_names(a: torch.nn.Module, b: torch.nn.Module, *, max_depth: int = DEFAULT_MAX_DEPTH) -> list[str]:
    """The names (as ``a`` reaches them) of the objects and modules that two
    separately built layers ``a`` and ``b`` both reach: state that does not
    belong to either layer (a configuration every layer of a model shares, a
    module-level cache of modules). Only the outermost: what a shared object
    holds is under its name. Empty when ``a`` is ``b``.

    Raises ``TypeError`` if either is not a ``torch.nn.Module``."""
    if a is b:
        return []
    in_a = _walk("shared_object_names", a, max_depth).object_names
    in_b = _walk("shared_object_names", b, max_depth).object_names
    out: list[str] = []
    for name in sorted((n for key, n in in_a.items() if key in in_b and n), key=len):
        if not any(name.startswith(o) and name[len(o):len(o) + 1] in (".", "[") for o in out):
            out.append(name)
    return out
