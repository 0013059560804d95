#include "utils/reload_context.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

namespace reloadsafe {
namespace {

TEST(WeightsAlreadyProcessed, DefaultNestingAndRestore) {
  EXPECT_FALSE(weights_pre_processed());
  {
    WeightsAlreadyProcessed outer;
    EXPECT_TRUE(weights_pre_processed());
    {
      WeightsAlreadyProcessed inner;
      EXPECT_TRUE(weights_pre_processed());
    }
    EXPECT_TRUE(weights_pre_processed());
  }
  EXPECT_FALSE(weights_pre_processed());
}

TEST(WeightsAlreadyProcessed, ExceptionRestores) {
  try {
    WeightsAlreadyProcessed scope;
    throw std::runtime_error("load failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(weights_pre_processed());
}

TEST(WeightsAlreadyProcessed, NewThreadSeesFalse) {
  WeightsAlreadyProcessed scope;
  bool seen = true;
  std::thread([&] { seen = weights_pre_processed(); }).join();
  EXPECT_FALSE(seen);
  EXPECT_TRUE(weights_pre_processed());
}

TEST(DirectReloadScope, NestingExceptionsAndThreads) {
  EXPECT_FALSE(direct_reload_enabled());
  {
    DirectReloadScope on;
    EXPECT_TRUE(direct_reload_enabled());
    {
      DirectReloadScope off(false);
      EXPECT_FALSE(direct_reload_enabled());
    }
    EXPECT_TRUE(direct_reload_enabled());
    bool seen = true;
    std::thread([&] { seen = direct_reload_enabled(); }).join();
    EXPECT_FALSE(seen);
  }
  EXPECT_FALSE(direct_reload_enabled());
  try {
    DirectReloadScope on;
    throw std::runtime_error("reload failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(direct_reload_enabled());
}

}  // namespace
}  // namespace reloadsafe
