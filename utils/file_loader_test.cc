#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "utils/file_loader.h"

#include "utils/safetensors_test_writer.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace reloadsafe {
namespace {

using testing::length_field;
using testing::message_of;
using testing::temp_path;
using testing::write_bytes;
using testing::write_safetensors;
using Named = testing::NamedTensor;

at::Tensor sentinel_like(const at::Tensor& t) {
  at::Tensor out = at::empty(t.sizes(), t.options());
  // An empty tensor may have no data pointer at all: nothing to fill.
  if (out.numel() > 0) std::memset(out.data_ptr(), 0xA5, out.numel() * out.element_size());
  return out;
}

// The checkpoint the tests load: mixed dtypes and sizes, over two shards.
struct Checkpoint {
  std::vector<Named> shard0;
  std::vector<Named> shard1;
  std::vector<std::string> paths;

  Checkpoint() {
    shard0 = {
        {"embed.weight", at::randn({300, 17}).to(at::kBFloat16)},
        {"layer.0.bias", at::randn({33})},
        {"layer.0.norm", at::randn({40})},
        {"layer.0.ids", at::arange(1000, at::kLong)},
        {"layer.0.mask", at::randint(0, 2, {77}).to(at::kBool)},
        {"empty", at::randn({0, 5})},
    };
    shard1 = {
        {"layer.1.weight", at::randn({64, 129}).to(at::kHalf)},
        {"layer.1.scale", at::randn({}).to(at::kDouble)},
        {"layer.1.bytes", at::randint(0, 256, {4099}).to(at::kByte)},
    };
    paths = {write_safetensors("ckpt-0.safetensors", shard0),
             write_safetensors("ckpt-1.safetensors", shard1)};
  }

  // A destination per tensor, holding sentinel bytes.
  LoadTargets destinations() const {
    LoadTargets out;
    for (const auto* shard : {&shard0, &shard1}) {
      for (const Named& t : *shard) out[t.name] = {sentinel_like(t.value), std::nullopt};
    }
    return out;
  }

  void expect_loaded(const LoadTargets& targets) const {
    for (const auto* shard : {&shard0, &shard1}) {
      for (const Named& t : *shard) {
        SCOPED_TRACE(t.name);
        EXPECT_TRUE(at::equal(targets.at(t.name).tensor, t.value));
      }
    }
  }
};

struct Identity {
  const void* data;
  size_t storage_nbytes;
  const void* storage;
};

std::map<std::string, Identity> identities(const LoadTargets& targets) {
  std::map<std::string, Identity> out;
  for (const auto& [name, t] : targets) {
    out[name] = {t.tensor.storage().data(), t.tensor.storage().nbytes(),
                 t.tensor.storage().unsafeGetStorageImpl()};
  }
  return out;
}

void expect_same_identities(const std::map<std::string, Identity>& a,
                            const std::map<std::string, Identity>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, id] : a) {
    SCOPED_TRACE(name);
    EXPECT_EQ(b.at(name).data, id.data);
    EXPECT_EQ(b.at(name).storage_nbytes, id.storage_nbytes);
    EXPECT_EQ(b.at(name).storage, id.storage);
  }
}

struct OptionsCase {
  const char* what;
  FileLoaderOptions options;
};

