#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/forward_capture.h"

#include <c10/util/Exception.h>

#include <set>
#include <string>
#include <string_view>

namespace reloadsafe::harness {

using trace::CapturedRead;

ForwardCapture capture_forward(SubjectLayer& layer, const at::Tensor& x) {
  ForwardCapture c;
  c.names = std::make_unique<trace::TensorNames>(layer.named_tensors());
  for (const trace::NamedObject& o : layer.named_objects()) c.names->add_object(o.name, o.identity);
  c.names->add("input", x, /*declared=*/true);
  c.forward = std::make_unique<trace::CapturedForward>([&] { return layer.forward(x); });
  return c;
}

// Note [A compiled graph's constants]
// A tensor made from Python data in a forward (torch.tensor(2.0)) is made
// afresh by every eager call. A graph torch.compile traced with AOTAutograd
// and runs op by op (the aot_eager backend) holds it instead as a constant
// of the graph module and copies it with aten::lift_fresh_copy on each call
// (Inductor folds it into its kernels, which the trace does not see). Such a
// tensor comes from outside the forward, yet no attribute of the layer
// reaches it, no author can declare it, and its bytes come from the code,
// not a checkpoint. It is still checked like any read from outside (a reload
// never moves it), but not reported as an undeclared read: the warning would
// ask the author to declare a compiler's constant. Only a tensor every
// top-level read of which is lift_fresh_copy counts (its nested reads are
// that op's own copy); one an op of the forward itself reads is an
// undeclared read like any other.
namespace {
constexpr std::string_view kConstantCopy = "aten::lift_fresh_copy";
}  // namespace

DistinctReads distinct_reads(const std::vector<CapturedRead>& reads) {
  DistinctReads out;
  std::set<const void*> declared, undeclared, copied_as_constant, read_by_the_forward;
  for (const CapturedRead& r : reads) {
    if (r.depth != 0) continue;
    (r.op_name == kConstantCopy ? copied_as_constant : read_by_the_forward).insert(r.storage);
  }
  for (const CapturedRead& r : reads) {
    if (r.name == "input") continue;
    if (r.kind == CapturedRead::Kind::kSubclass || r.kind == CapturedRead::Kind::kNoStorage)
      continue;
    if (r.declared) {
      if (declared.insert(r.storage).second) out.declared.push_back(&r);
    } else if (undeclared.insert(r.storage).second) {
      const bool constant = r.kind == CapturedRead::Kind::kTensor &&
                            copied_as_constant.count(r.storage) != 0 &&
                            read_by_the_forward.count(r.storage) == 0;
      (constant ? out.constants : out.undeclared).push_back(&r);
    }
  }
  return out;
}

void count_reads(const ForwardCapture& c, ModeReport& report) {
  // Counted without formatting a read; formatted again only to warn.
  std::vector<CapturedRead> reads = c.forward->reads(*c.names, /*details=*/false);
  DistinctReads distinct = distinct_reads(reads);
  if (!distinct.undeclared.empty()) {
    reads = c.forward->reads(*c.names);
    distinct = distinct_reads(reads);
  }
  for (const CapturedRead* r : distinct.undeclared) {
    report.warnings.push_back(Warning{
        r->name, r->op,
        "read but not declared (" + r->layout +
            "); checked like a declared tensor; declare it if the forward is meant to read it"});
  }
  report.declared_reads = static_cast<int>(distinct.declared.size());
  report.undeclared_reads = static_cast<int>(distinct.undeclared.size());
  const size_t ops = c.forward->trace().ops().size();
  TORCH_CHECK(ops > 0,
              "the forward ran no operator on the calling thread: if it runs its ops on another "
              "thread (a thread pool, an executor, a background stream), the read trace cannot "
              "see them (it records the calling thread only); run the forward's ops on the "
              "thread that calls it while checking");
  TORCH_CHECK(!distinct.declared.empty() || !distinct.undeclared.empty(),
              "the forward reads no tensor besides its input (", ops,
              " ops traced): it must read the layer's weights through dispatcher ops; a kernel "
              "launched without the dispatcher, or ops run on another thread, are invisible to "
              "the trace");
}

}  // namespace reloadsafe::harness
