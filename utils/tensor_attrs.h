// tensor_attrs.h: attributes carried by tensor objects, and parameters.
//
// Python lets any tensor carry attributes (`param.weight_loader = f`,
// `w.is_shuffled = True`) and tells parameters from plain tensors by class.
// C++ tensors have neither, so reloadsafe keeps both in a side table keyed by
// tensor object identity.
//
// Invariant: a tensor *object* is its `c10::TensorImpl`. Everything that
// keeps the object keeps its attributes: copies of the `at::Tensor` handle,
// and `Tensor::set_data`, which rebinds the object to other data (the C++ form
// of `param.data = t`), even across a change of dtype. Views, `detach()` and
// `clone()` make new objects, which start with no attributes, as in Python.
// An entry holds only a weak reference: it never keeps a tensor or its storage
// alive, and it disappears with its object.
//
// Usage:
//   at::Tensor w = reloadsafe::make_parameter(at::empty({4, 4}));
//   reloadsafe::set_weight_attrs(w, {{"weight_loader", WeightLoader{"L", fn}}});
//   if (std::optional<AttrValue> v = reloadsafe::find_attr(w, "weight_loader")) { ... }
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>

namespace reloadsafe {

/// A weight loader: called with the parameter and the checkpoint tensor.
/// `name` identifies it in reports and case files; two loaders are the same
/// loader when their names are equal.
struct WeightLoader {
  std::string name;
  std::function<void(at::Tensor& param, const at::Tensor& loaded)> fn;

  bool operator==(const WeightLoader& other) const { return name == other.name; }
};

/// The values attributes can hold: flags, integers, strings, loaders and
/// tensors (a `_ckpt` record or a requantization source, for example).
using AttrValue = std::variant<bool, int64_t, double, std::string, WeightLoader, at::Tensor>;

/// Attributes by name, ordered by name so that reports are deterministic.
using AttrMap = std::map<std::string, AttrValue>;

/// Python truthiness of an attribute value: false, 0, "" and an undefined
/// tensor (None) are false; a loader is true. A tensor is its one value, as
/// `bool(tensor)` is in Python: a tensor with one element is true when that
/// element is non-zero, and a tensor with no or several elements (or on the
/// meta device) throws, because its truth value is ambiguous.
bool truthy(const AttrValue& value);

/// A copy of the attribute `key` of tensor object `t`, or std::nullopt. The
/// copy is taken under the table's lock, so it stays valid whatever other
/// threads do to `t`'s attributes afterwards (a tensor value is a handle to
/// the same tensor object, as in Python).
std::optional<AttrValue> find_attr(const at::Tensor& t, const std::string& key);

/// Whether `t` has attribute `key` (Python's `hasattr` for data attributes).
bool has_attr(const at::Tensor& t, const std::string& key);

/// Whether `t` has attribute `key` with a truthy value
/// (`getattr(t, key, False)` used as a condition). Throws where truthy()
/// does (a tensor value with no or several elements).
bool attr_truthy(const at::Tensor& t, const std::string& key);

/// Sets attribute `key` of `t`, replacing any value it had.
void set_attr(const at::Tensor& t, const std::string& key, AttrValue value);

/// Removes attribute `key` from `t`; returns whether it was there.
bool erase_attr(const at::Tensor& t, const std::string& key);

/// A copy of all attributes of `t` (Python's `dict(t.__dict__)`).
AttrMap attrs(const at::Tensor& t);

/// Whether `t` is a parameter object (`isinstance(t, torch.nn.Parameter)`).
bool is_parameter(const at::Tensor& t);

/// Marks the object `t` as a parameter, in place. Layers do this for every
/// tensor registered as a parameter.
void mark_parameter(const at::Tensor& t);

/// `torch.nn.Parameter(data, requires_grad=False)`: a new parameter object
/// that shares `data`'s storage and layout. It carries none of `data`'s
/// attributes. Never allocates tensor memory.
at::Tensor make_parameter(const at::Tensor& data);

/// `set_weight_attrs(weight, weight_attrs)`: adds attributes to a weight.
///
/// Never overwrites: if `weight` already has any of the keys (a parameter
/// with `_weight_loader` has `weight_loader` too, as replace_parameter reads
/// it; a plain tensor's `_weight_loader` is only a field), or a key is a name
/// every tensor answers to (an attribute, method or property of
/// torch.Tensor: `data`, `size`, `is_leaf`, `stride`, ...; see
/// is_tensor_member_name), it throws and sets none of them (Python sets the
/// keys before the failing one; the C++ port checks all first, so a failed
/// call changes nothing). `std::nullopt` and an empty map do nothing, even
/// with an undefined `weight` (the reference returns, or loops over nothing).
/// Addresses: touches no tensor data; the weight keeps its storage and data
/// pointer.
void set_weight_attrs(const at::Tensor& weight, const std::optional<AttrMap>& weight_attrs);

/// Whether `name` is a name every torch.Tensor (and torch.nn.Parameter)
/// answers to in Python 2.11: its attributes, methods and properties, from
/// `dir()` (the table is generated from real torch; see tensor_names.inc).
bool is_tensor_member_name(const std::string& name);

namespace detail {
/// Number of live entries in the attribute table (for tests of its cleanup).
size_t attr_table_size();
}  // namespace detail

}  // namespace reloadsafe
