#include "daemon/topology/topology.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpumove {
namespace {

namespace fs = std::filesystem;

std::string ReadLine(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

bool IsPciAddress(absl::string_view s) {
  // dddd:bb:dd.f
  return s.size() == 12 && s[4] == ':' && s[7] == ':' && s[10] == '.';
}

// The device at PCI `address`: its chain from the resolved /sys/devices path.
absl::StatusOr<PciDevice> Describe(const fs::path& sysfs, const std::string& name,
                                   const std::string& address) {
  PciDevice d;
  d.name = name;
  d.address = address;
  const fs::path link = sysfs / "bus/pci/devices" / address;
  std::error_code ec;
  const fs::path real = fs::canonical(link, ec);
  if (ec)
    return absl::NotFoundError(absl::StrCat("cannot resolve ", link.string(), ": ", ec.message()));
  for (const auto& part : real) {
    const std::string s = part.string();
    if (absl::StartsWith(s, "pci") && s.find(':') != std::string::npos) d.host_bridge = s;
    if (IsPciAddress(s)) d.chain.push_back(s);
  }
  if (d.chain.empty() || d.chain.back() != address) {
    return absl::InternalError(absl::StrCat(real.string(), " does not end at ", address));
  }
  int numa = -1;
  if (absl::SimpleAtoi(ReadLine(link / "numa_node"), &numa)) d.numa_node = numa;
  return d;
}

}  // namespace

const char* PciDistanceName(PciDistance d) {
  switch (d) {
    case PciDistance::kPix:
      return "PIX";
    case PciDistance::kPxb:
      return "PXB";
    case PciDistance::kPhb:
      return "PHB";
    case PciDistance::kNode:
      return "NODE";
    case PciDistance::kSys:
      return "SYS";
  }
  return "?";
}

PciDistance Distance(const PciDevice& a, const PciDevice& b, std::string* why) {
  if (!a.host_bridge.empty() && a.host_bridge == b.host_bridge) {
    size_t common = 0;
    while (common < a.chain.size() - 1 && common < b.chain.size() - 1 &&
           a.chain[common] == b.chain[common]) {
      ++common;
    }
    if (common == 0) {
      *why = absl::StrCat("same host bridge ", a.host_bridge);
      return PciDistance::kPhb;
    }
    // Below the shared bridge each side passes a downstream port to reach its device: one
    // switch when the shared part ends at a switch's upstream port (at least root port and
    // upstream port shared, each device right below a downstream port).
    const size_t below_a = a.chain.size() - common, below_b = b.chain.size() - common;
    if (common >= 2 && below_a <= 2 && below_b <= 2) {
      *why = absl::StrCat("same PCIe switch ", a.chain[common - 1]);
      return PciDistance::kPix;
    }
    *why = absl::StrCat("PCIe bridges below ", a.chain[common - 1]);
    return PciDistance::kPxb;
  }
  if (a.numa_node >= 0 && a.numa_node == b.numa_node) {
    *why = absl::StrCat("same NUMA node ", a.numa_node, ", host bridges ", a.host_bridge, " and ",
                        b.host_bridge);
    return PciDistance::kNode;
  }
  *why = a.numa_node >= 0 && b.numa_node >= 0
             ? absl::StrCat("NUMA nodes ", a.numa_node, " and ", b.numa_node)
             : std::string("different host bridges, NUMA unknown");
  return PciDistance::kSys;
}

absl::StatusOr<Topology> ReadTopology(const std::string& root) {
  const fs::path sysfs(root);
  Topology t;
  std::error_code ec;
  const fs::path pci = sysfs / "bus/pci/devices";
  if (!fs::is_directory(pci, ec)) return absl::NotFoundError(absl::StrCat("no ", pci.string()));
  std::vector<std::string> addresses;
  for (const auto& e : fs::directory_iterator(pci, ec)) addresses.push_back(e.path().filename());
  std::sort(addresses.begin(), addresses.end());
  for (const std::string& a : addresses) {
    // NVIDIA (0x10de) VGA (0x0300) or 3D (0x0302) controllers.
    const std::string vendor = ReadLine(pci / a / "vendor");
    const std::string cls = ReadLine(pci / a / "class");
    if (vendor != "0x10de" ||
        !(absl::StartsWith(cls, "0x0300") || absl::StartsWith(cls, "0x0302"))) {
      continue;
    }
    auto d = Describe(sysfs, absl::StrCat("GPU", t.gpus.size()), a);
    if (!d.ok()) return d.status();
    t.gpus.push_back(*std::move(d));
  }
  const fs::path ib = sysfs / "class/infiniband";
  std::vector<std::string> nics;
  if (fs::is_directory(ib, ec)) {
    for (const auto& e : fs::directory_iterator(ib, ec)) nics.push_back(e.path().filename());
  }
  std::sort(nics.begin(), nics.end());
  for (const std::string& n : nics) {
    const fs::path dev = fs::canonical(ib / n / "device", ec);
    if (ec || !IsPciAddress(dev.filename().string())) continue;  // Soft-RoCE: no PCI device.
    auto d = Describe(sysfs, n, dev.filename().string());
    if (!d.ok()) return d.status();
    t.nics.push_back(*std::move(d));
  }
  for (const PciDevice& g : t.gpus) {
    if (t.nics.empty()) break;
    GpuNics m;
    m.gpu = g;
    for (const PciDevice& n : t.nics) {
      std::string why;
      const PciDistance d = Distance(g, n, &why);
      if (m.nearest.empty() || d < m.distance) {
        m.nearest = {n.name};
        m.distance = d;
        m.why = why;
      } else if (d == m.distance) {
        m.nearest.push_back(n.name);
      }
    }
    t.map.push_back(std::move(m));
  }
  return t;
}

std::string GpuDirectRdmaReadiness(const Topology& t, bool ucx_cuda_aware,
                                   const std::string& root) {
  const fs::path sysfs(root);
  std::error_code ec;
  std::vector<std::string> missing;
  if (t.gpus.empty()) missing.push_back("no NVIDIA GPU on PCI");
  if (t.nics.empty()) missing.push_back("no RDMA device on PCI");
  if (!ucx_cuda_aware) missing.push_back("UCX does not take device memory (not built with CUDA)");
  const bool peermem = fs::exists(sysfs / "module/nvidia_peermem", ec) ||
                       fs::exists(sysfs / "module/nv_peer_mem", ec);
  // The open GPU kernel modules (loaded, and not tainting the kernel as proprietary: no 'P'
  // in the module's taint flags) export GPU memory as dma-buf, which the RDMA stack imports.
  const bool nvidia_loaded = ReadLine(sysfs / "module/nvidia/initstate") == "live";
  const bool dmabuf =
      nvidia_loaded && !absl::StrContains(ReadLine(sysfs / "module/nvidia/taint"), "P");
  if (!peermem && !dmabuf) {
    missing.push_back(
        "neither nvidia_peermem loaded (modprobe nvidia-peermem) nor the open "
        "GPU kernel modules' dma-buf");
  }
  if (missing.empty()) {
    return absl::StrCat("GPUDirect RDMA: ready (", t.nics.size(), " RDMA device(s), ",
                        peermem ? "nvidia_peermem" : "dma-buf", ", CUDA-aware UCX)");
  }
  return absl::StrCat("GPUDirect RDMA: not available (", absl::StrJoin(missing, "; "),
                      "): device memory crosses hosts staged through pinned host memory");
}

std::vector<std::string> DescribeTopology(const Topology& t) {
  std::vector<std::string> lines;
  for (const GpuNics& m : t.map) {
    lines.push_back(absl::StrCat(m.gpu.name, " (", m.gpu.address, ", NUMA ", m.gpu.numa_node,
                                 "): ", absl::StrJoin(m.nearest, ", "), " (",
                                 PciDistanceName(m.distance), ": ", m.why, ")"));
  }
  if (lines.empty()) {
    lines.push_back(absl::StrCat(t.gpus.size(), " GPU(s), ", t.nics.size(),
                                 " RDMA device(s) on PCI: no GPU-NIC map"));
  }
  return lines;
}

}  // namespace gpumove
