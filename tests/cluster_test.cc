// Three gpumoved nodes on loopback, one cluster: moves in every direction (push, pull and
// third-party), verified by checksum and by reading back; concurrency; cancel; a node
// killed mid-move; the killed node restarted and rejoining.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <random>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"
#include "tests/util/daemon_process.h"
#include "tests/util/peer_calls.h"
#include "tests/util/random_bytes.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

using ::absl::StatusCode;

using Node = TestNode;

// A range of a buffer on node `n`.
v1::BufferRef On(const Node& n, const std::string& id, uint64_t offset = 0, uint64_t length = 0) {
  v1::BufferRef r = Ref(id, offset, length);
  r.set_node(n.name);
  return r;
}

// Moves `size` random bytes from a buffer on `f` (at offset 16) into one on `t` (at
// offset 8, between bytes that must stay), submitted to `runner`, over UCX with a
// checksum; checks them by reading back, then releases both buffers. Seeds from `seed`.
void MoveVerified(Node& f, Node& t, Node& runner, uint64_t size, v1::MemoryKind src_kind,
                  v1::MemoryKind dst_kind, uint64_t& seed) {
  auto src = f.client->Allocate(size + 16, src_kind);
  auto dst = t.client->Allocate(size + 32, dst_kind);
  ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
  const std::string data = RandomBytes(size + 16, seed++);
  const std::string before = RandomBytes(size + 32, seed++);
  ASSERT_TRUE(f.client->Write(Ref(src->id()), data).ok());
  ASSERT_TRUE(t.client->Write(Ref(dst->id()), before).ok());
  MoveOptions o;
  o.checksum = true;
  auto moved = runner.client->Move(On(f, src->id(), 16, size), On(t, dst->id(), 8), o);
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  EXPECT_EQ(moved->path(), v1::UCX);
  EXPECT_EQ(moved->source_xxh3(), moved->destination_xxh3());
  const std::string after = *t.client->Read(Ref(dst->id()));
  EXPECT_TRUE(after.substr(0, 8) == before.substr(0, 8));
  EXPECT_TRUE(after.substr(8, size) == data.substr(16, size));
  EXPECT_TRUE(after.substr(8 + size) == before.substr(8 + size));
  // Both ends let go of their buffers once the move is over.
  ASSERT_TRUE(f.client->Release(src->id()).ok());
  ASSERT_TRUE(t.client->Release(dst->id()).ok());
}

// A counter of a node's /metrics (refreshed every second; the node needs
// --metrics_listen); -1 when absent.
double Counter(const Node& n, const std::string& name) {
  return MetricValue(n.client->GetInfo()->metrics_address(), name);
}

