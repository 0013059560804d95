// layer_state.h: what a layer holds, by name (its tensors and its host
// numbers), and how two layers' holdings differ.
//
// Three harness steps read it (steps/): compare_state holds a reloaded
// layer's state against a cold load's of the same checkpoint (and
// compare_forward_state after the forward), and host_numbers holds the numbers a layer reaches to
// the values they had when the forward was captured, since a CUDA graph bakes a number a kernel
// takes as an argument into its launch.
//
// Invariant: comparing reads both sides and writes neither; a tensor is
// compared on a CPU copy, never on (or into) its own storage.
#pragma once

#include "conformance/trace/named_tensor.h"

#include <string>
#include <vector>

namespace reloadsafe::harness {

using trace::NamedTensor;

/// A host number the layer reaches (an int or float attribute, a field of
/// a kernel object), by the name an engine gives it ("_k_scale_float").
struct NamedNumber {
  std::string name;
  double value = 0;
  /// An integer (printed without a fraction); a float otherwise.
  bool integral = false;
};

/// `n`'s value as Python prints it: "3", "0.5", "1.0", "nan", "inf".
std::string format_number(const NamedNumber& n);

/// What a layer holds, by name.
struct LayerState {
  std::vector<NamedTensor> tensors;
  std::vector<NamedNumber> numbers;
};

/// One name whose value differs: `before` is the reference side's (a
/// number, or "cold load <dtype>[<shape>]" for a tensor), `after` the live
/// side's (a number, or how far the tensor is off).
struct StateDifference {
  std::string name;
  std::string before;
  std::string after;
};

/// Every name both `live` and `cold` hold whose value differs: tensors
/// first, in `live`'s order, then numbers. Tensors without elements, on
/// the meta device, or without a plain storage are not compared. Floating
/// values within rtol 1e-5 and atol 1e-6 are equal (the same arithmetic in
/// another order), and NaN equals NaN; integers and booleans must be equal.
std::vector<StateDifference> state_differences(const LayerState& live, const LayerState& cold);

}  // namespace reloadsafe::harness
