// Peers authenticated with a cluster secret (--cluster_secret_file): a cluster whose nodes
// share it moves bytes over both peer channels (UCX active messages and gRPC), and
// anything without it — a process speaking the peer protocol, a daemon with another
// secret or none — is refused, over gRPC and over UCX alike; replays are refused too.
// Without a secret: a Hello cannot move a live node elsewhere, and a daemon whose clients
// need credentials takes no peers.
#include "daemon/cluster/peer_auth.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "daemon/peer/remote_ranges.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/server/auth.h"
#include "gtest/gtest.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"
#include "tests/util/daemon_process.h"
#include "tests/util/hello_paths.h"
#include "tests/util/peer_calls.h"
#include "tests/util/random_bytes.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

constexpr char kSecret[] = "c1u5ter-5ecret-0123456789abcdef";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::unique_ptr<peer::v1::PeerService::Stub> PeerStub(const TestNode& n) {
  return peer::v1::PeerService::NewStub(
      grpc::CreateChannel(n.process->address(), grpc::InsecureChannelCredentials()));
}

// A Hello to `to` as node "mallory", stamped by `auth` (null: not stamped).
// `from`: what it says of itself (default: only its name and incarnation).
grpc::Status Hello(peer::v1::PeerService::Stub& to, PeerAuth* auth,
                   peer::v1::HelloResponse* response, std::string* stamp = nullptr,
                   std::string* mac = nullptr, const peer::v1::NodeDescriptor* from = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  peer::v1::HelloRequest request;
  if (from != nullptr) *request.mutable_from() = *from;
  request.mutable_from()->set_node("mallory");
  request.mutable_from()->set_incarnation(7);
  if (stamp != nullptr && !stamp->empty()) {
    context.AddMetadata(kPeerStampKey, *stamp);
  } else if (auth != nullptr) {
    PeerAuth::Stamped s = auth->Stamp(kHelloMethod, request.SerializeAsString(), 0);
    context.AddMetadata(kPeerStampKey, s.stamp);
    if (stamp != nullptr) *stamp = s.stamp;
    if (mac != nullptr) *mac = s.mac;
  }
  grpc::Status st = to.Hello(&context, request, response);
  if (st.ok() && auth != nullptr && mac != nullptr &&
      !AnswerSigned(auth, *mac, *response, context)) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS, "answer not signed");
  }
  return st;
}

bool Knows(TestNode& n, const std::string& node) {
  auto peers = n.client->ListPeers();
  if (!peers.ok()) return false;
  for (const auto& p : *peers) {
    if (p.node() == node) return true;
  }
  return false;
}

class PeerAuthTest : public testing::Test {
 protected:
  void SetUp() override {
    secret_ = WriteFile("secret", std::string(kSecret) + "\n");
    other_ = WriteFile("other", "another-secret-of-the-same-length\n");
  }
  std::vector<std::string> Flags(const std::string& secret, std::vector<std::string> more = {}) {
    more.insert(more.begin(), {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB",
                               "--cluster_secret_file=" + secret});
    return more;
  }
  std::string secret_, other_;
};

TEST_F(PeerAuthTest, AClusterWithASecretMovesBytesOverBothPeerChannels) {
  TestNode a = LaunchNode("a", "", Flags(secret_));
  TestNode b = LaunchNode("b", a.process->address(), Flags(secret_));
  // c makes and serves its peer calls over gRPC.
  TestNode c = LaunchNode("c", a.process->address(), Flags(secret_, {"--ucx_peer_calls=false"}));
  ASSERT_TRUE(a.client && b.client && c.client);
  for (TestNode* n : {&a, &b, &c}) ASSERT_TRUE(AwaitPeersUp(*n, 2, true).ok()) << n->name;
  auto info = a.client->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->peer_authentication(), "cluster secret");
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    PushVerified(a, b, seed);  // UCX active messages.
    PushVerified(a, c, seed);  // gRPC.
    PushVerified(c, b, seed);
  }
  EXPECT_FALSE(absl::StrContains(a.process->Log(), "peer call refused")) << a.process->Log();
}

