#include "daemon/gpu/ipc.h"

#include "gtest/gtest.h"

namespace gpumove {
namespace {

// A runtime whose IPC maps handles "h<N>" onto slices of a host array.
class FakeIpcRuntime : public GpuRuntime {
 public:
  bool cuda_compiled() const override { return false; }
  std::string status() const override { return "fake"; }
  const std::vector<GpuDevice>& devices() const override { return devices_; }
  absl::StatusOr<void*> DeviceAlloc(int, uint64_t) override { return nullptr; }
  void DeviceFree(int, void*) override {}
  absl::StatusOr<void*> PinnedAlloc(uint64_t) override { return nullptr; }
  void PinnedFree(void*) override {}
  absl::Status Copy(void*, int, const void*, int, uint64_t, uint64_t,
                    const CopyProgress&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> IpcExport(int device, void* base) override {
    return std::string("export-") + std::to_string(device);
  }
  absl::StatusOr<IpcMapping> IpcOpen(int, const std::string& handle) override {
    if (handle.size() != 2 || handle[0] != 'h') return absl::InvalidArgumentError("bad handle");
    ++opens;
    return IpcMapping{memory + (handle[1] - '0') * 1024, 1024};
  }
  void IpcClose(int, void*) override { ++closes; }

  char memory[8 * 1024] = {};
  int opens = 0, closes = 0;

 private:
  std::vector<GpuDevice> devices_;
};

TEST(IpcTableTest, OpensOnceSharesAndClosesWithTheLastHolder) {
  FakeIpcRuntime gpu;
  IpcTable table(&gpu);
  auto a = table.Open(0, "h1");
  auto b = table.Open(0, "h1");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(gpu.opens, 1);
  EXPECT_EQ((*a)->base, gpu.memory + 1024);
  EXPECT_EQ((*a)->size, 1024u);
  EXPECT_EQ(table.open_count(), 1u);
  a->reset();
  EXPECT_EQ(gpu.closes, 0);
  b->reset();
  EXPECT_EQ(gpu.closes, 1);
  EXPECT_EQ(table.open_count(), 0u);
  auto again = table.Open(0, "h1");  // Opened anew after the close.
  EXPECT_EQ(gpu.opens, 2);
  EXPECT_EQ(table.Open(0, "zz").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(IpcTableTest, FindsTheHandleAndOffsetOfAnyByteItCanShare) {
  FakeIpcRuntime gpu;
  IpcTable table(&gpu);
  ASSERT_TRUE(table.Export(3, gpu.memory, 1024).ok());
  auto mapped = table.Open(0, "h2");
  ASSERT_TRUE(mapped.ok());
  auto in_export = table.Find(gpu.memory + 100, 50);
  ASSERT_TRUE(in_export.has_value());
  EXPECT_EQ(in_export->handle, "export-3");
  EXPECT_EQ(in_export->offset, 100u);
  auto in_mapping = table.Find(gpu.memory + 2048 + 1000, 24);
  ASSERT_TRUE(in_mapping.has_value());
  EXPECT_EQ(in_mapping->handle, "h2");
  EXPECT_EQ(in_mapping->offset, 1000u);
  EXPECT_FALSE(table.Find(gpu.memory + 2048 + 1000, 25).has_value());  // Runs past the end.
  EXPECT_FALSE(table.Find(gpu.memory + 5000, 1).has_value());          // Nobody's.
}

TEST(GpuUuidTest, PrintsAsNvidiaSmiDoes) {
  const unsigned char bytes[16] = {0x25, 0x9b, 0xb6, 0x8d, 0x07, 0xa2, 0xa0, 0xff,
                                   0xd8, 0x89, 0xcb, 0x0b, 0xcf, 0x3b, 0x3d, 0xf7};
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-259bb68d-07a2-a0ff-d889-cb0bcf3b3df7");
}

}  // namespace
}  // namespace gpumove
