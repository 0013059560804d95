#include "conformance/trace/internal/unfilled_memory.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace reloadsafe::trace {
namespace {

// One top-level call as the capture's hook sees it: the op, its arguments
// before it runs and its results after (the calls are not run: only the
// storages matter).
struct Call {
  const char* op;
  const char* overload;
  std::vector<c10::IValue> args;
  std::vector<c10::IValue> returns;
};

void see(UnfilledMemory& memory, const Call& call) {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(call.op, call.overload);
  memory.before(op, call.args);
  memory.after(op, call.returns);
}

// The calls of one forward around `made` (what an empty() returned, its
// bytes written through the pointer), `other` a tensor on other memory.
using Forward = std::vector<Call> (*)(const at::Tensor& made, const at::Tensor& other);

TEST(UnfilledMemory, TellsPythonDataFromMemoryWrittenOutsideTheDispatcher) {
  struct Row {
    const char* forward;
    Forward calls;
    bool python_data;
    const char* written_outside;  // the op named, or "" for none
  };
  const std::vector<Row> rows = {
      {"torch.tensor(data): to() aliases, lift_fresh(), detach_(), then a read",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{
             {"aten::to", "dtype", {m, at::kLong, false, false, c10::IValue()}, {m}},
             {"aten::lift_fresh", "", {m}, {m}},
             {"aten::detach_", "", {m}, {m}},
             {"aten::mul", "Tensor", {m, o}, {o}}};
       },
       true, ""},
      {"torch.tensor(data) on another device: to() copies, then lift_fresh() of the copy",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{
             {"aten::to", "dtype", {m, at::kLong, false, false, c10::IValue()}, {o}},
             {"aten::lift_fresh", "", {o}, {o}}};
       },
       true, ""},
      {"torch.tensor(data), bumped by add_() after lift_fresh()",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::lift_fresh", "", {m}, {m}},
                                  {"aten::add_", "Tensor", {m, o, 1}, {m}}};
       },
       true, ""},
      {"a kernel outside the dispatcher wrote it, then mul() read it",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::mul", "Tensor", {m, o}, {o}}};
       },
       false, "aten::mul"},
      {"add_() reads what it writes",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::add_", "Tensor", {m, o, 1}, {m}}};
       },
       false, "aten::add_"},
      {"unsqueeze_() and detach_() write sizes only; mul() reads it",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::unsqueeze_", "", {m, 0}, {m}},
                                  {"aten::detach_", "", {m}, {m}},
                                  {"aten::mul", "Tensor", {m, o}, {o}}};
       },
       false, "aten::mul"},
      {"resize_() may move it: a read",
       [](const at::Tensor& m, const at::Tensor&) {
         return std::vector<Call>{
             {"aten::resize_", "", {m, std::vector<int64_t>{2}, c10::IValue()}, {m}}};
       },
       false, "aten::resize_"},
      {"new_zeros() takes its sizes only; mul() reads it",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::new_zeros",
                                   "",
                                   {m, std::vector<int64_t>{2}, c10::IValue(), c10::IValue(),
                                    c10::IValue(), c10::IValue()},
                                   {o}},
                                  {"aten::mul", "Tensor", {m, o}, {o}}};
       },
       false, "aten::mul"},
      {"a view reads nothing; mul() of the view does",
       [](const at::Tensor& m, const at::Tensor& o) {
         const at::Tensor v = m.view({2});
         return std::vector<Call>{{"aten::view", "", {m, std::vector<int64_t>{2}}, {v}},
                                  {"aten::mul", "Tensor", {v, o}, {o}}};
       },
       false, "aten::mul"},
      {"index_put_() writes some of it: a fill, as in a graph",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::index_put_",
                                   "",
                                   {m, c10::List<std::optional<at::Tensor>>({o}), o, false},
                                   {m}},
                                  {"aten::mul", "Tensor", {m, o}, {o}}};
       },
       false, ""},
      {"fill_() fills it: nothing read outside",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::fill_", "Scalar", {m, 1}, {m}},
                                  {"aten::mul", "Tensor", {m, o}, {o}}};
       },
       false, ""},
      {"copy_() fills it",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::copy_", "", {m, o, false}, {m}},
                                  {"aten::lift_fresh", "", {m}, {m}}};
       },
       false, ""},
      {"index_put(), the form functionalization gives index_put_(), fills its result; the "
       "result is read, the memory is not",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{
             {"aten::index_put", "", {m, c10::List<std::optional<at::Tensor>>({o}), o, false}, {o}},
             {"aten::mul", "Tensor", {o, o}, {o}}};
       },
       false, ""},
      {"slice_scatter(), a copy_() into a slice functionalized, fills its result",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{
             {"aten::slice_scatter", "", {m, o, 0, c10::IValue(), c10::IValue(), 1}, {o}}};
       },
       false, ""},
      {"index_put() of it, then mul() of the memory itself: still unfilled",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{
             {"aten::index_put", "", {m, c10::List<std::optional<at::Tensor>>({o}), o, false}, {o}},
             {"aten::mul", "Tensor", {m, o}, {o}}};
       },
       false, "aten::mul"},
      {"add(), whose in-place form reads what it writes, reads it",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::add", "Tensor", {m, o, 1}, {o}}};
       },
       false, "aten::add"},
      {"an out= argument fills it",
       [](const at::Tensor& m, const at::Tensor& o) {
         return std::vector<Call>{{"aten::mul", "out", {o, o, m}, {m}},
                                  {"aten::mul", "Tensor", {m, o}, {o}}};
       },
       false, ""},
  };
  for (const Row& row : rows) {
    UnfilledMemory memory;
    const at::Tensor made = at::empty({2}, at::kLong);
    made.data_ptr<int64_t>()[0] = 5;  // no op: what PyTorch does with Python data
    made.data_ptr<int64_t>()[1] = 7;
    const at::Tensor other = at::empty({2}, at::kLong);
    see(memory, Call{"aten::empty",
                     "memory_format",
                     {std::vector<int64_t>{2}, at::kLong, c10::IValue(), c10::IValue(),
                      c10::IValue(), c10::IValue()},
                     {made}});
    const at::Tensor bytes = made.clone();
    for (const Call& call : row.calls(made, other)) see(memory, call);
    made.fill_(0);  // what later ops write is not what was read
    const at::Tensor* data = memory.python_data(made.storage().unsafeGetStorageImpl());
    EXPECT_EQ(data != nullptr, row.python_data) << row.forward;
    if (data != nullptr) {
      EXPECT_TRUE(at::equal(*data, bytes)) << row.forward;
    }
    const std::string why = memory.written_outside();
    if (*row.written_outside == '\0') {
      EXPECT_EQ(why, "") << row.forward;
    } else {
      EXPECT_EQ(
          why.rfind(std::string(row.written_outside) + " reads memory an empty-like op made", 0),
          0u)
          << row.forward << ": " << why;
    }
  }
}