TEST(FileLoader, EveryByteLandsAndNothingMoves) {
  const Checkpoint ckpt;
  const OptionsCase cases[] = {
      {"defaults", {}},
      {"one thread", {1, int64_t{8} << 20, 4, false}},
      {"small chunks, four threads", {4, 100, 4, false}},
      {"odd chunks, three threads", {3, 333, 2, false}},
      {"staged through the ring", {2, 256, 2, true}},
      {"staged, one reader, many slots", {1, 1000, 7, true}},
  };
  for (const OptionsCase& c : cases) {
    SCOPED_TRACE(c.what);
    FileLoader loader(c.options);
    LoadTargets targets = ckpt.destinations();
    const auto before = identities(targets);
    int64_t total = 0;
    for (const auto* shard : {&ckpt.shard0, &ckpt.shard1}) {
      for (const Named& t : *shard) total += t.value.numel() * t.value.element_size();
    }
    EXPECT_EQ(loader.load_(ckpt.paths, targets), total);
    ckpt.expect_loaded(targets);
    expect_same_identities(before, identities(targets));
    // A second load into the same tensors, after they changed.
    for (auto& [name, t] : targets) {
      if (t.tensor.nbytes() > 0) std::memset(t.tensor.data_ptr(), 0, t.tensor.nbytes());
    }
    loader.load_(ckpt.paths, targets);
    ckpt.expect_loaded(targets);
    expect_same_identities(before, identities(targets));
    const FileLoaderCounters n = loader.counters();
    EXPECT_EQ(n.calls, 2);
    EXPECT_EQ(n.bytes_read, 2 * total);
    EXPECT_EQ(n.tensors_loaded, 18);
    EXPECT_EQ(n.staging_allocations, c.options.stage_host_destinations ? 1 : 0);
  }
}

TEST(FileLoader, LoadsASubsetAndLeavesTheRest) {
  const Checkpoint ckpt;
  at::Tensor bias = sentinel_like(ckpt.shard0[1].value);
  LoadTargets targets = {{"layer.0.bias", {bias, std::nullopt}}};
  load_safetensors_(ckpt.paths, targets);
  EXPECT_TRUE(at::equal(bias, ckpt.shard0[1].value));
}

TEST(FileLoader, FillsPartsOfAFusedParameterByOffset) {
  const at::Tensor q = at::randn({8, 16});
  const at::Tensor k = at::randn({4, 16});
  const at::Tensor v = at::randn({4, 16});
  const std::string path = write_safetensors("qkv.safetensors", {{"q", q}, {"k", k}, {"v", v}});
  // A fused [q; k; v] with a row of padding at each end that stays as it is.
  at::Tensor qkv = at::full({18, 16}, 7.0);
  const int64_t row = 16 * 4;
  const void* data = qkv.data_ptr();
  FileLoader loader;
  loader.load_({path}, {{"q", {qkv, row}}, {"k", {qkv, row * 9}}, {"v", {qkv, row * 13}}});
  EXPECT_EQ(qkv.data_ptr(), data);
  EXPECT_TRUE(at::equal(qkv.narrow(0, 1, 8), q));
  EXPECT_TRUE(at::equal(qkv.narrow(0, 9, 4), k));
  EXPECT_TRUE(at::equal(qkv.narrow(0, 13, 4), v));
  EXPECT_TRUE(at::equal(qkv.narrow(0, 0, 1), at::full({1, 16}, 7.0)));
  EXPECT_TRUE(at::equal(qkv.narrow(0, 17, 1), at::full({1, 16}, 7.0)));
  // An offset into a view: relative to the view's first element.
  at::Tensor rows = qkv.narrow(0, 9, 8);
  loader.load_({path}, {{"q", {rows, 0}}});
  EXPECT_TRUE(at::equal(qkv.narrow(0, 9, 8), q));
}

bool all_sentinel(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || !t.device().is_cpu()) return true;
  const auto* p = static_cast<const uint8_t*>(t.storage().data());
  for (size_t i = 0; i < t.storage().nbytes(); ++i) {
    if (p[i] != 0xA5) return false;
  }
  return true;
}

at::Tensor sentinel_floats(int64_t n) {
  return sentinel_like(at::empty({n}));
}

struct MismatchCase {
  const char* what;
  std::function<void(LoadTargets&, std::vector<std::string>&)> spoil;
  std::vector<const char*> expected;  // each in the message
};

