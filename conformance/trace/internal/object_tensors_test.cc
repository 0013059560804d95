#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/internal/object_tensors.h"

#include "conformance/trace/trace_key.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace reloadsafe::trace {
namespace {

// Kernel objects of every shape a backend hands to its ops. Each holds two
// tensors; what differs is how (or whether) it tells which.
struct Held : torch::CustomClassHolder {
  at::Tensor a = at::randn({4});
  at::Tensor b = at::randn({2, 2});
};
struct UnpacksATuple : Held {};
struct UnpacksAList : Held {};
struct UnpacksOne : Held {};
struct Opaque : Held {};
struct UnpackThrows : Held {};
struct UnpackTakesAnArgument : Held {};
struct RegisteredShort : Held {};
struct RegisteredQualified : Held {};
struct RegisteredOverUnpack : Held {};
struct RegisteredThrows : Held {};
struct RecordsTheTraceKey : Held {};
struct RegisteredLater : Held {};

// Whether the trace's key was excluded when RecordsTheTraceKey's unpack ran.
bool g_key_excluded_in_unpack = false;

TORCH_LIBRARY(reloadsafe_object_tensors_test, m) {
  m.class_<UnpacksATuple>("UnpacksATuple")
      .def("unpack", [](const c10::intrusive_ptr<UnpacksATuple>& self) {
        return std::make_tuple(self->a, self->b);
      });
  m.class_<UnpacksAList>("UnpacksAList")
      .def("unpack", [](const c10::intrusive_ptr<UnpacksAList>& self) {
        return std::vector<at::Tensor>{self->a, self->b};
      });
  m.class_<UnpacksOne>("UnpacksOne").def("unpack", [](const c10::intrusive_ptr<UnpacksOne>& self) {
    return self->a;
  });
  m.class_<Opaque>("Opaque");
  m.class_<UnpackThrows>("UnpackThrows")
      .def("unpack", [](const c10::intrusive_ptr<UnpackThrows>&) -> at::Tensor {
        TORCH_CHECK(false, "this object cannot unpack");
      });
  m.class_<UnpackTakesAnArgument>("UnpackTakesAnArgument")
      .def("unpack",
           [](const c10::intrusive_ptr<UnpackTakesAnArgument>& self, int64_t) { return self->a; });
  m.class_<RegisteredShort>("RegisteredShort");
  m.class_<RegisteredQualified>("RegisteredQualified");
  m.class_<RegisteredOverUnpack>("RegisteredOverUnpack")
      .def("unpack", [](const c10::intrusive_ptr<RegisteredOverUnpack>& self) { return self->a; });
  m.class_<RegisteredThrows>("RegisteredThrows");
  m.class_<RegisteredLater>("RegisteredLater")
      .def("unpack", [](const c10::intrusive_ptr<RegisteredLater>& self) { return self->a; });
  m.class_<RecordsTheTraceKey>("RecordsTheTraceKey")
      .def("unpack", [](const c10::intrusive_ptr<RecordsTheTraceKey>& self) {
        g_key_excluded_in_unpack = c10::impl::tls_is_dispatch_key_excluded(kTraceKey);
        return self->a;
      });
}

template <typename T>
ObjectTensors both_of() {
  return [](const c10::IValue& object) {
    const auto self = object.toCustomClass<T>();
    return std::vector<at::Tensor>{self->a, self->b};
  };
}

// The registrations the table relies on, made once for the whole binary
// (the registry is process-wide).
class ObjectTensorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    register_object_tensors("reloadsafe_object_tensors_test.RegisteredShort",
                            both_of<RegisteredShort>());
    register_object_tensors(
        "__torch__.torch.classes.reloadsafe_object_tensors_test.RegisteredQualified",
        both_of<RegisteredQualified>());
    register_object_tensors("reloadsafe_object_tensors_test.RegisteredOverUnpack",
                            both_of<RegisteredOverUnpack>());
    register_object_tensors("reloadsafe_object_tensors_test.RegisteredThrows",
                            [](const c10::IValue&) -> std::vector<at::Tensor> {
                              TORCH_CHECK(false, "this registration cannot report");
                            });
  }
};

// An object as a backend hands it to an op, and the instance it wraps.
struct Made {
  c10::IValue object;
  c10::intrusive_ptr<Held> held;
};

struct Case {
  std::string name;
  std::function<Made()> make;
  const char* source;  // null: the object cannot report
  int tensors;         // how many it reports: its `a`, then its `b`
};