TEST(UnfilledMemory, NamesTheFirstReadOutsideTheDispatcher) {
  UnfilledMemory memory;
  const c10::IValue none;
  std::vector<at::Tensor> made;
  for (int i = 0; i < 3; ++i) {
    made.push_back(at::empty({2}));
    see(memory, Call{"aten::empty",
                     "memory_format",
                     {std::vector<int64_t>{2}, none, none, none, none, none},
                     {made.back()}});
  }
  const at::Tensor o = at::empty({2});
  see(memory, Call{"aten::sub", "Tensor", {made[1], o, 1}, {o}});
  see(memory, Call{"aten::mul", "Tensor", {made[0], o}, {o}});
  see(memory, Call{"aten::lift_fresh", "", {made[2]}, {made[2]}});
  EXPECT_EQ(memory.written_outside().rfind("aten::sub reads", 0), 0u) << memory.written_outside();
  EXPECT_EQ(memory.python_data(made[0].storage().unsafeGetStorageImpl()), nullptr);
  EXPECT_NE(memory.python_data(made[2].storage().unsafeGetStorageImpl()), nullptr);
}

TEST(AllocatesUnfilled, NamesTheEmptyLikeOps) {
  auto op = [](const char* name, const char* overload) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  };
  EXPECT_TRUE(allocates_unfilled(op("aten::empty", "memory_format")));
  EXPECT_TRUE(allocates_unfilled(op("aten::empty_strided", "")));
  EXPECT_TRUE(allocates_unfilled(op("aten::new_empty", "")));
  EXPECT_FALSE(allocates_unfilled(op("aten::zeros", "")));
  EXPECT_TRUE(allocates_unfilled(op("aten::empty_like", "")));
}

}  // namespace
}  // namespace reloadsafe::trace