TEST_F(PeerAuthTest, CallsWithoutTheSecretAreRefusedAndNothingIsHeld) {
  TestNode a = LaunchNode("a", "", Flags(secret_));
  ASSERT_TRUE(a.client);
  auto stub = PeerStub(a);
  peer::v1::HelloResponse hello;
  // No stamp, another secret's stamp.
  grpc::Status st = Hello(*stub, nullptr, &hello);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_EQ(hello.node().paths_size(), 0);  // Nothing of its UCX details.
  PeerAuth other("another-secret-of-the-same-length", "mallory", 7);
  st = Hello(*stub, &other, &hello);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_TRUE(UcxOf(hello.node()).worker_address().empty());

  // A hold on a's buffer, unstamped and with another secret's stamp.
  auto buf = a.client->Allocate(1 << 20, v1::HOST);
  ASSERT_TRUE(buf.ok());
  peer::v1::PrepareRemoteRequest prepare;
  prepare.set_transfer_id("t");
  prepare.set_from_node("mallory");
  prepare.set_owner("anonymous");
  *prepare.mutable_range() = Ref(buf->id());
  peer::v1::PrepareRemoteBatchRequest batch;
  *batch.add_items() = prepare;
  for (PeerAuth* auth : {static_cast<PeerAuth*>(nullptr), &other}) {
    {
      grpc::ClientContext context;
      StampGrpcCall(auth, static_cast<uint32_t>(PeerMethod::kPrepareRemoteBatch), batch, 0,
                    &context);
      peer::v1::PrepareRemoteBatchResponse r;
      st = stub->PrepareRemoteBatch(&context, batch, &r);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_EQ(r.results_size(), 0);
    }
    {
      grpc::ClientContext context;
      peer::v1::StageChunkRequest chunk;
      chunk.set_transfer_id("t");
      const peer::v1::PathCallRequest call = PathCallOf("ucx", "stage_chunk", "mallory", 7, chunk);
      StampGrpcCall(auth, static_cast<uint32_t>(PeerMethod::kPathCall), call, 0, &context);
      peer::v1::PathCallResponse r;
      EXPECT_EQ(stub->PathCall(&context, call, &r).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
  }
  // Nothing pins the buffer: its owner releases it at once.
  EXPECT_TRUE(a.client->Release(buf->id()).ok());
  EXPECT_TRUE(absl::StrContains(a.process->Log(), "peer call refused")) << a.process->Log();
}

TEST_F(PeerAuthTest, AMemberIsAnsweredOnceAndAReplayIsRefused) {
  TestNode a = LaunchNode("a", "", Flags(secret_));
  ASSERT_TRUE(a.client);
  auto stub = PeerStub(a);
  PeerAuth member(kSecret, "mallory", 7);
  peer::v1::HelloResponse hello;
  std::string stamp, mac;
  grpc::Status st = Hello(*stub, &member, &hello, &stamp, &mac);
  ASSERT_TRUE(st.ok()) << st.error_message();  // The answer is signed, too.
  EXPECT_EQ(hello.node().node(), "a");
  peer::v1::HelloResponse again;
  st = Hello(*stub, nullptr, &again, &stamp);  // The same stamp, sent again.
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "replayed")) << st.error_message();
}

