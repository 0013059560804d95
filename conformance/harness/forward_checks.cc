#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/forward_checks.h"

#include "conformance/harness/values.h"
#include "conformance/trace/capture.h"
#include "conformance/trace/read_trace.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::harness {

using trace::kOpSequence;

void ForwardChecks::capture() {
  if (!mode_.options().trace) return;
  capture_ = capture_forward(mode_.live(), x_);
  count_reads(capture_, report_);
}

// Note [State every forward makes]
// A forward may bind a module attribute to a tensor it makes at every call:
// Recurrent Gemma's prefill sets its recurrent and convolution state to new
// tensors (zeros, then the scan's and the padding's results), so the
// attribute's address changes across any two forwards, reload or not.
// Under a CUDA graph those tensors are the graph's own (made in its pool
// and rewritten at every replay): no kernel reads them at an address the
// capture fixed before it. Where the captured forward's own ops made the
// tensor a name holds right after the capture (the trace saw it returned,
// never before), the name is left out of the declared-address check. What
// the forward reads of such state is still checked: a forward that reads
// the previous call's state (a decode step) reads it from outside, and
// the retrace after a reload sees that read move. A tensor made only by
// the first forward (a lazily built scale) was made by the warm-up, not
// the capture, and stays checked.
std::set<std::string> ForwardChecks::made_by_every_forward(
    const std::vector<trace::NamedTensor>& named) {
  std::set<std::string> out;
  if (!capture_.forward) return out;
  const trace::ReadTrace& trace = capture_.forward->trace();
  std::string names;  // the first few, in the layer's order
  constexpr size_t kNamed = 4;
  for (const trace::NamedTensor& n : named) {
    if (!n.declared || !trace::has_plain_storage(n.tensor)) continue;
    const std::optional<bool> external = trace.classify(n.tensor.storage().unsafeGetStorageImpl());
    if (!external.has_value() || *external) continue;
    if (!out.insert(n.name).second) continue;
    if (out.size() <= kNamed) names += (names.empty() ? "" : ", ") + n.name;
    captured_state_.insert(n.tensor.storage().unsafeGetStorageImpl());
  }
  if (out.size() > kNamed) names += " and " + std::to_string(out.size() - kNamed) + " more";
  if (!out.empty()) {
    report_.warnings.push_back(Warning{
        names, "",
        "made by every forward (the forward binds the name to a tensor its own ops make): state "
        "a graph would keep in its own memory; its address is not checked, what the forward "
        "reads of it is"});
  }
  return out;
}

int64_t ForwardChecks::state_only_the_capture_holds(
    const std::vector<trace::NamedTensor>& named) const {
  std::set<const c10::StorageImpl*> still_named;
  for (const trace::NamedTensor& n : named) {
    if (trace::has_plain_storage(n.tensor))
      still_named.insert(n.tensor.storage().unsafeGetStorageImpl());
  }
  int64_t bytes = 0;
  for (const c10::StorageImpl* storage : captured_state_) {
    if (still_named.count(storage) == 0) bytes += static_cast<int64_t>(storage->nbytes());
  }
  return bytes;
}

void ForwardChecks::check(const Reload& reload, const at::Tensor& replayed_graph,
                          const std::function<void()>& after_forward) {
  const int r = reload.index;
  const Checkpoint& ckpt = reload.checkpoint;
  ViolationSink& sink = mode_.sink();
  at::Tensor out;
  bool replays_as_retraced = false;
  bool follows_the_weights = false;
  // The first captured op the retrace handed other numbers or read at another place.
  std::optional<trace::ReadChange> new_args;
  const bool traced = mode_.options().trace;
  auto forward = [&] { out = mode_.live().forward(x_); };
  if (traced) {
    trace::CheckingRetrace retrace(*capture_.forward);
    const bool ran = mode_.layer_step_runs(r, "the forward after the reload", forward);
    retrace.stop();
    if (!ran) return;
    after_forward();
    std::vector<trace::ReadChange> changes =
        capture_.forward->compare(retrace, *capture_.names, sink.listing());
    const auto sequence = std::find_if(changes.begin(), changes.end(),
                                       [](const auto& c) { return c.tensor == kOpSequence; });
    if (sequence == changes.end()) new_args = capture_.forward->new_arguments(retrace);
    const trace::ReadChange* chosen = sequence != changes.end() ? &*sequence
                                      : new_args                ? &*new_args
                                                                : nullptr;
    if (chosen != nullptr && sequence_follows_the_weights(retrace, ckpt)) {
      follows_the_weights = true;
      warn_sequence_follows_the_weights(*chosen);
      // What the values chose is not compared: the op sequence, and every
      // read from the first change on.
      const size_t first = capture_.forward->first_change(retrace);
      changes.erase(
          std::remove_if(changes.begin(), changes.end(),
                         [&](const auto& c) { return c.tensor == kOpSequence || c.call >= first; }),
          changes.end());
    }
    for (trace::ReadChange& c : changes) {
      sink.add(r, std::move(c.tensor), std::move(c.what), std::move(c.before), std::move(c.after),
               std::move(c.read));
    }
    replays_as_retraced = capture_.forward->replays_as(retrace);
  } else {
    if (!mode_.layer_step_runs(r, "the forward after the reload", forward)) return;
    after_forward();
  }
  const at::Tensor expected = cold_loads_.forward(r, reload.checkpoint_digest, x_, [&] {
    return mode_.cold_forward_aside(ckpt, x_, /*built=*/false);
  });
  const bool out_close = close(out, expected);
  if (!out_close) {
    sink.add(r, "forward", "differs from a cold load of the same checkpoint", "cold load",
             sink.listing() ? max_diff(out, expected) : "");
  }
  if (traced && !follows_the_weights) {
    check_replay(r, expected, replays_as_retraced ? &out : nullptr, out_close, new_args);
  }
  if (replayed_graph.defined() && !close(replayed_graph, expected)) {
    sink.add(r, "cuda graph replay",
             "the captured graph, replayed, differs from a cold load (it read an address the "
             "reload abandoned, or a tensor the reload did not refill)",
             "cold load", sink.listing() ? max_diff(replayed_graph, expected) : "");
  }
}

