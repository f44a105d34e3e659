// Which RDMA devices are nearest each GPU, read from sysfs: the PCIe tree (switches, root
// ports, host bridges) and NUMA nodes, classified as nvidia-smi's `topo -m` does, so that a
// GPU's memory goes out through the NIC on its own PCIe switch (GPUDirect RDMA's fast
// case) and its pinned host memory lives on its NUMA node.
#ifndef GPUMOVE_DAEMON_TOPOLOGY_TOPOLOGY_H_
#define GPUMOVE_DAEMON_TOPOLOGY_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpumove {

// How far apart two PCIe devices are, nearest first (nvidia-smi topo's names).
enum class PciDistance {
  kPix,   // Through at most one PCIe switch (both below the same switch).
  kPxb,   // Through several PCIe bridges, not the host bridge.
  kPhb,   // Through the PCIe host bridge (the same root complex).
  kNode,  // Between host bridges of one NUMA node.
  kSys,   // Across NUMA nodes (the CPUs' interconnect).
};
const char* PciDistanceName(PciDistance d);

struct PciDevice {
  std::string name;     // "GPU0", "mlx5_0".
  std::string address;  // PCI address, "0000:17:00.0".
  int numa_node = -1;   // -1: unknown (one-node machines, VMs).
  // The PCI addresses from the root port down to the device itself; `host_bridge` the
  // "pci0000:16" above them.
  std::vector<std::string> chain;
  std::string host_bridge;
};

// The distance between two devices and a short why ("same PCIe switch 0000:16:01.0").
PciDistance Distance(const PciDevice& a, const PciDevice& b, std::string* why);

struct GpuNics {
  PciDevice gpu;
  std::vector<std::string> nearest;  // RDMA devices at the nearest distance (ties: all).
  PciDistance distance = PciDistance::kSys;
  std::string why;
};

struct Topology {
  std::vector<PciDevice> gpus;  // NVIDIA display/3D controllers, by PCI address.
  std::vector<PciDevice> nics;  // /sys/class/infiniband devices.
  std::vector<GpuNics> map;     // Per GPU; empty without RDMA devices.
};

// Reads the topology under `sysfs` ("/sys", or a recorded tree in tests). No GPUs or no
// RDMA devices is not an error (an empty list); an unreadable tree is.
absl::StatusOr<Topology> ReadTopology(const std::string& sysfs = "/sys");

// Whether device memory can go straight from a GPU to an RDMA NIC (GPUDirect RDMA) here,
// and if not, why: it needs RDMA devices on PCI, a UCX that takes device pointers, and the
// NVIDIA driver's peer-memory module (nvidia_peermem, or the older nv_peer_mem) loaded or
// dma-buf (the open GPU kernel modules). One line for `gpumovectl info`.
std::string GpuDirectRdmaReadiness(const Topology& t, bool ucx_cuda_aware,
                                   const std::string& sysfs = "/sys");

// One line per GPU for `gpumovectl info`: "GPU0 (0000:1b:00.0, NUMA 0): mlx5_0 (PIX: ...)".
std::vector<std::string> DescribeTopology(const Topology& t);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_TOPOLOGY_TOPOLOGY_H_
