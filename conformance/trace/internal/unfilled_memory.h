// unfilled_memory.h: memory a captured forward allocated with an empty-like
// op and filled without one, watched call by call while the capture runs.
//
// torch.tensor(data) is an empty() that PyTorch fills from the Python data
// in C++, with no op, then a to(), a lift_fresh() and a detach_() (Hugging
// Face's GPT-2 indexes with such a tensor, Recurrent Gemma adds one to its
// positions, Mamba counts with one). A replay re-runs the empty() and gets
// new memory holding whatever it held; the op that reads it computes from
// that, or raises. A kernel called without the dispatcher (a C++ extension's
// own binding) writes an empty() the same way, but from the weights: no
// bytes held at the capture stand for what it computes after a reload.
//
// UnfilledMemory follows every storage a top-level empty-like call made
// until an op fills it (writes it: copy_, fill_, index_put_, an out=
// argument; not an elementwise in-place op such as add_, which reads what
// it writes) or reads it. A read is of Python data when the storage,
// or what the reading call made of it, reaches lift_fresh() next, which
// PyTorch calls on a tensor it made from data and on nothing else: then it
// keeps a copy of the bytes, before any later op can write them (a counter
// that add_() bumps). Anything else read that way was written outside the
// dispatcher, and a replay cannot rebuild it.
//
// The out-of-place form of an op that fills its first argument (index_put,
// copy, slice_scatter: what functionalization makes of index_put_ and of a
// copy_ into a slice) fills its result the same way, and counts as no read.
//
// What reads no value: a factory that takes a tensor for its sizes, dtype
// and device only (new_zeros, empty_like); an op whose result is a view of
// the argument (its schema's alias annotation says it may, and a result on
// the same storage says it did: a view, a to() or reshape() that copied
// nothing); an in-place view op (detach_, unsqueeze_: tagged inplace_view),
// which writes sizes, not bytes. resize_ and set_ carry that tag too but may
// give the tensor other memory: they count as reads.
//
// Invariant: runs no op except the copy of Python data's bytes, which the
// caller runs outside its trace; changes no tensor.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/ArrayRef.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace reloadsafe::trace {

/// Whether `op` allocates memory it leaves unwritten (empty, empty_strided,
/// empty_like, new_empty, new_empty_strided).
bool allocates_unfilled(const c10::OperatorHandle& op);

/// The memory a capture's empty-like calls made and what filled it.
class UnfilledMemory {
 public:
  /// Before the top-level call `op` runs with `args`.
  void before(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);
  /// After it ran with `returns`.
  void after(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> returns);

  /// For a storage an empty-like call made: the bytes PyTorch filled it with
  /// from Python data, as the tensor that call returned (same sizes and
  /// strides); null if none.
  const at::Tensor* python_data(const c10::StorageImpl* made) const;
  /// Why a replay cannot rebuild what the forward read: the first call that
  /// read memory an empty-like call made that neither an op nor Python data
  /// filled; empty if none. Known once the capture ended.
  std::string written_outside() const;

 private:
  struct Read {
    at::Tensor made_empty;  // what the empty-like call returned
    std::string by;         // the first op that read it
    size_t order = 0;       // among the reads
    at::Tensor data;        // a copy, once it reached lift_fresh(): Python data
    std::vector<const c10::StorageImpl*> results;  // what the reading call returned
  };
  Read& first_read(const c10::StorageImpl* storage, const std::string& by);
  void python_data_reached(Read& read);

  // Storage -> the tensor the empty-like call returned, until filled or read.
  std::unordered_map<const c10::StorageImpl*, at::Tensor> unfilled_;
  std::unordered_map<const c10::StorageImpl*, Read> read_;
  std::vector<const c10::StorageImpl*> read_now_;    // first read by the call running
  std::vector<const c10::StorageImpl*> alias_args_;  // read unless a result aliases it
};

}  // namespace reloadsafe::trace