TEST(FileLoader, RefusesMismatchesBeforeAnyWrite) {
  const Checkpoint ckpt;
  const MismatchCase cases[] = {
      {"wrong dtype",
       [](LoadTargets& t, auto&) {
         t["layer.0.bias"] = {sentinel_like(at::empty({33}, at::kDouble)), std::nullopt};
       },
       {"'layer.0.bias'", "F32", "Double", "does not convert"}},
      {"wrong shape",
       [](LoadTargets& t, auto&) {
         t["layer.0.bias"] = {sentinel_like(at::empty({3, 11})), {}};
       },
       {"'layer.0.bias'", "shape [33]", "[3, 11]", "byte offset"}},
      {"name not in the files",
       [](LoadTargets& t, auto&) {
         t["layer.9.bias"] = {sentinel_floats(33), {}};
       },
       {"'layer.9.bias'", "none of the 2 file(s)"}},
      {"not contiguous",
       [](LoadTargets& t, auto&) {
         t["embed.weight"] = {sentinel_like(at::empty({17, 300}, at::kBFloat16)).t(), {}};
       },
       {"'embed.weight'", "not contiguous"}},
      {"offset past the end",
       [](LoadTargets& t, auto&) {
         t["layer.0.bias"] = {sentinel_floats(40), 4 * 8};
       },
       {"'layer.0.bias'", "does not fit at byte offset 32"}},
      {"offset not a multiple of the element size",
       [](LoadTargets& t, auto&) {
         t["layer.0.bias"] = {sentinel_floats(40), 2};
       },
       {"'layer.0.bias'", "multiple of the element size 4"}},
      {"negative offset",
       [](LoadTargets& t, auto&) {
         t["layer.0.bias"] = {sentinel_floats(40), -4};
       },
       {"'layer.0.bias'", "non-negative"}},
      {"overlapping destinations",
       [](LoadTargets& t, auto&) {
         at::Tensor fused = sentinel_floats(100);
         t["layer.0.bias"] = {fused, 0};
         t["layer.0.norm"] = {fused, 4 * 30};
       },
       {"'layer.0.bias'", "'layer.0.norm'", "overlap"}},
      {"past its storage",
       [](LoadTargets& t, auto&) {
         at::Tensor beyond = sentinel_floats(33);
         beyond.unsafeGetTensorImpl()->set_storage_offset(10);
         t["layer.0.bias"] = {beyond, {}};
       },
       {"'layer.0.bias'", "never grows a storage"}},
      {"undefined",
       [](LoadTargets& t, auto&) {
         t["layer.0.bias"] = {at::Tensor(), {}};
       },
       {"'layer.0.bias'", "undefined"}},
      {"meta tensor",
       [](LoadTargets& t, auto&) {
         t["layer.0.bias"] = {at::empty({33}, at::kMeta), {}};
       },
       {"'layer.0.bias'", "with memory"}},
      {"a shard given twice",
       [](LoadTargets&, std::vector<std::string>& p) { p.push_back(p[0]); },
       {"in both", "each file once"}},
      {"a missing file",
       [](LoadTargets&, std::vector<std::string>& p) { p.push_back(temp_path("nothing")); },
       {"cannot open", "nothing"}},
  };
  for (const MismatchCase& c : cases) {
    SCOPED_TRACE(c.what);
    const LoadTargets good = ckpt.destinations();
    LoadTargets targets = good;
    std::vector<std::string> paths = ckpt.paths;
    c.spoil(targets, paths);
    FileLoader loader({2, 64, 2, false});
    const std::string msg = message_of([&] { loader.load_(paths, targets); });
    ASSERT_FALSE(msg.empty()) << "not refused";
    for (const char* e : c.expected) EXPECT_NE(msg.find(e), std::string::npos) << msg;
    for (const auto& [name, t] : good) EXPECT_TRUE(all_sentinel(t.tensor)) << name;
    for (const auto& [name, t] : targets) EXPECT_TRUE(all_sentinel(t.tensor)) << name;
    EXPECT_EQ(loader.counters().bytes_read, 0);
  }
}

struct BadFileCase {
  const char* what;
  std::string bytes;
  const char* expected;
};

