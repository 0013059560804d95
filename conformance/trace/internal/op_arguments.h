// op_arguments.h: the tensors and opaque objects inside one boxed op argument.
//
// An operator receives tensors in three shapes: a single Tensor, a Tensor[]
// (a TensorList), and a Tensor?[] (optional tensors, as index() takes, which
// arrive as a generic list whose elements are tensors or None). Kernel
// objects arrive as TorchBind script objects. Every place that looks at an
// op's arguments (the read trace, the capture holding them, the replay
// mapping them) walks them through these two functions, so a shape is
// handled the same way everywhere.
//
// Invariant: no function here runs an op or touches a tensor's storage; the
// callbacks decide what to do with each tensor.
#pragma once

#include "conformance/trace/sparse_parts.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstddef>

namespace reloadsafe::trace {

/// Calls `on_tensor(tensor, element)` for every tensor in `v`, with element
/// -1 for a single Tensor and the index for a list element (None elements
/// are skipped; an undefined tensor is passed on as it is), and
/// `on_object(v)` if `v` is a TorchBind script object.
template <typename OnTensor, typename OnObject>
void for_each_in_argument(const c10::IValue& v, OnTensor&& on_tensor, OnObject&& on_object) {
  // Every list is walked by its elements (isList() reads the tag only): a
  // Tensor[] holds its tensors as elements too, an undefined one included,
  // so asking its element type (a call into LibTorch, on every list of
  // sizes or dims an op takes) tells nothing the elements do not.
  if (v.isTensor()) {
    on_tensor(v.toTensor(), -1);
  } else if (v.isList()) {
    const auto list = v.toListRef();
    for (size_t e = 0; e < list.size(); ++e) {
      if (list[e].isTensor()) on_tensor(list[e].toTensor(), static_cast<int>(e));
    }
  } else if (v.isObject()) {
    on_object(v);
  }
}

/// for_each_in_argument() for the tensors only.
template <typename OnTensor>
void for_each_tensor(const c10::IValue& v, OnTensor&& on_tensor) {
  for_each_in_argument(v, on_tensor, [](const c10::IValue&) {});
}

/// What a call reads, the one rule for recording a call and for telling it
/// against an expected one (call_match.h): `on_read(tensor, arg, element,
/// part)` for every tensor argument among `args[0..num_args)` that is a
/// memory read (defined, and not a wrapped number such as Python's `x * 0.5`
/// makes), with `part` null; for a sparse argument, once for each of its
/// parts instead (sparse_parts.h), with `part` naming it. `on_object(value,
/// arg)` for every opaque object, in argument order.
template <typename OnRead, typename OnObject>
void for_each_read(const c10::IValue* args, size_t num_args, OnRead&& on_read,
                   OnObject&& on_object) {
  for (size_t i = 0; i < num_args; ++i) {
    const int arg = static_cast<int>(i);
    for_each_in_argument(
        args[i],
        [&](const at::Tensor& t, int element) {
          if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
          if (t.layout() == at::kStrided) {  // the common case, without a call
            on_read(t, arg, element, static_cast<const SparsePart*>(nullptr));
            return;
          }
          const size_t parts = sparse_part_count(t);
          if (parts == 0) on_read(t, arg, element, static_cast<const SparsePart*>(nullptr));
          for (size_t k = 0; k < parts; ++k) {
            on_read(sparse_part(t, k), arg, element, &sparse_part_info(t, k));
          }
        },
        [&](const c10::IValue& object) { on_object(object, arg); });
  }
}

/// `v` with every tensor in it replaced by `fn(tensor)`: a Tensor, a
/// Tensor[] or a Tensor?[] of the same length (None stays None); any other
/// value is returned as it is.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> mapped;
    for (const at::Tensor& t : v.toTensorList().vec()) mapped.push_back(fn(t));
    return mapped;
  }
  if (v.isList() && v.toListRef().size() > 0) {
    c10::impl::GenericList mapped(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef())
      mapped.push_back(e.isTensor() ? c10::IValue(fn(e.toTensor())) : e);
    return mapped;
  }
  return v;
}

}  // namespace reloadsafe::trace
