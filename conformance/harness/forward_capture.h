// forward_capture.h: a mode's forward as the protocol captures it (the
// read trace's CapturedForward, with the names its reads are given), and
// what the capture reads from outside the forward.
//
// Invariant: the names a capture gives its reads are the live layer's, as
// named when the capture was made (its tensors and objects, and the input),
// so a reload's retrace is compared with what the capture saw, not with
// what the layer names after the reload.
#pragma once

#include "conformance/harness/report.h"
#include "conformance/harness/subject.h"
#include "conformance/trace/capture.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace reloadsafe::harness {

/// The captured forward and the names its reads are given.
struct ForwardCapture {
  std::unique_ptr<trace::TensorNames> names;
  std::unique_ptr<trace::CapturedForward> forward;
};

/// `layer`'s forward on `x`, captured (every op and every tensor it reads),
/// its reads named by the layer's tensors and objects and "input".
ForwardCapture capture_forward(SubjectLayer& layer, const at::Tensor& x);

/// How many distinct tensors and objects (by storage or identity) `reads`
/// has from outside the forward, declared and undeclared: the input, Python
/// subclass wrappers (checked through their inner reads) and tensors without
/// storage are not counted. An undeclared tensor the forward reads only
/// through aten::lift_fresh_copy is a constant of compiled code (Note [A
/// compiled graph's constants]), counted apart.
struct DistinctReads {
  std::vector<const trace::CapturedRead*> declared;
  std::vector<const trace::CapturedRead*> undeclared;  ///< the first read of each
  std::vector<const trace::CapturedRead*> constants;   ///< the first read of each
};
DistinctReads distinct_reads(const std::vector<trace::CapturedRead>& reads);

/// Counts the distinct tensors `capture` reads from outside into `report`
/// (declared_reads, undeclared_reads; constants of compiled code in
/// neither), warns once for each undeclared one,
/// and throws c10::Error for a forward the trace cannot see (no op on the
/// calling thread, or no read besides the input).
void count_reads(const ForwardCapture& capture, ModeReport& report);

}  // namespace reloadsafe::harness
