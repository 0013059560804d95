#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/internal/unfilled_memory.h"

#include "conformance/trace/internal/op_arguments.h"
#include "conformance/trace/tensor_location.h"

#include <ATen/core/enum_tag.h>

#include <algorithm>
#include <string_view>
#include <unordered_set>

namespace reloadsafe::trace {
namespace {

const c10::StorageImpl* plain_storage_of(const at::Tensor& t) {
  return has_plain_storage(t) ? t.storage().unsafeGetStorageImpl() : nullptr;
}

// A factory that takes a tensor for its sizes, dtype and device only.
bool reads_metadata_only(const std::string& name) {
  static const std::unordered_set<std::string> kFactories = {
      "aten::empty_like",        "aten::zeros_like", "aten::ones_like",    "aten::full_like",
      "aten::rand_like",         "aten::randn_like", "aten::randint_like", "aten::new_empty",
      "aten::new_empty_strided", "aten::new_zeros",  "aten::new_ones",     "aten::new_full"};
  return kFactories.count(name) > 0;
}

// An in-place view op: writes the tensor's sizes and strides, not its bytes.
// resize_ and set_ carry the tag too, but may give the tensor other memory.
bool writes_metadata_only(const c10::OperatorHandle& op, const std::string& name) {
  return op.hasTag(at::Tag::inplace_view) && name != "aten::resize_" && name != "aten::set_";
}

// Whether writing argument `arg` of `op` fills it: an out= argument, or any
// written argument of an op that is not an elementwise read-modify-write
// (add_, relu_: tagged pointwise). A write of some positions (index_put_,
// masked_fill_, scatter_) fills it too: whatever the forward reads of the
// positions it left is the forward's own garbage, as it would be in a graph.
// resize_ and set_ write no bytes: what they leave is read like the rest.
bool fills(const c10::OperatorHandle& op, const std::string& name, const c10::Argument& arg) {
  if (name == "aten::resize_" || name == "aten::set_") return false;
  return arg.is_out() || !op.hasTag(at::Tag::pointwise);
}

// Whether `op` is the out-of-place form of an op that fills its first
// argument: index_put for index_put_, copy for copy_, and the *_scatter ops
// (slice_scatter for a copy_ into a slice). Functionalization (torch.compile
// with AOTAutograd) writes every in-place op of the forward in that form:
// the result is the argument with the same positions written, and the
// argument is read only for the positions the op leaves, as the in-place
// op leaves them.
bool fills_out_of_place(const c10::OperatorHandle& op, const std::string& name) {
  constexpr std::string_view kScatter = "_scatter";
  if (name.size() > kScatter.size() &&
      name.compare(name.size() - kScatter.size(), kScatter.size(), kScatter) == 0) {
    return true;
  }
  const auto in_place =
      c10::Dispatcher::singleton().findOp({name + "_", op.schema().overload_name()});
  return in_place.has_value() && !in_place->hasTag(at::Tag::pointwise);
}

}  // namespace

bool allocates_unfilled(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return name == "aten::empty" || name == "aten::empty_strided" || name == "aten::empty_like" ||
         name == "aten::new_empty" || name == "aten::new_empty_strided";
}

UnfilledMemory::Read& UnfilledMemory::first_read(const c10::StorageImpl* storage,
                                                 const std::string& by) {
  auto it = unfilled_.find(storage);
  Read read;
  read.made_empty = std::move(it->second);
  read.by = by;
  read.order = read_.size();
  unfilled_.erase(it);
  read_now_.push_back(storage);
  return read_.insert_or_assign(storage, std::move(read)).first->second;
}

void UnfilledMemory::python_data_reached(Read& read) {
  // Nothing wrote it since the read: lift_fresh() follows the to() that read
  // it, inside the same torch.tensor() call.
  if (!read.data.defined()) read.data = read.made_empty.clone();
}

void UnfilledMemory::before(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  read_now_.clear();
  alias_args_.clear();
  if (unfilled_.empty() && read_.empty()) return;
  const std::string& name = op.schema().name();
  if (name == "aten::lift_fresh") {
    for (const c10::IValue& v : args) {
      for_each_tensor(v, [&](const at::Tensor& t, int) {
        const c10::StorageImpl* storage = plain_storage_of(t);
        if (storage == nullptr) return;
        if (unfilled_.count(storage) > 0) {
          python_data_reached(first_read(storage, name));
          return;
        }
        for (auto& [from, read] : read_) {
          if (from == storage || std::count(read.results.begin(), read.results.end(), storage)) {
            python_data_reached(read);
          }
        }
      });
    }
    return;
  }
  if (unfilled_.empty() || reads_metadata_only(name) || writes_metadata_only(op, name)) return;
  const std::vector<c10::Argument>& schema_args = op.schema().arguments();
  for (size_t i = 0; i < args.size() && i < schema_args.size(); ++i) {
    const c10::AliasInfo* alias = schema_args[i].alias_info();
    const bool writes = alias != nullptr && alias->isWrite();
    for_each_tensor(args[i], [&](const at::Tensor& t, int) {
      const c10::StorageImpl* storage = plain_storage_of(t);
      if (storage == nullptr || unfilled_.count(storage) == 0) return;
      if (writes && fills(op, name, schema_args[i])) {
        unfilled_.erase(storage);  // an op fills it: a replay runs that op too
      } else if (i == 0 && alias == nullptr && fills_out_of_place(op, name)) {
        return;  // filled into the result; still unfilled for any other reader
      } else if (alias != nullptr && !writes) {
        alias_args_.push_back(storage);  // a view of it reads nothing; a copy does
      } else {
        first_read(storage, name);
      }
    });
  }
}

void UnfilledMemory::after(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> returns) {
  const bool allocates = allocates_unfilled(op);
  // The common call: nothing to follow, nothing made to follow.
  if (alias_args_.empty() && read_now_.empty() && !allocates) return;
  std::vector<const c10::StorageImpl*> results;
  for (const c10::IValue& v : returns) {
    for_each_tensor(v, [&](const at::Tensor& t, int) {
      if (const c10::StorageImpl* storage = plain_storage_of(t)) results.push_back(storage);
    });
  }
  for (const c10::StorageImpl* storage : alias_args_) {
    const bool view = std::count(results.begin(), results.end(), storage) > 0;
    if (!view && unfilled_.count(storage) > 0) first_read(storage, op.schema().name());
  }
  alias_args_.clear();
  for (const c10::StorageImpl* storage : read_now_) read_.at(storage).results = results;
  read_now_.clear();
  if (allocates) {
    for (const c10::IValue& v : returns) {
      for_each_tensor(v, [&](const at::Tensor& t, int) {
        if (const c10::StorageImpl* storage = plain_storage_of(t)) unfilled_.emplace(storage, t);
      });
    }
  }
}

const at::Tensor* UnfilledMemory::python_data(const c10::StorageImpl* made) const {
  auto it = read_.find(made);
  return it != read_.end() && it->second.data.defined() ? &it->second.data : nullptr;
}

std::string UnfilledMemory::written_outside() const {
  const Read* first = nullptr;
  for (const auto& [storage, read] : read_) {
    if (!read.data.defined() && (first == nullptr || read.order < first->order)) first = &read;
  }
  if (first == nullptr) return {};
  return first->by + " reads memory an empty-like op made that no op wrote: code outside " +
         "PyTorch's dispatcher filled it (a kernel called through its own binding, not as an " +
         "operator), and a replay runs only the ops the trace saw; the live forward is still " +
         "compared with a cold load";
}

}  // namespace reloadsafe::trace
