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
// The mixing (digest_bytes): a tensor's bytes in 32 lanes of four bytes,
// each lane's step x -> (x ^ w) * odd a bijection of the lane and of the
// word, as is each step of the fold of the lanes into 64 bits, so a single
// changed four-byte word always changes the result; AVX2 runs the lanes
// eight to a register where the CPU has it. A tensor of more than 8 MiB is digested
// in runs of 8 MiB on the intra-op threads, the runs' digests mixed in
// order (the same digest on any number of threads: at a real model's size a
// digest is a pass over a whole checkpoint per reload). Names, dtypes and
// sizes are mixed in before the bytes. A checkpoint the protocol's pools
// drew is digested as it is drawn, each run right after it is written
// (TensorDigest, note_digest): the reload's digest of it then reads nothing.
//
// Invariant: a digest reads the tensors it is given and writes nothing. A
// tensor whose bytes are not plain CPU memory (another device, a Python
// subclass, a sparse or conjugated view) has no digest; CheckpointDigest
// keeps a copy of such a tensor instead (they are small, or not the CPU
// checkpoints the protocol draws).
#pragma once

#include "conformance/harness/subject.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
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

/// The digest of the `n` bytes at `bytes` from `seed` (Note [A digest
/// instead of a copy]): the fastest implementation this CPU runs, or with
/// `portable` the plain C++ one; the two give the same digest.
uint64_t digest_bytes(uint64_t seed, const void* bytes, size_t n, bool portable = false);

/// The bytes of a tensor are digested in runs of this many (Note [A digest
/// instead of a copy]): run k is bytes [k * kDigestRun, (k + 1) * kDigestRun).
constexpr size_t kDigestRun = size_t{8} << 20;

/// A tensor's digest, as a checkpoint's entry (CheckpointDigest) takes it,
/// from its bytes run by run: for code that writes those bytes and would
/// otherwise read them all again to digest them (CheckpointPools::draw
/// digests each run as it writes it, while the run is in the cache).
class TensorDigest {
 public:
  /// For a contiguous tensor of `dtype` and `sizes`, `nbytes` long.
  TensorDigest(at::ScalarType dtype, at::IntArrayRef sizes, size_t nbytes);
  /// For `nbytes` mixed into `seed` (mix_tensor's bytes).
  TensorDigest(uint64_t seed, size_t nbytes);

  /// How many runs the bytes make (at least one).
  int64_t runs() const { return static_cast<int64_t>(runs_.size()); }
  /// Digests run `k`, whose bytes start at `bytes`; each run once, runs
  /// on any threads.
  void run(int64_t k, const void* bytes);
  /// The digest, once every run is digested.
  uint64_t value() const;

 private:
  uint64_t seed_;
  size_t nbytes_;
  std::vector<uint64_t> runs_;
};

/// Notes `digest` (TensorDigest's) as the digest of `t` as it is now, for
/// the code that made `t` and digested it while writing it: a
/// CheckpointDigest then takes it instead of reading `t` again, for as long
/// as `t`'s version counter says no in-place op wrote into it. (A write
/// through a raw pointer, which no version counter sees, between the note
/// and the CheckpointDigest goes unseen: only the maker notes.)
void note_digest(const at::Tensor& t, uint64_t digest);

/// The digest noted for `t` (note_digest), if `t` is the tensor noted and
/// unchanged since by its version counter.
std::optional<uint64_t> noted_digest(const at::Tensor& t);

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