// The UCX channel checks as gRPC does, but answers nothing it does not trust: a process
// that got the worker address cannot call over UCX without a stamp (no answer comes), nor
// with a member's stamp before it said Hello at this worker's address.
TEST_F(PeerAuthTest, UcxPeerCallsWithoutTheSecretAreRefused) {
  TestNode a = LaunchNode("a", "", Flags(secret_, {"--metrics_listen=127.0.0.1:0"}));
  ASSERT_TRUE(a.client);
  auto stub = PeerStub(a);
  PeerAuth member(kSecret, "mallory", 7);
  UcxOptions lo;
  lo.net_devices = "lo";  // As the daemon, serving on loopback (a Hello's check wants it).
  auto ucx = UcxTransport::Create(lo);
  ASSERT_TRUE(ucx.ok()) << ucx.status();
  // Replies come back to this key; this process serves nothing.
  (*ucx)->ServeCalls(PeerId{"mallory", 7}.Key(),
                     [](const UcxPeer&, uint32_t, std::string, UcxReply reply) {
                       reply(absl::UnimplementedError("nothing here"), {});
                     });
  peer::v1::HelloResponse hello;
  std::string mac;
  ASSERT_TRUE(Hello(*stub, &member, &hello, nullptr, &mac).ok());
  const peer::v1::NodeDescriptor d = hello.node();  // A copy: `hello` is reused below.
  ASSERT_TRUE(UcxOf(d).peer_calls());
  UcxPeer to{PeerId{d.node(), d.incarnation()}.Key(), UcxOf(d).worker_address(), false};
  peer::v1::TakeStageSlotsRequest take;
  take.set_transfer_id("t");
  const std::string body =
      PathCallOf("ucx", "take_stage_slots", "mallory", 7, take).SerializeAsString();
  auto framed = [](const std::string& head, const std::string& body) {
    std::string out(4, '\0');
    for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(head.size() >> (8 * i));
    return out + head + body;
  };
  const uint32_t method = static_cast<uint32_t>(PeerMethod::kPathCall);
  auto unstamped = (*ucx)->Call(to, method, framed("", body), absl::Seconds(2));
  EXPECT_EQ(unstamped.status().code(), absl::StatusCode::kUnavailable) << unstamped.status();
  PeerAuth other("another-secret-of-the-same-length", "mallory", 7);
  auto foreign =
      (*ucx)->Call(to, method, framed(other.Stamp(method, body, d.incarnation()).stamp, body),
                   absl::Seconds(2));
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kUnavailable) << foreign.status();
  // Stamped by a member that said Hello without this worker's address: not answered.
  auto unmet =
      (*ucx)->Call(to, method, framed(member.Stamp(method, body, d.incarnation()).stamp, body),
                   absl::Seconds(3));
  EXPECT_EQ(unmet.status().code(), absl::StatusCode::kUnavailable) << unmet.status();
  // Hello'd at this worker's address and stamped: served (no such hold).
  peer::v1::NodeDescriptor me;
  me.set_node("mallory");
  me.set_incarnation(7);
  peer::v1::UcxDetails my_ucx;
  my_ucx.set_peer_calls(true);
  my_ucx.set_worker_address((*ucx)->worker_address());
  SetUcx(me, my_ucx);
  ASSERT_TRUE(Hello(*stub, &member, &hello, nullptr, nullptr, &me).ok());
  auto served =
      (*ucx)->Call(to, method, framed(member.Stamp(method, body, d.incarnation()).stamp, body),
                   absl::Seconds(10));
  EXPECT_EQ(served.status().code(), absl::StatusCode::kNotFound) << served.status();
  double refused = -1;
  for (int i = 0; i < 50 && refused < 3; ++i) {  // /metrics is refreshed every second.
    refused = MetricValue(a.client->GetInfo()->metrics_address(), "ucx_peer_calls_refused_total");
    if (refused < 3) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_GE(refused, 3);
}

