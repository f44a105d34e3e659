// --gpus: which of a node's GPUs a daemon serves, by index or UUID.
#include <gtest/gtest.h>

#include "daemon/app/daemon.h"

namespace gpumove {
namespace {

std::vector<GpuDevice> TwoGpus() {
  GpuDevice a, b;
  a.index = 0;
  a.uuid = "GPU-3f0a1c2e-0000-1111-2222-333344445555";
  b.index = 1;
  b.uuid = "GPU-3f9b7d10-6666-7777-8888-999900001111";
  return {a, b};
}

TEST(SelectGpusTest, AllNoneAndIndexes) {
  EXPECT_EQ(*SelectGpus("all", TwoGpus()), (std::vector<int>{0, 1}));
  EXPECT_EQ(*SelectGpus("", TwoGpus()), (std::vector<int>{0, 1}));
  EXPECT_TRUE(SelectGpus("none", TwoGpus())->empty());
  EXPECT_EQ(*SelectGpus("1", TwoGpus()), (std::vector<int>{1}));
  EXPECT_EQ(*SelectGpus("1, 0,1", TwoGpus()), (std::vector<int>{1, 0}));  // Once each, in order.
}

TEST(SelectGpusTest, UuidsWholeOrByAPrefixThatNamesOneGpu) {
  EXPECT_EQ(*SelectGpus("GPU-3f9b7d10-6666-7777-8888-999900001111", TwoGpus()),
            (std::vector<int>{1}));
  EXPECT_EQ(*SelectGpus("GPU-3f0a", TwoGpus()), (std::vector<int>{0}));
  EXPECT_EQ(*SelectGpus("GPU-3f9b,0", TwoGpus()), (std::vector<int>{1, 0}));
}

TEST(SelectGpusTest, UnknownOrAmbiguousIsInvalidArgument) {
  for (const char* spec : {"2", "-1", "GPU-ffff", "GPU-", "gpu0", "0,7"}) {
    auto r = SelectGpus(spec, TwoGpus());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << spec;
  }
  auto ambiguous = SelectGpus("GPU-3f", TwoGpus());  // Both GPUs' UUIDs start so.
  EXPECT_EQ(ambiguous.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ambiguous.status().message().find("GPU 0, GPU 1"), std::string::npos)
      << ambiguous.status();
  EXPECT_EQ(SelectGpus("0", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpumove
