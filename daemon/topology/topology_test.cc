// The GPU-NIC map on recorded-shape sysfs trees: the PCIe layouts of common 8-GPU machines
// (from their public topology descriptions), built as directories and symlinks the way
// the kernel lays them out.
#include "daemon/topology/topology.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

namespace fs = std::filesystem;

class FakeSysfs {
 public:
  FakeSysfs() {
    root_ = fs::path(::testing::TempDir()) / absl::StrCat("sysfs.", getpid(), ".", counter_++);
    fs::remove_all(root_);
    fs::create_directories(root_ / "bus/pci/devices");
    fs::create_directories(root_ / "class/infiniband");
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  std::string root() const { return root_.string(); }

  // A PCI function at the end of `chain` (root port first) under host bridge `bridge`;
  // every element of the chain is a device directory (bridges included).
  void Device(const std::string& bridge, const std::vector<std::string>& chain,
              const std::string& vendor, const std::string& cls, int numa) {
    fs::path p = root_ / "devices" / bridge;
    for (const std::string& c : chain) {
      p /= c;
      fs::create_directories(p);
      const fs::path link = root_ / "bus/pci/devices" / c;
      if (!fs::exists(fs::symlink_status(link))) fs::create_directory_symlink(p, link);
      Write(p / "numa_node", absl::StrCat(numa));
      if (!fs::exists(p / "vendor")) {
        Write(p / "vendor", "0x8086");  // Bridges: not NVIDIA.
        Write(p / "class", "0x060400");
      }
    }
    Write(p / "vendor", vendor);
    Write(p / "class", cls);
  }
  void Gpu(const std::string& bridge, const std::vector<std::string>& chain, int numa) {
    Device(bridge, chain, "0x10de", "0x030200", numa);
  }
  void Nic(const std::string& name, const std::string& bridge,
           const std::vector<std::string>& chain, int numa) {
    Device(bridge, chain, "0x15b3", "0x020700", numa);
    fs::create_directories(root_ / "class/infiniband" / name);
    fs::create_directory_symlink(root_ / "bus/pci/devices" / chain.back(),
                                 root_ / "class/infiniband" / name / "device");
  }

 private:
  static void Write(const fs::path& p, const std::string& s) { std::ofstream(p) << s << "\n"; }
  static inline int counter_ = 0;
  fs::path root_;
};

std::string Bdf(int bus, int dev = 0, int fn = 0) {
  return absl::StrFormat("0000:%02x:%02x.%x", bus, dev, fn);
}

// DGX H100-like: eight GPUs, each with a ConnectX-7 on its own PCIe switch, each pair on
// its own root complex, four pairs a CPU socket (nvidia-smi topo: GPUn-NICn PIX, the rest
// NODE within a socket and SYS across).
TEST(TopologyTest, EachGpuGetsTheNicOnItsOwnSwitch) {
  FakeSysfs sys;
  for (int i = 0; i < 8; ++i) {
    const int bus = 0x10 + 0x10 * i;
    const std::string bridge = absl::StrFormat("pci0000:%02x", bus);
    const std::vector<std::string> up = {Bdf(bus, 1), Bdf(bus + 1)};  // Root port, switch.
    auto with = [&](std::vector<std::string> c) {
      std::vector<std::string> all = up;
      all.insert(all.end(), c.begin(), c.end());
      return all;
    };
    sys.Gpu(bridge, with({Bdf(bus + 2, 0), Bdf(bus + 3)}), i / 4);
    sys.Nic(absl::StrCat("mlx5_", i), bridge, with({Bdf(bus + 2, 1), Bdf(bus + 4)}), i / 4);
  }
  auto t = ReadTopology(sys.root());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->gpus.size(), 8u);
  ASSERT_EQ(t->nics.size(), 8u);
  ASSERT_EQ(t->map.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t->map[i].nearest, std::vector<std::string>{absl::StrCat("mlx5_", i)}) << i;
    EXPECT_EQ(t->map[i].distance, PciDistance::kPix) << i;
    EXPECT_EQ(t->map[i].gpu.numa_node, i / 4);
  }
  std::string why;
  EXPECT_EQ(Distance(t->gpus[0], t->nics[1], &why), PciDistance::kNode) << why;
  EXPECT_EQ(Distance(t->gpus[0], t->nics[5], &why), PciDistance::kSys) << why;
  EXPECT_EQ(DescribeTopology(*t)[0],
            "GPU0 (0000:13:00.0, NUMA 0): mlx5_0 (PIX: same PCIe switch 0000:11:00.0)");
}

// A PCIe server without switches shared by GPUs and NICs: each GPU on a root port of its
// own, two NICs a socket on root ports of another host bridge. The nearest are both NICs of
// the GPU's socket (NODE), never the other socket's.
TEST(TopologyTest, WithoutASharedSwitchTheSocketsNicsAreNearest) {
  FakeSysfs sys;
  for (int i = 0; i < 8; ++i) {
    const int bus = 0x20 + 0x10 * i;
    sys.Gpu(absl::StrFormat("pci0000:%02x", bus), {Bdf(bus, 1), Bdf(bus + 1)}, i / 4);
  }
  for (int n = 0; n < 4; ++n) {
    const int bus = 0xa0 + 0x10 * n;
    sys.Nic(absl::StrCat("mlx5_", n), absl::StrFormat("pci0000:%02x", bus),
            {Bdf(bus, 1), Bdf(bus + 1)}, n / 2);
  }
  auto t = ReadTopology(sys.root());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->map.size(), 8u);
  EXPECT_EQ(t->map[0].nearest, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(t->map[0].distance, PciDistance::kNode);
  EXPECT_EQ(t->map[7].nearest, (std::vector<std::string>{"mlx5_2", "mlx5_3"}));
}

