// reload_steps.h: what the sleep and recreate_parameters steps (steps/) do
// to a live layer between reloads: sleep and wake, and parameters
// re-created as a layerwise reload re-creates them.
//
// Engines free the GPU between RL rollouts (vLLM's sleep mode, SGLang's
// memory-saver pause). Both keep every address, since the memory is unmapped
// and mapped again, so a captured graph stays valid; but whatever wake does
// not restore holds garbage. vLLM's level 1 restores the weights from a host
// copy; level 2 discards them (the trainer's weights are loaded after wake)
// and restores only the registered buffers. A layerwise reload re-creates
// each parameter, uninitialised, before loading into it: padding or any
// element the loader does not write, which only construction zeroed, holds
// garbage too.
//
// Invariant: these steps write bytes in place and never grow, shrink,
// reallocate or replace a storage; every address the layer had, it keeps.
// The garbage is deterministic (NaN for floating and complex elements, a
// fixed integer otherwise), so what reads it shows in the value checks.
#pragma once

#include "conformance/trace/named_tensor.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace reloadsafe::harness {

/// Fills every element of `t`'s whole storage (not only the elements `t`
/// views), in place: NaN where `t`'s dtype is floating or complex, `integer`
/// otherwise (booleans: integer != 0). Tensors without elements, on the
/// meta device or without a plain storage are left alone.
void discard_storage(const at::Tensor& t, int64_t integer);

/// Sleep and wake. Sleep discards the contents of every
/// storage `reached` holds (each once; integers become 0, as fresh pages
/// are zeroed, so an index still indexes and the garbage is read, not
/// refused). Wake then copies back into `restored` what each held before
/// the sleep, through a host copy. What to restore is the caller's rule
/// (the protocol's: buffers at level 2; at level 1 all the cold load made).
void sleep_and_wake(const std::vector<trace::NamedTensor>& reached,
                    const std::vector<at::Tensor>& restored);

/// Before a layerwise reload's load: every tensor of `parameters` has its
/// whole storage filled with the sentinel (NaN, integers -1).
void recreate_parameters(const std::vector<at::Tensor>& parameters);

}  // namespace reloadsafe::harness
