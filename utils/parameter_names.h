// parameter_names.h: which of a layer's parameters kernels read, and under
// which names.
//
// After post-processing, a layer's parameter table mixes what kernels read
// with what only the loader writes: checkpoint parameters that were converted
// and retired, parameters emptied or set to None, and objects registered under
// a checkpoint name and a runtime name at once (move_parameter). These
// functions keep that bookkeeping on the parameter objects themselves
// (attributes `retired` and `runtime_name`) so that it survives reloads.
//
// Invariant: nothing here touches tensor data, storages or layouts; only
// names and attributes change. A parameter that is retired or renamed keeps
// its object and its storage, so the loader can write into it again.
#pragma once

#include "utils/layer.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace reloadsafe {

/// `_is_live(param)`. Decision: a parameter is live when it is present (not
/// None), not marked retired (attribute `retired` truthy), and has at least
/// one element.
bool is_live(const at::Tensor& param);

/// `get_live_param(layer, name)`: what `getattr(layer, name, None)` finds,
/// except that a parameter that is not live reads as None (undefined). Plain
/// tensor attributes and buffers are returned as they are, empty or not.
/// Throws if `name` is a submodule. Addresses: returns the held object
/// itself (no copy, no view), so its data pointer is the one kernels use.
at::Tensor get_live_param(const Layer& layer, const std::string& name);

/// `kernel_parameters(layer)`: the live parameters, each object once, in the
/// order of Python's dict: an object is listed under the first name that holds
/// it, unless it was moved (move_parameter) and a later name is its
/// `runtime_name`, in which case it is listed under that name, at the position
/// where that name comes. Addresses: the listed tensors are the parameter
/// objects themselves; nothing is copied.
std::vector<std::pair<std::string, at::Tensor>> kernel_parameters(const Layer& layer);

/// `move_parameter(layer, src_name, dst_name)`: registers the parameter object
/// under `src_name` also under `dst_name`, and makes `dst_name` its runtime
/// name. Both names then hold one object and so one storage; a later
/// replace_parameter on either name that keeps the object updates both.
/// Never allocates or copies.
///
/// Throws if `src_name` holds no parameter (absent, None or not a parameter),
/// if `dst_name` holds another parameter, or if `dst_name` is used by a
/// buffer, submodule or plain attribute; every check comes before any change
/// (the reference registers `dst_name` as None before failing on a None
/// source; the port leaves the layer as it was). Decision: if `dst_name` already holds
/// this very object, the registration is left as it is; the runtime name
/// still becomes `dst_name`, as in every move.
void move_parameter(Layer& layer, const std::string& src_name, const std::string& dst_name);

/// `retire_parameter(layer, name)`: marks what `name` holds as retired
/// (attribute `retired = true`). It stays registered with its data, so it can
/// be loaded again; is_live, get_live_param and kernel_parameters skip it.
/// Throws if `name` holds nothing or None. Decision: throws on a submodule
/// too (the reference marks the module object, which no utility reads).
/// Addresses: the data stays where it
/// is, so a reload can load into it again.
void retire_parameter(Layer& layer, const std::string& name);

}  // namespace reloadsafe