TEST(FileLoader, RefusesMalformedFilesBeforeAnyWrite) {
  const Checkpoint ckpt;
  const std::string a = R"({"x": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})";
  const std::string two = R"({"x": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},)"
                          R"( "y": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})";
  const std::string bad_dtype = R"({"x": {"dtype": "Q8", "shape": [8], "data_offsets": [0, 8]}})";
  const BadFileCase cases[] = {
      {"truncated data", length_field(a.size()) + a + "1234", "outside the data section"},
      {"truncated header", length_field(a.size()) + a.substr(0, 20), "cannot hold"},
      {"header length huge", length_field(~uint64_t{0}) + a + "12345678", "more than the"},
      {"too short", std::string("\x10\x00", 2), "fewer than the 8"},
      {"overlapping offsets", length_field(two.size()) + two + "123456789012", "overlap"},
      {"bad dtype", length_field(bad_dtype.size()) + bad_dtype + "12345678", "'Q8'"},
      {"not JSON", length_field(8) + "garbage!" + "12345678", "malformed"},
  };
  for (const BadFileCase& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string bad = temp_path("bad.safetensors");
    write_bytes(bad, c.bytes);
    const LoadTargets good = ckpt.destinations();
    std::vector<std::string> paths = ckpt.paths;
    paths.push_back(bad);
    FileLoader loader;
    const std::string msg = message_of([&] { loader.load_(paths, good); });
    EXPECT_NE(msg.find(c.expected), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
    for (const auto& [name, t] : good) EXPECT_TRUE(all_sentinel(t.tensor)) << name;
  }
}

// Counts the CPU allocator's allocations while it is installed.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    count_.fetch_add(1);
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  int64_t count() const { return count_.load(); }

 private:
  c10::Allocator* inner_;
  std::atomic<int64_t> count_{0};
};

// Installs a CountingAllocator as the CPU allocator; restores the old one.
class ScopedCountingAllocator {
 public:
  ScopedCountingAllocator() : previous_(c10::GetCPUAllocator()), counting_(previous_) {
    c10::SetCPUAllocator(&counting_, kPriority);
  }
  ~ScopedCountingAllocator() { c10::SetCPUAllocator(previous_, kPriority); }
  int64_t count() const { return counting_.count(); }

 private:
  static constexpr uint8_t kPriority = 200;
  c10::Allocator* previous_;
  CountingAllocator counting_;
};

TEST(FileLoader, AllocatesNothingAfterTheFirstCall) {
  const Checkpoint ckpt;
  for (bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged" : "direct");
    FileLoader loader({2, 512, 3, staged});
    LoadTargets targets = ckpt.destinations();
    {
      ScopedCountingAllocator counting;
      loader.load_(ckpt.paths, targets);
      // The ring, once, when staged (and dense_copy_'s one-time calibration
      // where a copy is large enough to need it).
      EXPECT_GE(counting.count(), staged ? 1 : 0);
    }
    EXPECT_EQ(loader.counters().staging_allocations, staged ? 1 : 0);
    EXPECT_EQ(loader.counters().staging_bytes, staged ? 512 * 3 : 0);
    for (int i = 0; i < 3; ++i) {
      ScopedCountingAllocator counting;
      loader.load_(ckpt.paths, targets);
      EXPECT_EQ(counting.count(), 0);
    }
    EXPECT_EQ(loader.counters().staging_allocations, staged ? 1 : 0);
    ckpt.expect_loaded(targets);
  }
}

// Several threads load through one loader at once, each into its own
// tensors (run under TSan by tools/test.sh: the ring's hand-offs and the
// counters are shared).
TEST(FileLoader, ConcurrentLoadsThroughOneLoader) {
  const Checkpoint ckpt;
  for (bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged" : "direct");
    FileLoader loader({3, 200, 2, staged});
    constexpr int kThreads = 4;
    constexpr int kLoads = 5;
    std::vector<LoadTargets> targets;
    for (int i = 0; i < kThreads; ++i) targets.push_back(ckpt.destinations());
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        for (int n = 0; n < kLoads; ++n) loader.load_(ckpt.paths, targets[i]);
      });
    }
    for (std::thread& t : threads) t.join();
    for (const LoadTargets& t : targets) ckpt.expect_loaded(t);
    EXPECT_EQ(loader.counters().calls, kThreads * kLoads);
    EXPECT_EQ(loader.counters().staging_allocations, staged ? 1 : 0);
  }
}

}  // namespace
}  // namespace reloadsafe
