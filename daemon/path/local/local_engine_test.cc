#include "daemon/path/local/local_engine.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

class CountingControl : public MoveControl {
 public:
  bool cancelled() const override { return calls_ >= cancel_after_; }
  void Progress(uint64_t done) override {
    EXPECT_GT(done, last_);
    last_ = done;
    ++calls_;
  }
  int cancel_after_ = 1 << 30;
  int calls_ = 0;
  uint64_t last_ = 0;
};

TEST(LocalEngine, CopiesHostMemoryWithProgress) {
  auto gpu = GpuRuntime::CreateHostOnly("test");
  LocalEngine engine(gpu.get());
  std::vector<char> src(40 << 20), dst(40 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
  CountingControl control;
  Endpoint s{src.data(), MemoryKind::kHost, kHostDevice};
  Endpoint d{dst.data(), MemoryKind::kPinnedHost, kHostDevice};
  ASSERT_TRUE(engine.CanServe(s, d).ok());
  ASSERT_TRUE(engine.Move(s, d, src.size(), control).ok());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
  EXPECT_EQ(control.last_, src.size());
  EXPECT_GE(control.calls_, 3);  // Chunked, so cancel has somewhere to act.
}

TEST(LocalEngine, StopsBetweenChunksWhenCancelled) {
  auto gpu = GpuRuntime::CreateHostOnly("test");
  LocalEngine engine(gpu.get());
  std::vector<char> src(64 << 20, 1), dst(64 << 20, 0);
  CountingControl control;
  control.cancel_after_ = 1;
  absl::Status st = engine.Move({src.data(), MemoryKind::kHost, kHostDevice},
                                {dst.data(), MemoryKind::kHost, kHostDevice}, src.size(), control);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(control.last_, src.size());
  EXPECT_EQ(dst.back(), 0);
}

TEST(LocalEngine, RefusesDevicesItDoesNotHave) {
  auto gpu = GpuRuntime::CreateHostOnly("test");
  LocalEngine engine(gpu.get());
  char buf[16];
  EXPECT_EQ(
      engine.CanServe({buf, MemoryKind::kDevice, 0}, {buf, MemoryKind::kHost, kHostDevice}).code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST(HashRange, MatchesForEqualBytesAndDiffersOtherwise) {
  auto gpu = GpuRuntime::CreateHostOnly("test");
  std::vector<char> a(1000, 'x'), b(1000, 'x');
  auto ha = HashRange(gpu.get(), {a.data(), MemoryKind::kHost, kHostDevice}, a.size());
  auto hb = HashRange(gpu.get(), {b.data(), MemoryKind::kHost, kHostDevice}, b.size());
  EXPECT_EQ(*ha, *hb);
  b[999] = 'y';
  EXPECT_NE(*ha, *HashRange(gpu.get(), {b.data(), MemoryKind::kHost, kHostDevice}, b.size()));
}

}  // namespace
}  // namespace gpumove
