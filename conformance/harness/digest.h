// digest.h: 64-bit digests of what tensors hold, and of a whole checkpoint,
// which tell that bytes are unchanged, or the same as others, without a copy
// of them.
//
//   CheckpointDigest pristine(ckpt);          // one pass over its bytes
//   ... the reload loads ckpt ...
//   for (const std::string& name : pristine.changed(ckpt)) report(name);
//
// Note [A digest instead of a copy]
// The protocol asks three questions of bytes it has no other use for: did a
// reload write into the checkpoint it loaded, was this checkpoint (with this
// input) the one an earlier mode's cold load was computed from (Note [One
// cold load per checkpoint] in cold_loads.h), does a live state hold what a
// cold load held (Note [A cold state kept as its digest]). A copy answers
// exactly, and at a real model's size costs that model's bytes for as long
// as it is kept: with the checkpoint's copy, a check held a whole model more
// than the loop it stands in for. A digest costs one pass over the bytes
// and eight bytes kept, and answers "the same" falsely only where two
// different byte strings of one length mix to the same 64 bits.
//
// The mixing: each tensor's bytes in four independent lanes of eight bytes
// (FNV-style, 64 bits: a multiply's latency is not waited for at every
// word); each step, x -> (x ^ w) * odd, is a bijection of the lane and of
// the word, as is each step of the fold of the lanes, so a single changed
// word always changes the result. A tensor of more than 8 MiB is digested
// in runs of 8 MiB on the intra-op threads, the runs' digests mixed in
// order (the same digest on any number of threads: at a real model's size a
// digest is a pass over a whole checkpoint per reload). Names, dtypes and
// sizes are mixed in before the bytes.
//
// Invariant: a digest reads the tensors it is given and writes nothing. A
// tensor whose bytes are not plain CPU memory (another device, a Python
// subclass, a sparse or conjugated view) has no digest; CheckpointDigest
// keeps a copy of such a tensor instead (they are small, or not the CPU
// checkpoints the protocol draws).
#pragma once

#include "conformance/harness/subject.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reloadsafe::harness {

/// Mixes `v` into the digest `h` (the order of mixing matters).
uint64_t mix(uint64_t h, uint64_t v);

/// Mixes `s`'s length and characters into `h`.
uint64_t mix_string(uint64_t h, std::string_view s);

/// Mixes `t`'s dtype, sizes and bytes into `*h`; false (and `*h` left as
/// it was) for a tensor whose bytes are not plain CPU memory.
bool mix_tensor(uint64_t* h, const at::Tensor& t);

/// The digests of a checkpoint's tensors, taken once (Note [A digest
/// instead of a copy]).
class CheckpointDigest {
 public:
  /// Digests every tensor of `ckpt`: one pass over its bytes.
  explicit CheckpointDigest(const Checkpoint& ckpt);

  /// The names of `ckpt`'s tensors that no longer hold what they held when
  /// digested (dtype, sizes, bytes), and of those it no longer has, in name
  /// order; empty when nothing changed. Once anything has changed, whole()
  /// has nothing: what was digested is no longer there to be computed from.
  std::vector<std::string> changed(const Checkpoint& ckpt);

  /// The digest of the whole checkpoint (names, dtypes, sizes, bytes);
  /// nothing where a tensor has no digest, or changed() found a change.
  std::optional<uint64_t> whole() const;

  /// Whether `other` digested the same names holding the same bytes.
  bool same_as(const CheckpointDigest& other) const;

 private:
  struct Entry {
    std::string name;
    std::optional<uint64_t> digest;
    at::Tensor copy;  // for a tensor without a digest
  };
  std::vector<Entry> entries_;  // in the checkpoint's (name) order
  bool changed_ = false;
};

}  // namespace reloadsafe::harness
