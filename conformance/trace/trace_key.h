// trace_key.h: the dispatch key the read trace owns.
//
// Invariant: only the read trace (read_trace.h) registers a kernel for this
// key; everything else that runs while a trace is active only includes or
// excludes it, to stay visible or invisible to the trace.
#pragma once

#include <c10/core/DispatchKey.h>

namespace reloadsafe::trace {

/// The trace's key (Note [Why a mode-key fallback and not RecordFunction] in
/// read_trace.h): it sits above autograd, functionalization and the Python
/// key, and nothing in PyTorch registers a kernel for it.
constexpr c10::DispatchKey kTraceKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

}  // namespace reloadsafe::trace
