// device_graph.h: the forward as a captured device graph runs it, for the
// protocol's graph step on CUDA.
//
// A captured graph replays the kernels it recorded on the addresses it
// recorded. The protocol captures the live forward once (after its cold
// load, warm-up and trace capture) and replays the graph right after every
// reload, before anything else runs, comparing the replay's output with a
// fresh cold load's forward.
//
// Invariant (Note [Device quarantine]): from the capture until the graph is
// destroyed, no device block that is free, or freed later, is handed out
// again: every allocation on the device goes to a pool of its own. Before
// each replay every free block of the device's default pool, where the
// captured layer's tensors live, is zeroed (zeros keep a stale index read in
// bounds, where 0xff would trip a device-side assert), and the graph's
// output is filled with NaN (or -1). A replay that reads an address a reload
// abandoned therefore reads zeros on every reload, never a block the
// allocator happened to hand back to the rebuilt tensor. Nothing here
// resizes, moves or writes a live tensor.
//
// The CUDA implementation (device_graph_cuda.cc) is linked only where the
// CUDA Toolkit was found at build time; it registers itself when its
// library is loaded. This header and its source compile everywhere.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>

namespace reloadsafe::harness {

/// A forward captured as a device graph. Destroying it ends the quarantine
/// and releases the graph's memory.
class CapturedDeviceGraph {
 public:
  virtual ~CapturedDeviceGraph() = default;

  /// Poisons the graph's output, zeroes every free block of the device's
  /// default pool, replays the graph, waits for it and returns a copy of its
  /// output (on the device).
  virtual at::Tensor replay() = 0;
};

/// Captures `forward` on `device` as a graph: one warm-up call and one
/// captured call on a side stream, then the quarantine begins. Throws
/// c10::Error with the device's reason when the forward cannot be captured
/// (it synchronises, copies to the host, ...).
using DeviceGraphCapture = std::unique_ptr<CapturedDeviceGraph> (*)(
    const c10::Device& device, const std::function<at::Tensor()>& forward);

/// The capture for `type`'s graphs, or nullptr where this binary has none
/// linked (a build without the CUDA Toolkit).
DeviceGraphCapture device_graph_capture(c10::DeviceType type);

/// Registers the capture for `type` (called from a static initialiser of the
/// library that implements it).
bool register_device_graph_capture(c10::DeviceType type, DeviceGraphCapture capture);

/// Whether this binary can run on CUDA at all, and why not: "" when it
/// can (CUDA kernels and the graph step linked, a device visible), else one
/// sentence that tells "built without CUDA" from "no CUDA device visible".
std::string cuda_unavailable_reason();

/// What this binary has of CUDA, in one line, e.g. "CUDA linked (aten::mm has
/// a CUDA kernel, graph step linked); 0 devices visible".
std::string cuda_build_info();

}  // namespace reloadsafe::harness
