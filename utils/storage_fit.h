// storage_fit.h: placing a tensor into the bytes of an existing storage.
//
// A captured CUDA graph reads a weight at the address it had at capture. A
// weight keeps that address across post-processing and reloads only if its
// new contents are written into the storage it already has, at the same byte
// offset. These functions decide whether a new layout fits there and, if it
// does, write it there.
//
// Invariant: no function here grows, shrinks, reallocates or moves a storage.
// A storage's data pointer and byte size are the same after every call as
// before it, and bytes outside the span a placed tensor covers are not
// written. LibTorch's `Tensor::set_` would silently grow a resizable storage
// (moving its data); every view here is bounds-checked before `set_`, with
// overflow-checked arithmetic. See Note [Why set_ is guarded].
//
// Usage:
//   at::Tensor placed = reloadsafe::in_own_storage(old, repacked);
//   bool kept = placed.storage().is_alias_of(old.storage());
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <optional>

namespace reloadsafe {

/// `_extent(t)`: the number of elements `t` spans in its storage, from its
/// first element to its last: 0 when `t` has no elements, else
/// `1 + sum((size - 1) * stride)`. Gaps count; elements shared by several
/// indices (zero strides) count once.
int64_t extent(const at::Tensor& t);

/// The extent of a layout given as sizes and strides (in elements), or
/// std::nullopt when the arithmetic overflows int64. Throws on negative sizes
/// or strides and on ranks that differ. For layouts from outside (case files,
/// fuzzers), which need not describe any real tensor.
std::optional<int64_t> checked_extent(c10::IntArrayRef sizes, c10::IntArrayRef strides);

/// `storage_view(storage, offset, shape, stride, dtype)`: a `dtype` tensor on
/// `storage` starting `offset` elements of `dtype` into it.
///
/// Never moves memory: the view shares `storage`, whose data pointer and size
/// stay as they are. Unlike the reference (whose `set_` trusts the caller),
/// this checks that the view fits the storage and throws if it does not,
/// instead of letting `set_` grow the storage.
at::Tensor storage_view(const c10::Storage& storage, int64_t offset, c10::IntArrayRef shape,
                        c10::IntArrayRef stride, at::ScalarType dtype);

/// `_in_own_storage(old, new, whole_storage)`: `new` copied into `old`'s
/// storage at `old`'s byte offset when it fits there, else `new` itself.
///
/// It fits when, on the same device and not already on `old`'s storage, at a
/// byte offset that is a multiple of `new`'s element size:
///  - default: `new` is non-empty and dense (no gaps, no shared elements),
///    `old` is dense too (its gaps could belong to another tensor), and `new`
///    has no more bytes than `old` (an equal-size repack to another dtype
///    fits);
///  - `whole_storage` (direct reload): `new` does not share elements and ends
///    within `old`'s storage, so it may be larger than `old`, have gaps (a
///    padded view) or be empty (the checkpoint bytes stay).
///
/// When it fits, the result is a view on `old`'s storage with `new`'s shape,
/// strides and dtype, holding `new`'s values; `old`'s storage keeps its data
/// pointer and size and only the bytes the result spans are written.
/// Otherwise nothing is written and `new` is returned as it is.
at::Tensor in_own_storage(const at::Tensor& old, const at::Tensor& new_tensor,
                          bool whole_storage = false);

}  // namespace reloadsafe
