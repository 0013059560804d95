// all_close.h: at::allclose(a, b, rtol, atol, /*equal_nan=*/true) in one
// pass, for the protocol's output and state comparisons.
//
// The protocol compares two forward outputs after every reload (the live
// forward and the captured replay, each against a fresh cold load), and
// under compare_state every tensor the layer holds (layer_state.h).
// at::allclose builds a dozen temporaries (==, isnan, -, abs, *, +, <=,
// isfinite, &, |, all) and dispatches each of them: on a small layer's
// output that was half of a harness run's instructions (callgrind, the
// `transposed` sample). This decides the same thing element by element.
//
// Invariant: where it answers, the answer is at::allclose's with
// equal_nan=true: an element is close when both are equal (infinities
// included), both are NaN, or |a - b| is finite and <= atol + |rtol * b|,
// computed in the tensors' dtype as at::isclose computes it. It answers for
// CPU tensors of one dtype, float or double, of the same sizes, without the
// negative bit (a non-contiguous one is read through a contiguous copy);
// std::nullopt otherwise (ask at::allclose).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace reloadsafe::harness {

std::optional<bool> all_close(const at::Tensor& a, const at::Tensor& b, double rtol, double atol);

}  // namespace reloadsafe::harness