// What node `n` says of itself in a Hello (its incarnation, for peer calls made here as
// it: a node holds ranges only for peers it has met, at their incarnation).
uint64_t IncarnationOf(const Node& n) {
  auto stub = peer::v1::PeerService::NewStub(
      grpc::CreateChannel(n.process->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  peer::v1::HelloResponse response;
  stub->Hello(&context, peer::v1::HelloRequest(), &response);
  return response.node().incarnation();
}

class ClusterTest : public ::testing::Test {
 protected:
  static Node StartNode(const std::string& name, const std::string& join,
                        std::vector<std::string> extra = {}) {
    // Two UCX lanes: idle beside direct copies, used by nodes started with --noucx_direct.
    std::vector<std::string> flags = {"--host_pool_size=768MiB", "--pinned_pool_size=64MiB",
                                      "--ucx_lanes=2"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return LaunchNode(name, join, flags);
  }

  // Waits until every node sees `want` peers up.
  static void AwaitMembership(std::vector<Node*> nodes, size_t want) {
    for (Node* n : nodes) {
      absl::Status st = AwaitPeersUp(*n, want, /*exactly=*/true);
      ASSERT_TRUE(st.ok()) << st;
    }
  }

  void SetUp() override {
    nodes_.push_back(StartNode("node-a", ""));
    nodes_.push_back(StartNode("node-b", nodes_[0].process->address()));
    nodes_.push_back(StartNode("node-c", nodes_[0].process->address()));
    AwaitMembership({&nodes_[0], &nodes_[1], &nodes_[2]}, 2);
  }

  std::vector<Node> nodes_;
};

TEST_F(ClusterTest, ListPeersShowsTheWholeCluster) {
  auto peers = nodes_[1].client->ListPeers();
  ASSERT_TRUE(peers.ok());
  ASSERT_EQ(peers->size(), 2u);
  EXPECT_EQ((*peers)[0].node(), "node-a");
  EXPECT_EQ((*peers)[1].node(), "node-c");  // Found through node-a.
  auto info = nodes_[0].client->GetInfo();
  bool ucx = false;
  for (const auto& p : info->paths()) ucx |= p.path() == v1::UCX && p.available();
  EXPECT_TRUE(ucx);
}

TEST_F(ClusterTest, AnyNodeServesBuffersOfEveryNode) {
  // A client of node-c alone allocates, writes, reads, renews, lists and releases a
  // buffer that lives on node-a.
  Client& c = *nodes_[2].client;
  auto b = c.Allocate((2 << 20) + 7, v1::PINNED_HOST, 0, absl::Seconds(30), "remote", "node-a");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->node(), "node-a");
  EXPECT_TRUE(nodes_[0].client->GetBuffer(b->id()).ok());  // It is really on node-a.
  const std::string data = RandomBytes((2 << 20) + 7, 31);
  ASSERT_TRUE(c.Write(On(nodes_[0], b->id()), data).ok());
  EXPECT_TRUE(*nodes_[0].client->Read(Ref(b->id())) == data);
  EXPECT_TRUE(*c.Read(On(nodes_[0], b->id(), 5, 100)) == data.substr(5, 100));
  EXPECT_TRUE(c.RenewLease(b->id(), absl::Seconds(60), "node-a").ok());
  EXPECT_EQ(c.GetBuffer(b->id(), "node-a")->label(), "remote");
  auto listed = c.ListBuffers("node-a");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_TRUE(c.ListBuffers()->empty());  // node-c's own list is its own.
  EXPECT_EQ(c.Release(b->id(), "node-b").code(), StatusCode::kNotFound);
  EXPECT_TRUE(c.Release(b->id(), "node-a").ok());
  EXPECT_EQ(nodes_[0].client->GetBuffer(b->id()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.Allocate(4096, v1::HOST, 0, absl::ZeroDuration(), "", "node-z").status().code(),
            StatusCode::kNotFound);
}

TEST_F(ClusterTest, EveryDirectionEveryWayVerified) {
  uint64_t seed = 1;
  int case_no = 0;
  for (uint64_t size : {1ull, 4097ull, (1ull << 20) + 3, 24ull << 20}) {
    for (int from = 0; from < 3; ++from) {
      for (int to = 0; to < 3; ++to) {
        if (from == to) continue;
        const int submit_at = case_no++ % 3;  // Push, pull or third party, in turn.
        const v1::MemoryKind src_kind = (case_no % 2) ? v1::HOST : v1::PINNED_HOST;
        const v1::MemoryKind dst_kind = (case_no % 2) ? v1::PINNED_HOST : v1::HOST;
        Node& f = nodes_[from];
        Node& t = nodes_[to];
        SCOPED_TRACE(absl::StrCat(f.name, " -> ", t.name, " ", size, " bytes, submitted at ",
                                  nodes_[submit_at].name));
        MoveVerified(f, t, nodes_[submit_at], size, src_kind, dst_kind, seed);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(ClusterTest, HundredsOfMebibytes) {
  const uint64_t size = 320ull << 20;
  auto src = nodes_[0].client->Allocate(size);
  auto dst = nodes_[2].client->Allocate(size);
  ASSERT_TRUE(src.ok() && dst.ok());
  const std::string data = RandomBytes(size, 77);
  ASSERT_TRUE(nodes_[0].client->Write(Ref(src->id()), data).ok());
  MoveOptions o;
  o.checksum = true;
  auto moved = nodes_[1].client->Move(On(nodes_[0], src->id()), On(nodes_[2], dst->id()), o);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  EXPECT_TRUE(*nodes_[2].client->Read(Ref(dst->id())) == data);
}

TEST_F(ClusterTest, ManyConcurrentMoves) {
  constexpr int kMoves = 24;
  const uint64_t size = 2 << 20;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kMoves);
  for (int i = 0; i < kMoves; ++i) {
    threads.emplace_back([&, i] {
      Node& f = nodes_[i % 3];
      Node& t = nodes_[(i + 1 + i / 3 % 2) % 3];
      auto src = f.client->Allocate(size);
      auto dst = t.client->Allocate(size);
      if (!src.ok() || !dst.ok()) {
        errors[i] = "allocate failed";
        return;
      }
      const std::string data = RandomBytes(size, 1000 + i);
      if (!f.client->Write(Ref(src->id()), data).ok()) errors[i] = "write failed";
      auto moved = nodes_[(i + 2) % 3].client->Move(On(f, src->id()), On(t, dst->id()));
      if (!moved.ok() || moved->state() != v1::SUCCEEDED) {
        errors[i] = moved.ok() ? moved->error_message() : moved.status().ToString();
        return;
      }
      if (*t.client->Read(Ref(dst->id())) != data) errors[i] = "bytes differ";
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < kMoves; ++i) EXPECT_EQ(errors[i], "") << "move " << i;
}

TEST_F(ClusterTest, AnyNodeAnswersForAnyTransfer) {
  auto src = nodes_[0].client->Allocate(1 << 20);
  auto dst = nodes_[1].client->Allocate(1 << 20);
  MoveOptions o;
  o.wait = false;
  auto t = nodes_[2].client->Move(On(nodes_[0], src->id()), On(nodes_[1], dst->id()), o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(absl::EndsWith(t->id(), ".node-a")) << t->id();  // A push runs at the source.
  for (Node& n : nodes_) {
    auto done = n.client->Wait(t->id(), absl::Seconds(10));
    ASSERT_TRUE(done.ok()) << n.name << ": " << done.status();
    EXPECT_EQ(done->state(), v1::SUCCEEDED);
    auto watched = n.client->Watch(t->id(), nullptr);
    ASSERT_TRUE(watched.ok()) << n.name << ": " << watched.status();
    EXPECT_EQ(watched->state(), v1::SUCCEEDED);
    EXPECT_EQ(n.client->GetTransfer(t->id())->id(), t->id());
  }
  EXPECT_EQ(nodes_[1].client->GetTransfer("t-0000000000000000.node-z").status().code(),
            StatusCode::kNotFound);
}

TEST_F(ClusterTest, BadRemoteRequestsGetTheirCodes) {
  auto src = nodes_[0].client->Allocate(4096);
  auto move_code = [&](v1::BufferRef s, v1::BufferRef d) {
    return nodes_[0].client->Move(s, d).status().code();
  };
  v1::BufferRef nowhere = Ref("b-x");
  nowhere.set_node("node-z");
  EXPECT_EQ(move_code(On(nodes_[0], src->id()), nowhere), StatusCode::kNotFound);
  EXPECT_EQ(move_code(On(nodes_[0], src->id()), On(nodes_[1], "b-missing")), StatusCode::kNotFound);
  auto small = nodes_[1].client->Allocate(1024);
  EXPECT_EQ(move_code(On(nodes_[0], src->id()), On(nodes_[1], small->id())),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(nodes_[1].client->GetBuffer(small->id())->active_uses(), 0u);
  // A move between two other nodes and one of ours in one batch cannot run anywhere.
  v1::SubmitRequest mixed;
  auto* m1 = mixed.add_transfers();
  *m1->mutable_source() = On(nodes_[1], small->id(), 0, 10);
  *m1->mutable_destination() = On(nodes_[2], "b-any");
  auto* m2 = mixed.add_transfers();
  *m2->mutable_source() = Ref(src->id(), 0, 10);
  *m2->mutable_destination() = Ref(src->id(), 100);
  EXPECT_EQ(nodes_[0].client->Submit(mixed).status().code(), StatusCode::kInvalidArgument);
}

// The acknowledgement of a move may name a GPU copy that is still running (a CUDA IPC
// fence). A node that cannot wait for it says so and lets the hold go: it never
// acknowledges bytes it has not seen land.
TEST_F(ClusterTest, AFenceTheNodeCannotWaitForIsRefusedAndTheHoldLetGo) {
  auto dst = nodes_[1].client->Allocate(4096);
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto peer = peer::v1::PeerService::NewStub(
      grpc::CreateChannel(nodes_[1].process->address(), grpc::InsecureChannelCredentials()));
  peer::v1::PrepareRemoteRequest prepare;
  prepare.set_transfer_id("t-fence");
  prepare.set_from_node("node-a");
  prepare.set_from_incarnation(IncarnationOf(nodes_[0]));
  prepare.set_owner("anonymous");
  *prepare.mutable_range() = Ref(dst->id());
  prepare.set_write(true);
  peer::v1::PrepareRemoteResponse held;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(PrepareOne(*peer, &ctx, prepare, &held).ok());
  }
  EXPECT_FALSE(held.cuda_ipc().reads_tails());  // Host memory, and no GPU here.
  EXPECT_EQ(nodes_[1].client->GetBuffer(dst->id())->active_uses(), 1u);
  peer::v1::CompleteRemoteRequest complete;
  complete.set_transfer_id("t-fence");
  complete.set_from_node("node-a");
  complete.set_tail_token(std::string(64, 'f'));
  peer::v1::CompleteRemoteResponse acked;
  grpc::ClientContext ctx;
  const grpc::Status st = CompleteOne(*peer, &ctx, complete, &acked);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("copy"), std::string::npos) << st.error_message();
  EXPECT_EQ(nodes_[1].client->GetBuffer(dst->id())->active_uses(), 0u);
}

TEST_F(ClusterTest, CancelMidMoveReleasesBothEnds) {
  Node slow = StartNode("node-s", nodes_[0].process->address(), {"--max_move_rate=64MiB"});
  AwaitMembership({&slow}, 3);
  auto src = slow.client->Allocate(128 << 20);
  auto dst = nodes_[1].client->Allocate(128 << 20);
  MoveOptions o;
  o.wait = false;
  auto t = nodes_[2].client->Move(On(slow, src->id()), On(nodes_[1], dst->id()), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(nodes_[0].client->Cancel(t->id()).ok());
  auto end = nodes_[1].client->Wait(t->id(), absl::Seconds(10));
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->state(), v1::CANCELLED);
  EXPECT_LT(end->bytes_done(), 128u << 20);
  EXPECT_TRUE(nodes_[1].client->Release(dst->id()).ok());
  EXPECT_TRUE(slow.client->Release(src->id()).ok());
}

// The UCX data planes between daemons on one host: host pools in shared memory with
// direct copies (the default), shared pools with UCX puts and gets (its System V / POSIX
// transports), and private pools (UCX's cma). Each carries verified pushes and pulls and
// stops at a cancel; the direct-copy counter shows which plane ran.
struct DataPlane {
  std::string name;
  std::vector<std::string> flags;
  std::string pools;  // What the UCX path line says backs the host pools.
  bool direct;
  bool ucx_calls = true;  // Peer calls as UCX active messages (else gRPC).
  int lanes = 1;          // UCX lanes the moves over the wire are split over.
};

class DataPlaneTest : public ::testing::TestWithParam<DataPlane> {
 protected:
  Node Start(const std::string& name, const std::string& join,
             std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB",
                                      "--metrics_listen=127.0.0.1:0"};
    for (const std::string& f : GetParam().flags) flags.push_back(f);
    flags.insert(flags.end(), extra.begin(), extra.end());
    return LaunchNode(name, join, flags);
  }

  static void AwaitPeersUp(const Node& n, size_t want) {
    absl::Status st = gpumove::AwaitPeersUp(n, want);
    ASSERT_TRUE(st.ok()) << st;
  }

  static double DirectBytes(const Node& n) { return Counter(n, "ucx_direct_bytes_total"); }
};

TEST_P(DataPlaneTest, PushesPullsAndCancelsVerified) {
  Node a = Start("plane-a", "");
  Node b = Start("plane-b", a.process->address());
  for (Node* n : {&a, &b}) {
    AwaitPeersUp(*n, 1);
    auto info = n->client->GetInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    std::string reason;
    for (const auto& p : info->paths()) {
      if (p.path() == v1::UCX) reason = p.reason();
    }
    EXPECT_NE(reason.find("host pools in " + GetParam().pools), std::string::npos)
        << reason << "\n" << n->process->Log();
    EXPECT_NE(reason.find(GetParam().ucx_calls ? "peer calls as UCX active messages"
                                               : "peer calls over gRPC"),
              std::string::npos)
        << reason;
    EXPECT_EQ(reason.find(absl::StrCat(GetParam().lanes, " lanes over the network")) !=
                  std::string::npos,
              GetParam().lanes > 1)
        << reason;
  }
  uint64_t seed = 500;
  uint64_t moved_bytes = 0;
  for (uint64_t size : {1ull, 4097ull, (1ull << 20) + 3, 24ull << 20}) {
    for (bool pull : {false, true}) {
      for (bool a_to_b : {true, false}) {
        Node& f = a_to_b ? a : b;
        Node& t = a_to_b ? b : a;
        SCOPED_TRACE(absl::StrCat(f.name, " -> ", t.name, " ", size, pull ? " pull" : " push"));
        const bool odd = seed % 2;
        MoveVerified(f, t, pull ? t : f, size, odd ? v1::HOST : v1::PINNED_HOST,
                     odd ? v1::PINNED_HOST : v1::HOST, seed);
        if (HasFatalFailure()) return;
        moved_bytes += size;
      }
    }
  }
  // A rate-limited node cancels a push and a pull between chunks; both ends let go, and
  // the same buffers then take a full verified move.
  Node slow = Start("plane-s", a.process->address(), {"--max_move_rate=64MiB"});
  AwaitPeersUp(slow, 2);
  for (bool pull : {false, true}) {
    SCOPED_TRACE(pull ? "cancelled pull" : "cancelled push");
    auto src = (pull ? a : slow).client->Allocate(96 << 20);
    auto dst = (pull ? slow : a).client->Allocate(96 << 20);
    ASSERT_TRUE(src.ok() && dst.ok());
    Node& from = pull ? a : slow;
    Node& to = pull ? slow : a;
    const std::string data = RandomBytes(96 << 20, seed++);
    ASSERT_TRUE(from.client->Write(Ref(src->id()), data).ok());
    // The slow node runs the move either way (it pulls, or it pushes).
    MoveOptions o;
    o.wait = false;
    auto t = slow.client->Move(On(from, src->id()), On(to, dst->id()), o);
    ASSERT_TRUE(t.ok()) << t.status();
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_TRUE(slow.client->Cancel(t->id()).ok());
    auto end = slow.client->Wait(t->id(), absl::Seconds(10));
    ASSERT_TRUE(end.ok());
    EXPECT_EQ(end->state(), v1::CANCELLED);
    EXPECT_LT(end->bytes_done(), 96u << 20);
    EXPECT_EQ(from.client->GetBuffer(src->id())->active_uses(), 0u);
    EXPECT_EQ(to.client->GetBuffer(dst->id())->active_uses(), 0u);
    MoveOptions full;
    full.checksum = true;
    auto again = a.client->Move(On(from, src->id()), On(to, dst->id()), full);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->state(), v1::SUCCEEDED) << again->error_message();
    EXPECT_TRUE(*to.client->Read(Ref(dst->id())) == data);
    // The transfer says what carried its bytes: a direct copy (where they are on), or
    // UCX's shared-memory transports (one host, no peer error handling), never TCP here;
    // its bytes are counted under it.
    EXPECT_TRUE(again->transport() == "direct copy" ||
                absl::StrContains(again->transport(), "/memory"))
        << again->transport();
    EXPECT_FALSE(absl::StrContains(again->transport(), "tcp")) << again->transport();
    if (!GetParam().direct) EXPECT_NE(again->transport(), "direct copy");
    EXPECT_GE(Counter(a, absl::StrCat("transport_bytes_total{path=\"UCX\",transport=\"",
                                      again->transport(), "\"}")),
              static_cast<double>(16 << 20))
        << again->transport();
  }
  // The counter lags by up to a second.
  absl::SleepFor(absl::Milliseconds(1200));
  const double direct = DirectBytes(a) + DirectBytes(b);
  if (GetParam().direct) {
    EXPECT_GE(direct, static_cast<double>(moved_bytes)) << "direct copies did not run";
  } else {
    EXPECT_EQ(direct, 0) << "direct copies ran with them off";
  }
  // Lanes besides the first carried their shares of the four 24 MiB moves at least (a
  // node counts the moves it ran).
  const double lane_bytes =
      Counter(a, "ucx_lane_bytes_total") + Counter(b, "ucx_lane_bytes_total");
  if (GetParam().lanes > 1) {
    const int lanes = GetParam().lanes;
    EXPECT_GE(lane_bytes, 4.0 * (24 << 20) * (lanes - 1) / lanes * 0.9)
        << "the lanes carried too little";
  } else {
    EXPECT_EQ(lane_bytes, 0) << "lanes ran with one lane";
  }
  // Every move above needed holds and acknowledgements: they went the chosen way.
  const double served = Counter(a, "ucx_peer_calls_served_total") +
                        Counter(b, "ucx_peer_calls_served_total");
  if (GetParam().ucx_calls) {
    EXPECT_GE(served, 32) << "peer calls did not go over UCX";
  } else {
    EXPECT_EQ(Counter(a, "ucx_peer_calls_served_total"), -1);
  }
  // The runners timed their calls, under the channel they took (histograms for alerts).
  const std::string channel = GetParam().ucx_calls ? "ucx" : "grpc";
  double timed = 0;
  for (const char* method : {"prepare_remote_batch", "complete_remote_batch"}) {
    for (Node* n : {&a, &b, &slow}) {
      timed += std::max(0.0, Counter(*n, absl::StrCat("peer_call_seconds_count{channel=\"",
                                                      channel, "\",method=\"", method, "\"}")));
    }
  }
  EXPECT_GE(timed, 32) << "peer calls were not timed under channel " << channel;
  // Every move ended: none still counted active.
  EXPECT_EQ(Counter(a, "transfers_active"), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Planes, DataPlaneTest,
    ::testing::Values(DataPlane{"SharedDirect", {}, "shared memory", true},
                      DataPlane{"SharedUcxRma", {"--noucx_direct"}, "shared memory", false},
                      DataPlane{"PrivateCma", {"--noucx_shared_pools"}, "private memory", false},
                      DataPlane{"PeerCallsOverGrpc", {"--noucx_peer_calls"}, "shared memory",
                                true, false},
                      // Puts and gets through UCX (no direct copies), split over 3 lanes.
                      DataPlane{"ThreeLanes", {"--noucx_direct", "--ucx_lanes=3"},
                                "shared memory", false, true, 3}),
    [](const ::testing::TestParamInfo<DataPlane>& info) { return info.param.name; });

TEST_F(ClusterTest, RemoteStagingCarriesPushesAndPullsVerified) {
  // node-f stages every range it is asked for (as it would its GPU memory without a
  // CUDA-aware UCX): bytes go through its pinned bounce slots, a StageChunk per chunk.
  Node f = StartNode("node-f", nodes_[0].process->address(),
                     {"--ucx_force_staging", "--pinned_pool_size=128MiB"});
  AwaitMembership({&f}, 3);
  uint64_t seed = 900;
  for (uint64_t size : {1ull, (8ull << 20) + 1, 40ull << 20}) {
    SCOPED_TRACE(absl::StrCat(size, " bytes"));
    auto a = nodes_[0].client->Allocate(size);
    auto fb = f.client->Allocate(size, size > (64 << 20) ? v1::HOST : v1::PINNED_HOST);
    auto back = nodes_[1].client->Allocate(size);
    ASSERT_TRUE(a.ok() && fb.ok() && back.ok());
    const std::string data = RandomBytes(size, seed++);
    ASSERT_TRUE(nodes_[0].client->Write(Ref(a->id()), data).ok());
    MoveOptions o;
    o.checksum = true;
    auto push = nodes_[0].client->Move(Ref(a->id()), On(f, fb->id()), o);  // Push into f.
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
    EXPECT_TRUE(*f.client->Read(Ref(fb->id())) == data);
    auto pull = nodes_[1].client->Move(On(f, fb->id()), Ref(back->id()), o);  // Pull out of f.
    ASSERT_TRUE(pull.ok()) << pull.status();
    ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
    EXPECT_TRUE(*nodes_[1].client->Read(Ref(back->id())) == data);
    EXPECT_TRUE(f.client->Release(fb->id()).ok());  // Bounce slots and hold let go.
  }
  auto info = f.client->GetInfo();
  for (const auto& p : info->pools()) EXPECT_EQ(p.free(), p.capacity());
  // The path really goes through bounce slots: a staging node without room for two of
  // them (a move of two chunks or more) refuses the range, and changes nothing.
  Node g = StartNode("node-g", nodes_[0].process->address(),
                     {"--ucx_force_staging", "--pinned_pool_size=8MiB"});
  AwaitMembership({&g}, 4);
  auto a = nodes_[0].client->Allocate(16 << 20);
  auto gb = g.client->Allocate(16 << 20);
  EXPECT_EQ(nodes_[0].client->Move(Ref(a->id()), On(g, gb->id())).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(g.client->GetBuffer(gb->id())->active_uses(), 0u);
  // A small move takes slots its size, and goes through.
  auto small = nodes_[0].client->Move(Ref(a->id(), 0, 1 << 20), On(g, gb->id()));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->state(), v1::SUCCEEDED) << small->error_message();
  // The copies into and out of f's bounce slots (pieces of 1 MiB) use streaming stores; a
  // direct copy of as many bytes between two nodes' host buffers does not. The direct
  // copy is split over 4 threads, the staged copies over their own count (1).
  Node m = StartNode("node-m", nodes_[0].process->address(),
                     {"--metrics_listen=127.0.0.1:0", "--direct_copy_threads=4",
                      "--staged_copy_threads=1"});
  AwaitMembership({&m}, 5);
  const uint64_t size = 3 << 20;
  auto ma = m.client->Allocate(size);
  auto mb = m.client->Allocate(size);
  auto fs = f.client->Allocate(size);
  auto other = nodes_[1].client->Allocate(size);
  ASSERT_TRUE(ma.ok() && mb.ok() && fs.ok() && other.ok());
  const std::string data = RandomBytes(size, seed++);
  ASSERT_TRUE(m.client->Write(Ref(ma->id()), data).ok());
  auto settle = [] { absl::SleepFor(absl::Milliseconds(1200)); };  // Counters lag ~1 s.
  auto streamed = [&] {
    settle();
    return Counter(m, "host_copy_streamed_bytes_total");
  };
  auto helped = [&m] { return Counter(m, "host_copy_helper_bytes_total"); };  // After settle.
  const double before = streamed();
  ASSERT_GE(before, 0) << "no streamed-bytes counter";
  const double helped_before = helped();
  ASSERT_GE(helped_before, 0) << "no helper-bytes counter";
  auto move = [&m](const v1::BufferRef& from, const v1::BufferRef& to) {
    auto t = m.client->Move(from, to);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
  };
  move(On(m, ma->id()), On(nodes_[1], other->id()));
  if (HasFatalFailure()) return;
  EXPECT_EQ(streamed(), before) << "a 3 MiB copy between host buffers streamed";
  // Four parts: three of them (all but the first, 768 KiB) copied by helpers.
  const double helped_direct = helped();
  EXPECT_EQ(helped_direct, helped_before + size - (768 << 10));
  move(On(m, ma->id()), On(f, fs->id()));  // Push into f's bounce slots.
  move(On(f, fs->id()), On(m, mb->id()));  // Pull out of them.
  if (HasFatalFailure()) return;
  EXPECT_TRUE(*m.client->Read(Ref(mb->id())) == data);
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(streamed(), before + 2.0 * size) << "the bounce slots' copies did not stream";
  }
#endif
  settle();
  EXPECT_EQ(helped(), helped_direct) << "the bounce slots' copies were split over threads";
}

// A Submit's holds are made at once but its moves run a few at a time: a staging node
// whose pinned pool has room for two moves' bounce slots holds the other ranges without
// slots (stage_later), and each move takes its slots when it runs, once the moves before
// it gave theirs back. Every push and pull of the Submit lands, verified.
TEST_F(ClusterTest, StagedMovesWaitForBounceSlotsWhileThePoolIsBusy) {
  Node h = StartNode("node-h", nodes_[0].process->address(),
                     {"--ucx_force_staging", "--pinned_pool_size=64MiB",
                      "--metrics_listen=127.0.0.1:0"});
  AwaitMembership({&h}, 3);
  EXPECT_EQ(Counter(h, "staging_holds_deferred_total"), 0);
  const uint64_t size = 24 << 20;  // Three 8 MiB slots a move: two moves fill the pool.
  const int n = 6;
  auto src = nodes_[0].client->Allocate(n * size);
  auto far = h.client->Allocate(n * size, v1::HOST);
  auto back = nodes_[1].client->Allocate(n * size);
  ASSERT_TRUE(src.ok() && far.ok() && back.ok());
  const std::string data = RandomBytes(n * size, 4242);
  ASSERT_TRUE(nodes_[0].client->Write(Ref(src->id()), data).ok());
  auto submit = [&](Node& runner, const v1::BufferRef& from, const v1::BufferRef& to) {
    v1::SubmitRequest r;
    r.set_wait(true);
    for (int i = 0; i < n; ++i) {
      auto* t = r.add_transfers();
      *t->mutable_source() = from;
      t->mutable_source()->set_offset(i * size);
      t->mutable_source()->set_length(size);
      *t->mutable_destination() = to;
      t->mutable_destination()->set_offset(i * size);
      t->mutable_destination()->set_length(size);
      t->set_checksum(true);
    }
    auto moved = runner.client->Submit(r);
    ASSERT_TRUE(moved.ok()) << moved.status();
    ASSERT_EQ(moved->transfers_size(), n);
    for (const v1::Transfer& t : moved->transfers()) {
      EXPECT_EQ(t.state(), v1::SUCCEEDED) << t.id() << ": " << t.error_message();
    }
  };
  submit(nodes_[0], Ref(src->id()), On(h, far->id()));  // Pushes into h.
  EXPECT_TRUE(*h.client->Read(Ref(far->id())) == data);
  submit(nodes_[1], On(h, far->id()), Ref(back->id()));  // Pulls out of h.
  EXPECT_TRUE(*nodes_[1].client->Read(Ref(back->id())) == data);
  // Each Submit's last holds found the pool full (the counter is refreshed every second).
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_GE(Counter(h, "staging_holds_deferred_total"), 2 * (n - 3));
  auto info = h.client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  for (const auto& p : info->pools()) {
    if (p.kind() == v1::PINNED_HOST) {
      EXPECT_EQ(p.free(), p.capacity());  // Slots given back.
    }
  }
}

// The protocol under it: with the pool busy a hold says stage_later; TakeStageSlots
// answers RESOURCE_EXHAUSTED (and changes nothing) until there is room, then the slots.
TEST_F(ClusterTest, AHoldWithoutRoomTakesItsBounceSlotsLater) {
  Node h = StartNode("node-h", nodes_[0].process->address(),
                     {"--ucx_force_staging", "--pinned_pool_size=16MiB"});
  AwaitMembership({&h}, 3);
  auto range = h.client->Allocate(16 << 20, v1::HOST);
  ASSERT_TRUE(range.ok()) << range.status();
  auto peer = peer::v1::PeerService::NewStub(
      grpc::CreateChannel(h.process->address(), grpc::InsecureChannelCredentials()));
  auto prepare = [&](const std::string& id) {
    peer::v1::PrepareRemoteRequest r;
    r.set_transfer_id(id);
    r.set_from_node("node-a");
    r.set_from_incarnation(IncarnationOf(nodes_[0]));
    r.set_owner("anonymous");
    *r.mutable_range() = Ref(range->id(), 0, 16 << 20);  // Two 8 MiB slots: the whole pool.
    r.set_write(true);
    peer::v1::PrepareRemoteResponse held;
    grpc::ClientContext ctx;
    EXPECT_TRUE(PrepareOne(*peer, &ctx, r, &held).ok());
    return held;
  };
  auto take = [&](const std::string& id, peer::v1::TakeStageSlotsResponse* slots) {
    peer::v1::TakeStageSlotsRequest r;
    r.set_transfer_id(id);
    grpc::ClientContext ctx;
    return CallPath(*peer, &ctx, "ucx", "take_stage_slots", "node-a", IncarnationOf(nodes_[0]), r,
                    slots)
        .error_code();
  };
  auto complete = [&](const std::string& id) {
    peer::v1::CompleteRemoteRequest r;
    r.set_transfer_id(id);
    r.set_from_node("node-a");
    r.set_code(static_cast<int>(grpc::StatusCode::CANCELLED));
    peer::v1::CompleteRemoteResponse done;
    grpc::ClientContext ctx;
    return CompleteOne(*peer, &ctx, r, &done).error_code();
  };
  const peer::v1::PrepareRemoteResponse first = prepare("t-first");
  EXPECT_EQ(first.stage().slots_size(), 2);
  EXPECT_FALSE(first.stage().later());
  const peer::v1::PrepareRemoteResponse second = prepare("t-second");
  EXPECT_EQ(second.stage().slots_size(), 0);
  EXPECT_TRUE(second.stage().later());
  EXPECT_EQ(second.stage().slot_size(), 8u << 20);
  peer::v1::TakeStageSlotsResponse slots;
  EXPECT_EQ(take("t-second", &slots), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(take("t-none", &slots), grpc::StatusCode::NOT_FOUND);
  // The first hold's slots, asked for again: the same ones.
  EXPECT_EQ(take("t-first", &slots), grpc::StatusCode::OK);
  EXPECT_TRUE(std::equal(slots.stage_slots().begin(), slots.stage_slots().end(),
                         first.stage().slots().begin(), first.stage().slots().end()));
  EXPECT_EQ(complete("t-first"), grpc::StatusCode::OK);  // Its slots go back to the pool.
  slots.Clear();
  EXPECT_EQ(take("t-second", &slots), grpc::StatusCode::OK);
  EXPECT_EQ(slots.stage_slots_size(), 2);
  EXPECT_EQ(slots.stage_slot_size(), 8u << 20);
  EXPECT_EQ(complete("t-second"), grpc::StatusCode::OK);
  auto info = h.client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  for (const auto& p : info->pools()) {
    if (p.kind() == v1::PINNED_HOST) {
      EXPECT_EQ(p.free(), p.capacity());
    }
  }
  EXPECT_EQ(h.client->GetBuffer(range->id())->active_uses(), 0u);
}

// --stage_chunk and --stage_slots shape the bounce slots a node holds for peers (the
// runner follows the holder's slot size): pushes and pulls through 1 MiB slots, three a
// move, land verified, a length that is no multiple of the slot included.
TEST_F(ClusterTest, StagingSlotsFollowTheHoldersFlags) {
  Node h = StartNode("node-h", nodes_[0].process->address(),
                     {"--ucx_force_staging", "--stage_chunk=1MiB", "--stage_slots=3"});
  AwaitMembership({&h}, 3);
  const uint64_t size = (5 << 20) + 7;
  auto src = nodes_[0].client->Allocate(size);
  auto far = h.client->Allocate(size, v1::HOST);
  auto back = nodes_[1].client->Allocate(size);
  ASSERT_TRUE(src.ok() && far.ok() && back.ok());
  peer::v1::PrepareRemoteRequest r;
  r.set_transfer_id("t-slots");
  r.set_from_node("node-a");
  r.set_from_incarnation(IncarnationOf(nodes_[0]));
  r.set_owner("anonymous");
  *r.mutable_range() = Ref(far->id(), 0, size);
  r.set_write(true);
  peer::v1::PrepareRemoteResponse held;
  auto peer = peer::v1::PeerService::NewStub(
      grpc::CreateChannel(h.process->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(PrepareOne(*peer, &ctx, r, &held).ok());
  }
  EXPECT_EQ(held.stage().slots_size(), 3);
  EXPECT_EQ(held.stage().slot_size(), 1u << 20);
  peer::v1::CompleteRemoteRequest done;
  done.set_transfer_id("t-slots");
  done.set_from_node("node-a");
  done.set_code(static_cast<int>(grpc::StatusCode::CANCELLED));
  peer::v1::CompleteRemoteResponse ended;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(CompleteOne(*peer, &ctx, done, &ended).ok());
  }
  const std::string data = RandomBytes(size, 909);
  ASSERT_TRUE(nodes_[0].client->Write(Ref(src->id()), data).ok());
  MoveOptions checked;
  checked.checksum = true;
  auto push = nodes_[0].client->Move(Ref(src->id()), On(h, far->id()), checked);
  ASSERT_TRUE(push.ok()) << push.status();
  EXPECT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
  auto pull = nodes_[1].client->Move(On(h, far->id()), Ref(back->id()), checked);
  ASSERT_TRUE(pull.ok()) << pull.status();
  EXPECT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
  EXPECT_TRUE(*nodes_[1].client->Read(Ref(back->id())) == data);
}

TEST_F(ClusterTest, KilledNodeFailsItsMovesAndRejoinsWhenRestarted) {
  // Two throttled nodes: node-s copies directly into and out of node-b's shared memory,
  // node-l puts and gets through UCX, its two moves on its two lanes in turn.
  Node slow = StartNode("node-s", nodes_[0].process->address(), {"--max_move_rate=32MiB"});
  Node lanes = StartNode("node-l", nodes_[0].process->address(),
                         {"--max_move_rate=32MiB", "--noucx_direct"});
  AwaitMembership({&slow, &lanes}, 4);
  std::vector<v1::Transfer> moves;
  std::string dead_dst;  // A buffer on node-b.
  for (Node* n : {&slow, &lanes}) {
    auto src = n->client->Allocate(128 << 20);
    auto dst = nodes_[1].client->Allocate(128 << 20);
    auto remote_src = nodes_[1].client->Allocate(128 << 20);
    auto pull_dst = n->client->Allocate(128 << 20);
    ASSERT_TRUE(src.ok() && dst.ok() && remote_src.ok() && pull_dst.ok());
    MoveOptions o;
    o.wait = false;
    // It pushes into node-b and pulls from node-b, both through node-c.
    auto push = nodes_[2].client->Move(On(*n, src->id()), On(nodes_[1], dst->id()), o);
    auto pull = n->client->Move(On(nodes_[1], remote_src->id()), Ref(pull_dst->id()), o);
    ASSERT_TRUE(push.ok() && pull.ok()) << push.status() << pull.status();
    EXPECT_TRUE(absl::EndsWith(pull->id(), "." + n->name)) << "a pull runs at the destination";
    moves.push_back(*push);
    moves.push_back(*pull);
    dead_dst = dst->id();
  }

  // node-b dies mid-move: all end FAILED with UNAVAILABLE, in bounded time.
  absl::SleepFor(absl::Milliseconds(300));
  nodes_[1].process->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  for (const auto& t : moves) {
    auto end = nodes_[0].client->Wait(t.id(), absl::Seconds(15));
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(end->state(), v1::FAILED) << t.id();
    EXPECT_EQ(end->error_code(), static_cast<int>(StatusCode::kUnavailable)) << end->error_message();
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  // The moving nodes let go of their buffers.
  for (Node* n : {&slow, &lanes}) {
    auto buffers = n->client->ListBuffers();
    ASSERT_TRUE(buffers.ok()) << buffers.status();
    for (const auto& b : *buffers) {
      EXPECT_EQ(b.active_uses(), 0u) << n->name << " " << b.id();
      EXPECT_TRUE(n->client->Release(b.id()).ok()) << n->name << " " << b.id();
    }
  }
  // The others keep serving each other.
  auto a = nodes_[0].client->Allocate(4096);
  auto c = nodes_[2].client->Allocate(4096);
  EXPECT_EQ(nodes_[0].client->Move(Ref(a->id()), On(nodes_[2], c->id()))->state(), v1::SUCCEEDED);
  // A move to the dead node is refused as UNAVAILABLE once it is seen down.
  absl::SleepFor(absl::Seconds(2));
  EXPECT_EQ(nodes_[0].client->Move(Ref(a->id()), On(nodes_[1], dead_dst)).status().code(),
            StatusCode::kUnavailable);

  // node-b comes back (new process, new port) and moves work again.
  nodes_[1] = StartNode("node-b", nodes_[0].process->address());
  AwaitMembership({&nodes_[0], &nodes_[1], &nodes_[2], &slow, &lanes}, 4);
  auto b = nodes_[1].client->Allocate(1 << 20);
  const std::string data = RandomBytes(1 << 20, 5);
  auto big_a = nodes_[0].client->Allocate(1 << 20);
  ASSERT_TRUE(nodes_[0].client->Write(Ref(big_a->id()), data).ok());
  MoveOptions check;
  check.checksum = true;
  auto again = nodes_[2].client->Move(On(nodes_[0], big_a->id()), On(nodes_[1], b->id()), check);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::SUCCEEDED) << again->error_message();
  EXPECT_TRUE(*nodes_[1].client->Read(Ref(b->id())) == data);
  // node-l reaches the new node-b over its lanes too (new endpoints, new keys).
  auto l = lanes.client->Allocate(8 << 20);
  auto b8 = nodes_[1].client->Allocate(8 << 20);
  const std::string data8 = RandomBytes(8 << 20, 6);
  ASSERT_TRUE(lanes.client->Write(Ref(l->id()), data8).ok());
  auto over_lanes = lanes.client->Move(Ref(l->id()), On(nodes_[1], b8->id()), check);
  ASSERT_TRUE(over_lanes.ok()) << over_lanes.status();
  EXPECT_EQ(over_lanes->state(), v1::SUCCEEDED) << over_lanes->error_message();
  EXPECT_TRUE(*nodes_[1].client->Read(Ref(b8->id())) == data8);
}

}  // namespace
}  // namespace gpumove