template <typename T>
std::function<Made()> make() {
  return [] {
    auto instance = c10::make_intrusive<T>();
    return Made{c10::IValue(instance), instance};
  };
}

TEST_F(ObjectTensorsTest, EachWayAnObjectCanTellItsTensors) {
  const std::vector<Case> cases = {
      {"unpack() returning a tuple", make<UnpacksATuple>(), "unpack()", 2},
      {"unpack() returning a list", make<UnpacksAList>(), "unpack()", 2},
      {"unpack() returning one tensor", make<UnpacksOne>(), "unpack()", 1},
      {"no unpack(), nothing registered", make<Opaque>(), nullptr, 0},
      {"unpack() that throws", make<UnpackThrows>(), nullptr, 0},
      {"unpack() that takes an argument", make<UnpackTakesAnArgument>(), nullptr, 0},
      {"registered by its short name", make<RegisteredShort>(), "tensors", 2},
      {"registered by its qualified name", make<RegisteredQualified>(), "tensors", 2},
      {"registered, and an unpack() too", make<RegisteredOverUnpack>(), "tensors", 2},
      {"registered function that throws", make<RegisteredThrows>(), nullptr, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Made made = c.make();
    ReportedTensors reported;
    ASSERT_NO_THROW(reported = reported_tensors(made.object));
    if (c.source == nullptr) {
      EXPECT_EQ(reported.source, nullptr) << reported.source;
    } else {
      ASSERT_NE(reported.source, nullptr);
      EXPECT_STREQ(reported.source, c.source);
    }
    ASSERT_EQ(reported.tensors.size(), static_cast<size_t>(c.tensors));
    const std::vector<at::Tensor> expected = {made.held->a, made.held->b};
    for (size_t k = 0; k < reported.tensors.size(); ++k) {
      EXPECT_TRUE(reported.tensors[k].is_same(expected[k])) << "tensor " << k;
    }
  }
}

// How a class reports is found once per class and thread (Note [A class
// resolved once] in object_tensors.cc): a registration made after objects of
// the class were asked still takes effect, on this thread and others.
TEST_F(ObjectTensorsTest, ARegistrationAfterTheFirstAskTakesEffect) {
  const Made made = make<RegisteredLater>()();
  ReportedTensors reported = reported_tensors(made.object);
  ASSERT_NE(reported.source, nullptr);
  EXPECT_STREQ(reported.source, "unpack()");
  EXPECT_EQ(reported.tensors.size(), 1u);
  reported = reported_tensors(made.object);  // asked again: the class is known
  EXPECT_STREQ(reported.source, "unpack()");
  register_object_tensors("reloadsafe_object_tensors_test.RegisteredLater",
                          both_of<RegisteredLater>());
  reported = reported_tensors(made.object);
  ASSERT_NE(reported.source, nullptr);
  EXPECT_STREQ(reported.source, "tensors");
  EXPECT_EQ(reported.tensors.size(), 2u);
  std::thread other([&] {
    const ReportedTensors there = reported_tensors(made.object);
    EXPECT_STREQ(there.source != nullptr ? there.source : "(none)", "tensors");
  });
  other.join();
}

TEST_F(ObjectTensorsTest, AnObjectIsAskedWithTheTraceOff) {
  g_key_excluded_in_unpack = false;
  const ReportedTensors reported = reported_tensors(make<RecordsTheTraceKey>()().object);
  ASSERT_NE(reported.source, nullptr);
  EXPECT_TRUE(g_key_excluded_in_unpack);
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_excluded(kTraceKey)) << "the guard was not undone";
}

TEST_F(ObjectTensorsTest, SomethingThatIsNotAnObjectReportsNothing) {
  EXPECT_EQ(reported_tensors(c10::IValue(at::ones({2}))).source, nullptr);
  EXPECT_EQ(reported_tensors(c10::IValue()).source, nullptr);
}

TEST(ObjectTensors, ShortClassNameCutsTorchBindsPrefix) {
  const c10::IValue object = make<Opaque>()().object;
  EXPECT_EQ(short_class_name(*object.toObject()), "reloadsafe_object_tensors_test.Opaque");
}

TEST(ObjectTensors, ARegistrationNeedsAClassNameAndAFunction) {
  const ObjectTensors fn = [](const c10::IValue&) { return std::vector<at::Tensor>{}; };
  for (const auto& [name, f] :
       std::vector<std::pair<std::string, ObjectTensors>>{{"", fn}, {"some.Class", nullptr}}) {
    try {
      register_object_tensors(name, f);
      ADD_FAILURE() << "registered '" << name << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("give a class name and a function"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace reloadsafe::trace
