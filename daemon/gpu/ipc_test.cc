#include "daemon/gpu/ipc.h"

#include <cstdlib>
#include <cstring>

#include "daemon/gpu/own_memory.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

// A runtime whose IPC maps handles "h<N>" onto slices of a host array.
class FakeIpcRuntime : public GpuRuntime {
 public:
  bool cuda_compiled() const override { return false; }
  std::string status() const override { return "fake"; }
  const std::vector<GpuDevice>& devices() const override { return devices_; }
  // Device memory is host memory here, filled with 0xab (what a driver's reused memory
  // may hold).
  absl::StatusOr<void*> DeviceAlloc(int, uint64_t bytes) override {
    void* p = std::malloc(bytes);
    std::memset(p, 0xab, bytes);
    ++allocs;
    return p;
  }
  void DeviceFree(int, void* p) override {
    std::free(p);
    ++frees;
  }
  absl::Status Zero(int, void* ptr, uint64_t bytes) override {
    std::memset(ptr, 0, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<void*> PinnedAlloc(uint64_t) override { return nullptr; }
  void PinnedFree(void*) override {}
  absl::Status Copy(void*, int, const void*, int, uint64_t, uint64_t,
                    const CopyProgress&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> IpcExport(int device, void* base) override {
    return std::string("export-") + std::to_string(device) + (base == memory ? "" : "-own");
  }
  absl::StatusOr<IpcMapping> IpcOpen(int, const std::string& handle) override {
    if (handle.size() != 2 || handle[0] != 'h') return absl::InvalidArgumentError("bad handle");
    ++opens;
    return IpcMapping{memory + (handle[1] - '0') * 1024, 1024};
  }
  void IpcClose(int, void*) override { ++closes; }

  char memory[8 * 1024] = {};
  int opens = 0, closes = 0, allocs = 0, frees = 0;
  std::vector<GpuDevice> devices_ = {GpuDevice{.index = 0}};
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
  EXPECT_TRUE(in_export->pool);  // A pool's: for peer daemons only.
  auto in_mapping = table.Find(gpu.memory + 2048 + 1000, 24);
  ASSERT_TRUE(in_mapping.has_value());
  EXPECT_EQ(in_mapping->handle, "h2");
  EXPECT_EQ(in_mapping->offset, 1000u);
  EXPECT_FALSE(table.Find(gpu.memory + 2048 + 1000, 25).has_value());  // Runs past the end.
  EXPECT_FALSE(table.Find(gpu.memory + 5000, 1).has_value());          // Nobody's.
}

TEST(OwnDeviceMemoryTest, OneBufferPerAllocationZeroedExportedAndCounted) {
  constexpr uint64_t kMiB = 1 << 20;
  FakeIpcRuntime gpu;
  IpcTable table(&gpu);
  OwnDeviceMemory own(&gpu, &table, 8 * kMiB);
  auto a = own.Allocate(0, 3 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(own.used(0), 4 * kMiB);  // Whole 2 MiB granules.
  // Every byte the handle maps is zero, the padding too.
  for (uint64_t i = 0; i < 4 * kMiB; i += 4093) ASSERT_EQ(a->data[i], 0) << i;
  EXPECT_EQ(a->data[4 * kMiB - 1], 0);
  auto ref = table.Find(a->data + 10, 100);
  ASSERT_TRUE(ref.has_value());
  EXPECT_EQ(ref->handle, "export-0-own");
  EXPECT_EQ(ref->offset, 10u);
  EXPECT_FALSE(ref->pool);  // May go to the buffer's owner.

  auto b = own.Allocate(0, 4 * kMiB);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(own.Allocate(0, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(own.Allocate(0, 9 * kMiB).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(own.Allocate(1, kMiB).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(own.Allocate(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu.allocs, 2);  // Refusals allocate nothing.

  const char* gone = a->data;
  auto keep = a->keepalive;
  a->keepalive.reset();
  EXPECT_EQ(gpu.frees, 0);  // A copy of the keepalive still holds it.
  keep.reset();
  EXPECT_EQ(gpu.frees, 1);
  EXPECT_FALSE(table.Find(gone, 1).has_value());  // No longer offered.
  EXPECT_EQ(own.used(0), 4 * kMiB);
  EXPECT_TRUE(own.Allocate(0, 3 * kMiB).ok());  // Room again (and freed at once).
  b->keepalive.reset();
  EXPECT_EQ(own.used(0), 0u);
}

TEST(GpuUuidTest, PrintsAsNvidiaSmiDoes) {
  const unsigned char bytes[16] = {0x25, 0x9b, 0xb6, 0x8d, 0x07, 0xa2, 0xa0, 0xff,
                                   0xd8, 0x89, 0xcb, 0x0b, 0xcf, 0x3b, 0x3d, 0xf7};
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-259bb68d-07a2-a0ff-d889-cb0bcf3b3df7");
}

}  // namespace
}  // namespace gpumove
