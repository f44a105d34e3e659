#include "daemon/common/cpus.h"

#include <sched.h>

#include <thread>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(CpusTest, AllowAllCpusUndoesABindingToOneCore) {
  const int all = AllowedCpus();
  if (all < 2) GTEST_SKIP() << "one CPU here: nothing to widen";
  // In a thread of its own: affinity is per thread, and the test's own stays as it is.
  std::thread([all] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    ASSERT_EQ(AllowedCpus(), 1);
    // A thread started now inherits the one core...
    int inherited = 0;
    std::thread([&] { inherited = AllowedCpus(); }).join();
    EXPECT_EQ(inherited, 1);
    auto widened = AllowAllCpus();
    ASSERT_TRUE(widened.ok()) << widened.status();
    EXPECT_EQ(*widened, all);
    EXPECT_EQ(AllowedCpus(), all);
    // ... and one started after the widening gets them all.
    std::thread([&] { inherited = AllowedCpus(); }).join();
    EXPECT_EQ(inherited, all);
  }).join();
  EXPECT_EQ(AllowedCpus(), all);
}

}  // namespace
}  // namespace gpumove
