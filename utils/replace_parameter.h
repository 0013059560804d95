// replace_parameter.h: putting post-processed tensors where kernels and
// captured CUDA graphs already look.
//
// Post-processing turns loaded weights into what kernels read (repacks,
// padding, transposes, derived tensors). Done naively, each step allocates a
// new tensor, and a CUDA graph captured earlier keeps reading the old address.
// These functions store the result under the old name and, wherever the rules
// allow, at the old address:
//
//  - replace_parameter keeps the parameter object (and so its weight loader
//    and its class) and, when the layout matches, copies into it in place;
//    a smaller or equal-size result is placed into the loaded storage, and on
//    a direct reload anything that fits the whole storage is (storage_fit.h).
//  - refill_derived refills a derived plain attribute in place when the new
//    value has the same shape, dtype and device.
//
// Invariant: no function here grows, shrinks or reallocates an existing
// storage. When a tensor keeps its address, its storage's data pointer and
// byte size are unchanged and only the bytes it spans are written. When it
// cannot keep its address, the name is rebound to the new tensor's storage
// and the old storage is left untouched.
#pragma once

#include "utils/layer.h"

#include <ATen/core/Tensor.h>

#include <string>

namespace reloadsafe {

/// `replace_parameter(layer, param_name, new_tensor)`.
///
/// With `new_tensor` None (undefined): `param_name` is set to None.
/// Otherwise the attributes of `new_tensor` except `weight_loader`,
/// `_weight_loader` and `_ckpt` are carried to the result, and:
///
///  - If `param_name` holds a parameter that is not a requantization source
///    (`requantization_source` truthy) and is not a meta parameter receiving
///    real data, that object is kept:
///     * same shape, strides, dtype and device: `new_tensor` is copied into
///       it. Address, storage and layout are unchanged.
///     * else, if the layer's quant method uses the meta device (online
///       quantization): the object is rebound to `new_tensor`'s data, and the
///       source storage is released.
///     * else: the object is rebound to in_own_storage(param, new_tensor,
///       direct_reload_enabled()): the old address when it fits, else
///       `new_tensor`'s data.
///  - Otherwise a new parameter object sharing `new_tensor`'s storage is
///    registered under `param_name`, inheriting the old one's loader as
///    `weight_loader`: its `weight_loader`, else, if the old one is a
///    parameter, its `_weight_loader` (the field behind vLLM parameters'
///    `weight_loader` property), if it has one.
///
/// Addresses: the old storage is never resized or moved. After a call in
/// which the parameter kept its address, a view of the old data taken before
/// the call may now see other bytes (on a direct reload a grown weight fills
/// more of the storage): read through the parameter, not an old alias.
/// Not for tied or shared weights. Throws if `param_name` is a buffer.
void replace_parameter(Layer& layer, const std::string& param_name, const at::Tensor& new_tensor);

/// `set_kernel_parameter(layer, name, tensor)`: replace_parameter for a
/// tensor that kernels read under `name`; afterwards the parameter is live
/// even if it was retired, and if it has a runtime name (it is registered
/// under several names), the runtime name becomes `name`. Same address rules
/// as replace_parameter. Decision: `tensor` None is rejected before anything
/// changes (the reference fails after setting the parameter to None).
void set_kernel_parameter(Layer& layer, const std::string& name, const at::Tensor& tensor);

/// `refill_derived(obj, name, new_tensor)`: sets the plain attribute `name`
/// of `obj` to a tensor derived from the weights, and returns what `name`
/// holds afterwards.
///
/// If `name` holds a tensor with the same shape, dtype and device as
/// `new_tensor`, that tensor is refilled in place (copy_) and returned: same
/// object, address and storage. Otherwise `name` is rebound to `new_tensor`
/// (None included) and `new_tensor` is returned.
///
/// Decisions: `name` must not be a parameter or buffer (use
/// replace_parameter); and the held tensor must own its storage (start at
/// offset 0 and span all of it, and share it with no parameter or buffer
/// of `obj` or of a module under it), because refilling a view or an alias
/// would write into whatever else lives on that storage: a copy-back into
/// a buffer aliasing a freshly loaded weight reverted it (vLLM #42481).
/// All are checked before any write.
/// A held tensor with no elements writes nothing, so it is refilled (and
/// returned) whatever storage it is on, as in the reference.
at::Tensor refill_derived(Layer& obj, const std::string& name, const at::Tensor& new_tensor);

}  // namespace reloadsafe