// Two levels of switches below one root port (a PCIe expansion chassis): PXB, nearer than
// a NIC elsewhere on the host bridge (PHB).
TEST(TopologyTest, NestedSwitchesArePxbAndBeatTheHostBridge) {
  FakeSysfs sys;
  const std::string bridge = "pci0000:00";
  // Root port 00:01.0 -> switch 01:00.0 -> ports 02:00.0 / 02:01.0 -> switches 03/04 -> ...
  sys.Gpu(bridge, {Bdf(0, 1), Bdf(1), Bdf(2, 0), Bdf(3), Bdf(4, 0), Bdf(5)}, 0);
  sys.Nic("mlx5_0", bridge, {Bdf(0, 1), Bdf(1), Bdf(2, 1), Bdf(6), Bdf(7, 0), Bdf(8)}, 0);
  sys.Nic("mlx5_1", bridge, {Bdf(0, 2), Bdf(9)}, 0);
  auto t = ReadTopology(sys.root());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->map.size(), 1u);
  EXPECT_EQ(t->map[0].nearest, std::vector<std::string>{"mlx5_0"});
  EXPECT_EQ(t->map[0].distance, PciDistance::kPxb);
  std::string why;
  EXPECT_EQ(Distance(t->gpus[0], t->nics[1], &why), PciDistance::kPhb) << why;
}

// No RDMA device on PCI (Soft-RoCE's rxe has none), or no GPU: no map, and it says so.
TEST(TopologyTest, NoNicOrNoGpuGivesNoMap) {
  FakeSysfs sys;
  sys.Gpu("pci0000:00", {Bdf(0, 1), Bdf(1)}, -1);
  auto t = ReadTopology(sys.root());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->map.empty());
  EXPECT_EQ(DescribeTopology(*t),
            std::vector<std::string>{"1 GPU(s), 0 RDMA device(s) on PCI: no GPU-NIC map"});
  EXPECT_FALSE(ReadTopology(sys.root() + "/nowhere").ok());
}

// GPUDirect RDMA readiness names every missing piece, and is ready with all of them.
TEST(TopologyTest, GpuDirectRdmaReadinessSaysWhatIsMissing) {
  FakeSysfs sys;
  auto empty = ReadTopology(sys.root());
  ASSERT_TRUE(empty.ok());
  const std::string none = GpuDirectRdmaReadiness(*empty, false, sys.root());
  for (const char* part : {"not available", "no NVIDIA GPU on PCI", "no RDMA device on PCI",
                           "UCX does not take device memory", "nvidia_peermem"}) {
    EXPECT_NE(none.find(part), std::string::npos) << part << " in " << none;
  }
  sys.Gpu("pci0000:00", {Bdf(0, 1), Bdf(1), Bdf(2, 0), Bdf(3)}, 0);
  sys.Nic("mlx5_0", "pci0000:00", {Bdf(0, 1), Bdf(1), Bdf(2, 1), Bdf(4)}, 0);
  auto t = ReadTopology(sys.root());
  ASSERT_TRUE(t.ok());
  EXPECT_NE(GpuDirectRdmaReadiness(*t, true, sys.root()).find("neither nvidia_peermem"),
            std::string::npos);
  // The proprietary driver loaded (taint P): no dma-buf; the open one: dma-buf.
  const fs::path nvidia = fs::path(sys.root()) / "module/nvidia";
  fs::create_directories(nvidia);
  std::ofstream(nvidia / "initstate") << "live\n";
  std::ofstream(nvidia / "taint") << "PO\n";
  EXPECT_NE(GpuDirectRdmaReadiness(*t, true, sys.root()).find("not available"), std::string::npos);
  std::ofstream(nvidia / "taint") << "O\n";
  EXPECT_EQ(GpuDirectRdmaReadiness(*t, true, sys.root()),
            "GPUDirect RDMA: ready (1 RDMA device(s), dma-buf, CUDA-aware UCX)");
  std::ofstream(nvidia / "taint") << "PO\n";
  fs::create_directories(fs::path(sys.root()) / "module/nvidia_peermem");
  EXPECT_EQ(GpuDirectRdmaReadiness(*t, true, sys.root()),
            "GPUDirect RDMA: ready (1 RDMA device(s), nvidia_peermem, CUDA-aware UCX)");
  EXPECT_NE(GpuDirectRdmaReadiness(*t, false, sys.root()).find("not available (UCX"),
            std::string::npos);
}

// This machine's own sysfs reads without error, whatever it has.
TEST(TopologyTest, TheRealSysfsReads) {
  auto t = ReadTopology("/sys");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(DescribeTopology(*t).empty());
}

}  // namespace
}  // namespace gpumove