TEST_F(PeerAuthTest, ADaemonWithAnotherSecretOrNoneCannotJoin) {
  TestNode a = LaunchNode("a", "", Flags(secret_));
  ASSERT_TRUE(a.client);
  TestNode b = LaunchNode("b", a.process->address(), Flags(other_));
  TestNode c = LaunchNode("c", a.process->address(),
                          {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB"});
  ASSERT_TRUE(b.client && c.client);
  absl::SleepFor(absl::Seconds(2));  // Twenty heartbeats.
  EXPECT_FALSE(Knows(a, "b"));
  EXPECT_FALSE(Knows(a, "c"));
  EXPECT_FALSE(Knows(b, "a"));  // Nor does a's answer convince them.
  EXPECT_FALSE(Knows(c, "a"));
}

// No secret anywhere: a Hello in a live node's name that moves it elsewhere is refused,
// and moves to it go on.
TEST_F(PeerAuthTest, WithoutASecretAHelloCannotMoveALiveNode) {
  TestNode a = LaunchNode("a", "", {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB"});
  TestNode b = LaunchNode("b", a.process->address(),
                          {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB"});
  ASSERT_TRUE(AwaitPeersUp(a, 1, true).ok());
  auto info = a.client->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->peer_authentication(), "open");
  peer::v1::HelloResponse who;
  ASSERT_TRUE(Hello(*PeerStub(b), nullptr, &who).ok());
  peer::v1::NodeDescriptor spoofed = who.node();
  ASSERT_EQ(spoofed.node(), "b");
  spoofed.set_address("127.0.0.1:1");
  grpc::ClientContext context;
  peer::v1::HelloRequest request;
  *request.mutable_from() = spoofed;
  peer::v1::HelloResponse ignored;
  grpc::Status st = PeerStub(a)->Hello(&context, request, &ignored);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  PushVerified(a, b, 5);
}

// No secret: a Hello as a live node at another incarnation (a "restart" it did not make)
// is refused while the node answers at its address as the old one, and moves to it go on
// (30 such Hellos once failed 411 of 461 moves).
TEST_F(PeerAuthTest, WithoutASecretAHelloCannotReplaceALiveIncarnation) {
  TestNode a = LaunchNode("a", "", {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB"});
  TestNode b = LaunchNode("b", a.process->address(),
                          {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB"});
  ASSERT_TRUE(AwaitPeersUp(a, 1, true).ok());
  peer::v1::HelloResponse who;
  ASSERT_TRUE(Hello(*PeerStub(b), nullptr, &who).ok());
  for (const std::string& address : {who.node().address(), std::string("127.0.0.1:1")}) {
    peer::v1::NodeDescriptor spoofed = who.node();
    spoofed.set_incarnation(spoofed.incarnation() + 1);
    spoofed.set_address(address);
    grpc::ClientContext context;
    peer::v1::HelloRequest request;
    *request.mutable_from() = spoofed;
    peer::v1::HelloResponse ignored;
    grpc::Status st = PeerStub(a)->Hello(&context, request, &ignored);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), "is live at")) << st.error_message();
  }
  for (uint64_t seed = 1; seed <= 3; ++seed) PushVerified(a, b, seed);
}

// No secret: a hold asked by a node that never said Hello is refused (it would never be
// released: no loss of that node is ever seen), and the buffer stays free.
TEST_F(PeerAuthTest, WithoutASecretHoldsAreForMetPeersOnly) {
  TestNode a = LaunchNode("a", "", {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB"});
  ASSERT_TRUE(a.client);
  auto buffer = a.client->Allocate(1 << 20);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  peer::v1::PrepareRemoteRequest hold;
  hold.set_from_node("ghost");
  hold.set_from_incarnation(9);
  hold.set_transfer_id("t-ghost");
  hold.set_owner("anonymous");
  hold.mutable_range()->set_buffer_id(buffer->id());
  hold.mutable_range()->set_length(1 << 20);
  grpc::ClientContext context;
  peer::v1::PrepareRemoteResponse held;
  grpc::Status st = PrepareOne(*PeerStub(a), &context, hold, &held);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "say Hello first")) << st.error_message();
  EXPECT_TRUE(a.client->Release(buffer->id()).ok()) << "the buffer was left held";
}

TEST_F(PeerAuthTest, ADaemonWhoseClientsNeedTokensTakesNoPeersWithoutASecret) {
  const std::string tokens = WriteFile("tokens.csv", "tok-0123456789abcdef,alice,t1,user\n");
  auto lone = DaemonProcess::Start({"--node=a", "--auth_tokens=" + tokens});
  ASSERT_TRUE(lone.ok()) << lone.status();
  auto stub = peer::v1::PeerService::NewStub(
      grpc::CreateChannel((*lone)->address(), grpc::InsecureChannelCredentials()));
  peer::v1::HelloResponse hello;
  grpc::Status st = Hello(*stub, nullptr, &hello);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "takes no peers")) << st.error_message();
  // Given peers, it does not start.
  auto joining = DaemonProcess::Start(
      {"--node=b", "--auth_tokens=" + tokens, "--peers=" + (*lone)->address()});
  EXPECT_FALSE(joining.ok());
}

// Only a holder of the cluster secret may assert who a forwarded call's caller is: an
// assertion stamped with another secret, or to a node without one, is UNAUTHENTICATED,
// however good the bearer token beside it.
TEST_F(PeerAuthTest, OnlyMembersAssertAForwardedCaller) {
  const std::string tokens = WriteFile("tokens2.csv", "tok-0123456789abcdef,alice,t1,user\n");
  TestNode a = LaunchNode("a", "", Flags(secret_, {"--auth_tokens=" + tokens}));
  auto lone = DaemonProcess::Start({"--node=z", "--auth_tokens=" + tokens});
  ASSERT_TRUE(a.process && lone.ok());
  auto info_a = a.client->GetInfo();  // No token: refused, but says who it is.
  EXPECT_EQ(info_a.status().code(), absl::StatusCode::kUnauthenticated);
  peer::v1::HelloResponse who;
  PeerAuth member(kSecret, "mallory", 7);
  ASSERT_TRUE(Hello(*PeerStub(a), &member, &who).ok());
  const uint64_t incarnation = who.node().incarnation();
  auto list = [&](const std::string& address, PeerAuth* auth, uint64_t to) {
    auto stub = v1::BufferService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    context.AddMetadata("authorization", "Bearer tok-0123456789abcdef");
    peer::v1::ForwardedCaller c;
    c.set_principal("root");
    c.set_tenant("ops");
    c.set_role("admin");
    c.set_stamp(auth == nullptr
                    ? std::string("garbage")
                    : auth->Stamp(kForwardedCallerMethod,
                                  absl::StrCat("root", absl::string_view("\0", 1), "ops",
                                               absl::string_view("\0", 1), "admin"),
                                  to)
                          .stamp);
    context.AddMetadata(kForwardedCallerKey, c.SerializeAsString());
    v1::ListBuffersRequest request;
    v1::ListBuffersResponse response;
    return stub->List(&context, request, &response).error_code();
  };
  PeerAuth other("another-secret-of-the-same-length", "mallory", 7);
  EXPECT_EQ(list(a.process->address(), nullptr, incarnation), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list(a.process->address(), &other, incarnation), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list((*lone)->address(), &member, 0), grpc::StatusCode::UNAUTHENTICATED);
  // A member's assertion is taken (that is what the secret is for).
  EXPECT_EQ(list(a.process->address(), &member, incarnation), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace gpumove

namespace gpumove {
namespace {

void Replace(const std::string& path, const std::string& text) {
  std::ofstream(path + ".new") << text;
  std::filesystem::rename(path + ".new", path);
}

// The cluster secret rotated while the nodes run, in the three steps docs/security.md
// gives, one node after the other: moves both ways and heartbeats go on at every step,
// nothing is refused, and at the end a daemon with the old secret cannot join.
TEST_F(PeerAuthTest, TheSecretRotatesWithoutARestart) {
  const std::string old_secret = std::string(kSecret) + "\n",
                    new_secret = "the-new-cluster-secret-0123456789\n";
  std::string secret[2], accept[2];
  for (int i = 0; i < 2; ++i) {
    secret[i] = WriteFile(absl::StrCat("rot-secret-", i), old_secret);
    accept[i] = WriteFile(absl::StrCat("rot-accept-", i), "");
  }
  TestNode a = LaunchNode("a", "", Flags(secret[0], {"--cluster_secret_accept_file=" + accept[0]}));
  ASSERT_TRUE(a.client);
  TestNode b = LaunchNode("b", a.process->address(),
                          Flags(secret[1], {"--cluster_secret_accept_file=" + accept[1]}));
  ASSERT_TRUE(b.client);
  for (TestNode* n : {&a, &b}) ASSERT_TRUE(AwaitPeersUp(*n, 1, true).ok()) << n->name;
  uint64_t seed = 1;
  auto step = [&](int node, const std::string& s, const std::string& acc) {
    Replace(secret[node], s);
    Replace(accept[node], acc);
    absl::SleepFor(absl::Milliseconds(2500));  // Re-read every second; heartbeats meanwhile.
    PushVerified(a, b, ++seed);
    PushVerified(b, a, ++seed);
  };
  for (int n = 0; n < 2; ++n) step(n, old_secret, new_secret);  // 1: the new one accepted.
  for (int n = 0; n < 2; ++n) step(n, new_secret, old_secret);  // 2: signing with it.
  for (int n = 0; n < 2; ++n) step(n, new_secret, "");          // 3: the old one dropped.
  for (TestNode* n : {&a, &b}) {
    EXPECT_FALSE(absl::StrContains(n->process->Log(), "peer call refused")) << n->process->Log();
    EXPECT_TRUE(Knows(*n, n == &a ? "b" : "a"));
  }
  TestNode c = LaunchNode("c", a.process->address(), Flags(secret_));  // The old secret.
  ASSERT_TRUE(c.client);
  absl::SleepFor(absl::Seconds(2));
  EXPECT_FALSE(Knows(a, "c"));
  EXPECT_FALSE(DaemonProcess::Start({"--node=d", "--cluster_secret_accept_file=" + accept[0]})
                   .ok());  // An accepted secret goes with a secret.
}

}  // namespace
}  // namespace gpumove
