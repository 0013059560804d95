// cold_loads.h: the forwards of cold loads the protocol compares reloads
// with, and digests of their states, kept across modes where they are the
// same, and shared between the checks of one reload.
//
// Note [One cold load per checkpoint]
// Each reload's outputs are compared with the forward of a fresh cold load
// of the same checkpoint. Both modes reload the same checkpoints (the seeds
// depend on the reload's number only) into the same input, so the second
// mode's cold loads would recompute the first's: a new layer, a load, a
// post-processing and a forward per reload, as much as the reload itself.
// On the CPU each cold-load output is kept for the mode after (as it is
// where the output is the only handle on a storage of its own, else a copy
// of its bytes), with a fingerprint of what it was computed from (the
// checkpoint's digest, taken once when the reload drew it: every tensor's
// name, dtype, sizes and bytes (Note [A digest instead of a copy] in
// digest.h); and the input's bytes), and reused only when the later checkpoint and input have the
// same fingerprint; a subject whose checkpoints or inputs differ for the same seed gets its own
// cold loads as before. A cold load that depends on anything but the checkpoint (a random rotation
// drawn at load) fails the comparison within the first mode already. The kept outputs are the
// protocol's, not the subject's: the memory census of the mode that makes them does not count them.
//
// Note [A cold state kept as its digest]
// compare_state compares each reload's live state with the state of a cold
// load of the same checkpoint, in both modes; the second mode's cold loads
// would rebuild the first's layers. Keeping those states would keep a whole
// layer per reload, so what is kept is a digest of each (64 bits, mixed as
// the fingerprint is: every name, each tensor's dtype, sizes and bytes, a
// sparse tensor part by part, each host number's bits), under the reload's
// number and its checkpoint's fingerprint. A later mode's live state with
// the same digest holds, name by name, the bytes the cold load held: no
// difference to find, and no layer is built aside. Any other state, or one
// a digest cannot read (off the CPU, a tensor subclass), is compared with a
// fresh cold load as before. As for the kept outputs, a false match needs
// two 64-bit digests of different states to collide.
//
// Note [One cold layer per reload]
// Within one reload, compare_state builds a cold load of the checkpoint to
// read its state, and the forward check then needs the forward of a cold
// load of the same checkpoint: two layers built, loaded and post-processed
// alike, the second for one forward. The first serves both. Right after
// its state is read (no forward has run on it: state a forward writes is
// not the reload's), it runs its forward on a copy of the run's input,
// still within the scope that emptied the module caches for it, and the
// output is offered to the reload's forward check: forward() takes it in
// place of a new cold load when its input holds the bytes the offer was
// computed on (else the live forward wrote its input, and the cold load is
// made as before), and keeps it for the next mode as it would its own. The
// live forward runs between the two, so an output that shares its bytes (a
// view of a buffer kept at module scope) is offered as a copy. An offer is
// for the forward() that follows it and no other: that call drops it, and
// the mode drops one left over (a reload that raised before its forward)
// at the next reload and at its end.
//
// Invariant: a kept output is reused only for the same reload number and a
// checkpoint and input with the same fingerprint; anything else is computed
// afresh. The same holds for a kept state digest. An offered output answers
// only the next forward() of its reload, on an input of the same bytes.
#pragma once

#include "conformance/harness/digest.h"
#include "conformance/harness/layer_state.h"
#include "conformance/harness/subject.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace reloadsafe::harness {

/// The cold-load outputs of one run (Note [One cold load per checkpoint]),
/// and the digests of the cold states compare_state saw (Note [A cold state
/// kept as its digest]).
class ColdLoadOutputs {
 public:
  /// `keep`: keep outputs for a later mode (on the CPU).
  explicit ColdLoadOutputs(bool keep) : keep_(keep) {}

  // Every `ckpt` below is the digest of a checkpoint (CheckpointDigest::
  // whole() in digest.h): nothing, where the checkpoint has none, keeps and
  // reuses nothing.

  /// The cold-load forward for reload `r` of `ckpt` on `x`: a kept one with
  /// the same fingerprint, else the offered one (offer()), else
  /// `cold_forward()`; the one returned is kept for the next mode if reload
  /// `r` has none kept yet. Drops the offer, taken or not.
  at::Tensor forward(int r, std::optional<uint64_t> ckpt, const at::Tensor& x,
                     const std::function<at::Tensor()>& cold_forward);

  /// Whether forward(r, ckpt, x, ...) would return a kept output without
  /// computing one (so an offer would go unused).
  bool has_kept_forward(int r, std::optional<uint64_t> ckpt, const at::Tensor& x) const;
  /// Offers `out`, the forward on `input` of a cold load of reload `r`'s
  /// checkpoint that another check of the reload built, to the next
  /// forward() (Note [One cold layer per reload]); replaces any earlier one.
  /// An output that shares its bytes is offered as a copy.
  void offer(int r, at::Tensor input, at::Tensor out);
  /// Drops an offer no forward() took.
  void drop_offer() { offered_.reset(); }

  /// Keeps the digest of `cold`, the state of a cold load for reload `r` of
  /// `ckpt` with input `x`, for a later mode (Note [A cold state kept as its
  /// digest]); nothing where outputs are not kept or `cold` has no digest.
  void keep_state(int r, std::optional<uint64_t> ckpt, const at::Tensor& x, const LayerState& cold);
  /// Whether `live` holds exactly the state kept for reload `r` of the same
  /// `ckpt` and `x`: then a cold load would show no difference from it.
  bool matches_kept_state(int r, std::optional<uint64_t> ckpt, const at::Tensor& x,
                          const LayerState& live) const;

  /// Bytes of the copies kept so far (the census discounts those made in its mode).
  int64_t kept_bytes() const { return kept_bytes_; }

  /// Where each kept output's bytes start (counted by kept_bytes(), so the
  /// census of the layers made aside leaves them out).
  std::vector<const void*> kept_data() const;

 private:
  struct Kept {
    uint64_t fingerprint;
    at::Tensor output;
  };
  struct KeptState {
    uint64_t fingerprint;
    uint64_t digest;
  };
  struct Offered {
    int reload;
    at::Tensor input;  // what the output was computed on
    at::Tensor output;
  };
  bool keep_;
  std::optional<Offered> offered_;
  std::map<int, Kept> kept_;
  std::map<int, KeptState> kept_states_;
  int64_t kept_bytes_ = 0;
};

}  // namespace reloadsafe::harness
