// NodeService in-process: what GetInfo and ListPeers say of a node built from real pools,
// a scheduler, an engine and a cluster table, through an in-process gRPC server.
#include "daemon/server/node_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "daemon/core/buffer_registry.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"
#include "daemon/path/local/local_engine.h"
#include "daemon/server/auth.h"

namespace gpumove {
namespace {

TEST(NodeService, SaysWhatTheNodeHasAndWhomItKnows) {
  auto auth = Authenticator::Open();
  auto gpu = GpuRuntime::CreateHostOnly("no GPU in this test");
  PoolSizes sizes;
  sizes.host = 8 << 20;
  sizes.pinned = 0;
  auto pools = *PoolSet::Create(sizes, {}, gpu.get());
  BufferRegistry registry(pools.get(), absl::ZeroDuration());
  LocalEngine local(gpu.get());
  TransferScheduler scheduler(
      SchedulerOptions(), &registry, {&local},
      [](const Endpoint&, uint64_t) { return absl::StatusOr<uint64_t>(1); });
  peer::v1::NodeDescriptor self;
  self.set_node("n");
  Cluster cluster(ClusterOptions(), self);
  peer::v1::NodeDescriptor peer;
  peer.set_node("m");
  peer.set_address("127.0.0.1:9");
  peer.set_incarnation(3);
  ASSERT_TRUE(cluster.OnHello(peer).ok());

  NodeFacts facts;
  facts.node = "n";
  facts.host = "h";
  facts.listen = {"127.0.0.1:1"};
  facts.start_time = absl::Now();
  facts.gpu = gpu.get();
  facts.pools = pools.get();
  facts.scheduler = &scheduler;
  facts.engines = {&local};
  facts.cluster = &cluster;
  NodeServiceImpl service(auth.get(), facts);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  auto stub = v1::NodeService::NewStub(server->InProcessChannel(grpc::ChannelArguments()));

  AllocateOptions o;
  o.size = 3 << 20;
  o.owner = "anonymous";
  ASSERT_TRUE(registry.Allocate(o).ok());
  grpc::ClientContext c1;
  v1::NodeInfo info;
  ASSERT_TRUE(stub->GetInfo(&c1, v1::GetInfoRequest(), &info).ok());
  EXPECT_EQ(info.node(), "n");
  EXPECT_EQ(info.host(), "h");
  EXPECT_EQ(info.version(), kVersion);
  EXPECT_EQ(info.gpus_size(), 0);
  EXPECT_FALSE(info.gpu_status().empty());
  bool host_pool = false;
  for (const v1::PoolInfo& p : info.pools()) {
    if (p.kind() != v1::HOST) continue;
    host_pool = true;
    EXPECT_EQ(p.capacity(), 8u << 20);
    EXPECT_EQ(p.free(), 5u << 20);  // The buffer above is counted.
    EXPECT_EQ(p.buffers(), 1u);
  }
  EXPECT_TRUE(host_pool);
  bool local_path = false;
  for (const v1::PathInfo& p : info.paths()) local_path |= p.path() == v1::LOCAL && p.available();
  EXPECT_TRUE(local_path);

  grpc::ClientContext c2;
  v1::ListPeersResponse peers;
  ASSERT_TRUE(stub->ListPeers(&c2, v1::ListPeersRequest(), &peers).ok());
  ASSERT_EQ(peers.peers_size(), 1);
  EXPECT_EQ(peers.peers(0).node(), "m");
  EXPECT_EQ(peers.peers(0).address(), "127.0.0.1:9");
  EXPECT_TRUE(peers.peers(0).up());
  server->Shutdown();
}

}  // namespace
}  // namespace gpumove
