// protocol.h: the reload protocol, over any layer under test.
//
// What a captured CUDA graph needs from a reload: every tensor its kernels
// read is at the address, on the storage and in the layout it had at
// capture, and holds the new weights. The protocol checks exactly that, for
// any ReloadSubject (subject.h: a C++ Backend through its adapter in
// harness.h, or a Python layer through the Python module), once per reload
// mode:
//
//   1. cold load; one warm-up forward (engines warm up before they capture);
//      then the forward traced once with a ReadTrace: the captured read set,
//      in op order, with every tensor argument held as the capture held it
//      (see conformance/trace/capture.h); on a device (CUDA), the forward
//      also captured as a device graph, with the device quarantine from then
//      on (device_graph.h);
//   2. many reloads (the direct mode inside a DirectReloadScope) of
//      value-changing checkpoints;
//   3. after each reload:
//      - on a device, first of all, the captured graph replayed: its output
//        equals the forward of a fresh cold load (violation
//        "cuda graph replay"; a forward that cannot be captured is the
//        violation "cuda graph", capture failed);
//      - every declared tensor kept its name, address, storage, storage size
//        and layout; none appeared or vanished;
//      - the forward traced again issues the captured op sequence, and every
//        external read is at the captured data pointer, on the captured
//        storage, with the captured layout (whether declared or not);
//      - the captured ops replayed against the held tensors give the forward
//        of a fresh cold load of the same checkpoint (a stale read shows as
//        wrong output, as on a GPU);
//      - the live forward equals that fresh forward;
//      - checkpoint tensors and a canary are byte-for-byte unchanged, and
//        the input still holds the values it was drawn with;
//   4. the bytes held in live tensor storages do not grow after the first
//      reload (beyond the subject's tolerance).
//
// The harness steps (step.h, listed in step_table.h), where the run or the
// subject asks for them, hook in at the phases of each mode: before each
// reload (a sleep and wake, parameters re-created), around its load (the
// peak of live bytes), after it (host numbers, state against a cold load,
// the footprint) and after its forward. Each name they flag is flagged once
// per mode, at the first reload that shows it.
//
// Every broken promise is a Violation (report.h) naming the tensor (and, for
// a traced read, the op and argument), with before and after. External reads
// the subject did not declare but that stay put are warnings.
//
// Seeds (run_options.h): the first checkpoint is drawn from RunOptions::seed,
// the input from input_seed(seed) (once per run: each mode's forward is
// handed a copy), reload r's checkpoint from reload_seed(seed, r): both
// modes reload the same checkpoints.
//
// Note [What a check keeps alive]
// A check stands in for the loop a user would run without it: a layer built
// once, a checkpoint loaded into it, a forward, again and again. That loop
// holds the layer and one checkpoint; a check is worth running on a real
// model only if it holds little more. What it keeps alive, phase by phase
// (on the CPU; on a device the layers' memory is on the device and the
// checkpoint on the host):
//
//   - before the first mode: the first layer the subject builds (which is
//     the first mode's live layer), and the subject's template of it without
//     its parameters' bytes (Note [Layers made aside by copying] in
//     layer_life.h); the checkpoint pools, a few MiB whatever the model
//     (Note [Checkpoints from a pool] in checkpoint_pools.h);
//   - the cold load: the live layer and its checkpoint; the copy that proves
//     copies is made on that checkpoint's tensors (Note [A copy on its
//     checkpoint]), so it adds what the load does not copy in place; the
//     checkpoint is let go of before reload 1's is drawn for the check that
//     the forward reads the weights (cold_start.h): one checkpoint at a time;
//   - the capture: the forward's own tensors (activations, every op's
//     results), which a captured graph's pool holds too: a few MB at 16
//     tokens, growing with the tokens, not with the weights;
//   - each reload: the live layer, the reload's checkpoint and its digest
//     (Note [A digest instead of a copy] in digest.h: a copy to tell whether
//     the load wrote into it was a model more), and the cold load it is
//     compared with, a copy made on the checkpoint (no memory of its own
//     where the load copies each tensor into the parameter of its name;
//     a layer's worth where a loader transforms or a post-processing writes
//     in place, as the proof found); freed blocks kept for reuse up to one
//     checkpoint's bytes (Note [Reusing freed blocks] in memory_census.h);
//     a cold-load output kept per reload for the second mode;
//   - the second mode: the first mode's live layer let go of, a copy as its
//     live layer (Note [The second mode's live layer] in protocol.cc).
//
// No less will do: the live layer is what is checked and the checkpoint
// what it loads (the loop's own two); a reload is judged against a fresh
// cold load of the same checkpoint, which needs a layer loaded from it; the
// capture must hold what a graph would read. So a correct reload of a whole
// model is checked within the loop's memory and its capture (a Llama of
// 0.55 B parameters: 117 MB above the loop's 4.9 GB, bench/check_bench.py),
// and within a layer more where the copies cannot be made on the
// checkpoint. A reload that moves weights keeps more alive, by design: the
// capture keeps what it captured (a graph reads it stale) and the
// quarantine what later reloads moved away from, poisoned (Note [Poison
// quarantine]); one that moves every weight holds two models more than its
// loop.
#pragma once

#include "conformance/harness/report.h"
#include "conformance/harness/run_options.h"
#include "conformance/harness/subject.h"
#include "conformance/trace/capture.h"

#include <vector>

namespace reloadsafe::harness {

/// Runs the protocol for `subject` in both modes, with the steps the run's
/// options and the subject ask for (merge_steps). Steps that are not
/// well-formed (check_steps in step_table.h) are refused before anything
/// runs.
BackendReport run_subject(ReloadSubject& subject, const RunOptions& options);

/// The reads of the forward as the protocol captures it: after a cold load
/// of the checkpoint of `seed` and one warm-up forward, every external read
/// with its op, argument, name and layout (for `reload_harness --trace`).
std::vector<trace::CapturedRead> captured_reads(ReloadSubject& subject, const RunOptions& options);

}  // namespace reloadsafe::harness
