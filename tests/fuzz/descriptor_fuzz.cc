// Fuzzes what a cluster does with a peer's Hello: any NodeDescriptor (parsed from the
// input) goes through Cluster::OnHello with the daemon's own paths reading their blobs
// (UCX's details with the daemon's own check, MPI's rank). No input may crash; a refused one changes nothing
// the cluster knew; an accepted one is found under its name.
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "daemon/cluster/cluster.h"
#include "daemon/path/mpi/mpi_hello.h"
#include "daemon/path/ucx/ucx_hello.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {
namespace {

// A fresh cluster every 10000 inputs, so that what it learned stays bounded.
Cluster& TheCluster() {
  static std::unique_ptr<Cluster> cluster;
  static int uses = 0;
  if (cluster == nullptr || ++uses % 10000 == 0) {
    peer::v1::NodeDescriptor self;
    self.set_node("fuzz-self");
    self.set_address("127.0.0.1:1");
    ClusterOptions options;
    // The daemon's own check, against the shape of a typical address (a worker with no
    // transports: any entry of the input is of a transport it lacks).
    static const UcxHello ucx(peer::v1::UcxDetails(), std::make_shared<UcxAddressShape>());
    static const MpiHello mpi(0, 0x5eed);
    options.paths = {&ucx, &mpi};
    // Not started: no heartbeats dial what it learns.
    cluster = std::make_unique<Cluster>(options, self);
  }
  return *cluster;
}

}  // namespace
}  // namespace gpumove

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpumove::peer::v1::NodeDescriptor d;
  if (!d.ParseFromArray(data, static_cast<int>(size))) return 0;
  gpumove::Cluster& c = gpumove::TheCluster();
  auto before = c.Find(d.node());
  auto known = c.OnHello(d);
  auto after = c.Find(d.node());
  if (!known.ok()) {
    // Refused: what was known of that name is as it was.
    if (before.ok() != after.ok()) std::abort();
    if (before.ok() && before->descriptor.SerializeAsString() !=
                           after->descriptor.SerializeAsString()) {
      std::abort();
    }
  } else if (!d.node().empty() && d.node() != "fuzz-self" && !after.ok()) {
    std::abort();
  }
  return 0;
}