// Note [An op sequence that follows the weights]
// Some forwards choose their ops by the values they compute: an MoE layer
// written with a loop over the experts that received tokens (Hugging
// Face's Qwen2-MoE and Mixtral) runs other ops when new weights route the
// tokens otherwise; one that sizes its experts' splits with tolist()
// (JetMoE) hands the same ops other numbers; compiled, Mixtral's loop reads
// each expert's slice of a fused weight through a view no op is handed the
// index of, so the same op reads another place of the same storage. Such a
// retrace differs from the capture after a correct reload. A CUDA graph
// cannot capture such a forward as one graph (it replays one sequence,
// with the numbers it was captured with, and a read of values on the host
// is no op a graph can hold), so the change is no reload bug: it is a
// property of the forward, and the protocol tells the two apart by asking a
// cold load of the same checkpoint, traced, on the same input: if it makes
// the retrace's calls (the same ops; where the retrace handed an op other
// numbers, those numbers; where it read another place of a storage, the
// same place of its own), and the capture read a value on the host before
// the first call that changed (without which no value could have chosen
// the ops or the numbers: a reload that moved work from its
// post-processing into the forward changes ops from the first, and a
// number post-processing computed, which a graph bakes in, changes with no
// read before it), the forward follows the weights. A read that moved to
// another storage is never taken for a value's choice. The reads before
// the first changed call are still compared, and every named tensor's
// location; the replay of the capture (one routing) is not compared with a
// forward that routes otherwise. Otherwise the change is the reload's: a
// changed op sequence is a violation, and new numbers show in the replay,
// which keeps the captured ones.
bool ForwardChecks::sequence_follows_the_weights(const trace::CheckingRetrace& retrace,
                                                 const Checkpoint& ckpt) {
  if (!capture_.forward->can_follow_values(retrace)) return false;  // no run to trace
  const at::Tensor x = mode_.input().clone();  // the aside forward may write its input
  trace::ReadTrace cold(trace::capture_trace_options());
  mode_.cold_forward_aside(ckpt, x, /*built=*/true);  // its calls are compared
  cold.stop();
  return capture_.forward->follows_values(retrace, cold.ops());
}

void ForwardChecks::warn_sequence_follows_the_weights(const trace::ReadChange& change) {
  if (warned_sequence_) return;
  warned_sequence_ = true;
  report_.warnings.push_back(
      Warning{std::string(kOpSequence), "",
              "the forward's ops follow the weights' values (" + change.what +
                  (change.before.empty() ? "" : ": " + change.before + " -> " + change.after) +
                  ", and a cold load of the same checkpoint makes the same calls): control "
                  "flow, numbers or places chosen by tensor values read on the host (an MoE loop "
                  "over the experts that got tokens, split sizes from tolist(), an expert's slice "
                  "of a fused weight) cannot be captured as one CUDA graph; named tensors and the "
                  "reads before that op are checked, the capture's replay is not"});
}

// `retraced`: the retraced forward's output, when the retrace made exactly
// the captured calls (CapturedForward::replays_as). That output is taken as
// the replay's instead of running the ops again: the same ops on the same
// bytes (Note [A retrace that is its own replay] in capture.cc), once a
// replay is known to run through: from the capture alone where it tells
// (replays_through), else after one replay has run. `retraced_close`:
// whether that output is close to `expected` (check() has compared them).
// `new_args`: the first call the retrace handed other numbers or read at
// another place, if any (what a replay that differs most likely shows).
void ForwardChecks::check_replay(int r, const at::Tensor& expected, const at::Tensor* retraced,
                                 bool retraced_close,
                                 const std::optional<trace::ReadChange>& new_args) {
  std::optional<at::Tensor> replayed;
  std::string why;
  bool replayed_close = false;
  if (retraced != nullptr && (replayed_once_ || capture_.forward->replays_through())) {
    replayed = *retraced;
    replayed_close = retraced_close;
  } else {
    replayed = capture_.forward->replay(&why);
    if (replayed) replayed_close = close(*replayed, expected);
  }
  if (!replayed) {
    if (r == 1) report_.warnings.push_back(Warning{"replay", "", "not replayed: " + why});
    return;
  }
  replayed_once_ = true;
  if (!replayed_close) {
    ViolationSink& sink = mode_.sink();
    sink.add(r, "replay",
             new_args ? "the captured ops, replayed, differ from a cold load (" + new_args->what +
                            " after the reload: a graph keeps the captured ones)"
                      : std::string(
                            "the captured ops, replayed, differ from a cold load (a stale read)"),
             "cold load", sink.listing() ? max_diff(*replayed, expected) : "");
  }
}

}  // namespace reloadsafe::harness
