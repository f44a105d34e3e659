// What another node (or anything that speaks the peer protocol) sends is untrusted input:
// malformed UCX addresses in a Hello, peer calls racing each other on one hold, huge ids.
// Each case crashed or misled a daemon once; each must now get a clean error and leave
// the daemon serving.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"
#include "tests/util/daemon_process.h"
#include "tests/util/hello_paths.h"
#include "tests/util/peer_calls.h"
#include "tests/util/random_bytes.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

// A cluster node with a client of its peer service too, to speak as a peer would.
struct Node : TestNode {
  std::unique_ptr<peer::v1::PeerService::Stub> peer;
};

Node Launch(const std::string& name, const std::string& join, std::vector<std::string> flags = {}) {
  flags.insert(flags.begin(), {"--host_pool_size=256MiB", "--pinned_pool_size=64MiB"});
  Node n;
  static_cast<TestNode&>(n) = LaunchNode(name, join, flags);
  if (n.process != nullptr) {
    n.peer = peer::v1::PeerService::NewStub(
        grpc::CreateChannel(n.process->address(), grpc::InsecureChannelCredentials()));
  }
  return n;
}

grpc::Status Hello(Node& to, const peer::v1::NodeDescriptor& from,
                   peer::v1::HelloResponse* out = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  peer::v1::HelloRequest request;
  *request.mutable_from() = from;
  peer::v1::HelloResponse response;
  return to.peer->Hello(&context, request, out != nullptr ? out : &response);
}

void AwaitPeers(Node& n, size_t want) {
  absl::Status st = AwaitPeersUp(n, want, /*exactly=*/true);
  ASSERT_TRUE(st.ok()) << st;
}

// Under b's own name, Hellos carrying broken UCX addresses and keys, a UCX blob that is
// not a UcxDetails, and blob lists out of bounds: a takes none of them
// (INVALID_ARGUMENT), keeps b's real descriptor, and its next moves to b succeed. Before
// the check, the first of these made a's next move to b abort the process in
// ucp_ep_create.
TEST(HostilePeer, MalformedUcxAddressesInAHelloAreRefused) {
  Node a = Launch("node-a", "");
  Node b = Launch("node-b", a.process->address());
  AwaitPeers(a, 1);
  peer::v1::HelloResponse answer;
  ASSERT_TRUE(Hello(b, peer::v1::NodeDescriptor(), &answer).ok());  // b says who it is.
  const peer::v1::NodeDescriptor real = answer.node();
  ASSERT_EQ(real.node(), "node-b");
  const peer::v1::UcxDetails ucx = UcxOf(real);
  ASSERT_FALSE(ucx.worker_address().empty());
  ASSERT_GT(ucx.pools_size(), 0);

  std::vector<std::pair<std::string, peer::v1::NodeDescriptor>> spoofed;
  auto with_ucx = [&](const std::string& what, const peer::v1::UcxDetails& u) {
    peer::v1::NodeDescriptor d = real;
    SetUcx(d, u);
    spoofed.emplace_back(what, d);
  };
  auto with_address = [&](const std::string& what, std::string address) {
    peer::v1::UcxDetails u = ucx;
    u.set_worker_address(std::move(address));
    with_ucx(what, u);
  };
  std::string version = ucx.worker_address();
  version[0] = static_cast<char>((version[0] & 0xf0) | 5);  // UCX asserts on this one.
  with_address("unknown address version", version);
  with_address("address cut in half",
               ucx.worker_address().substr(0, ucx.worker_address().size() / 2));
  with_address("random bytes", RandomBytes(200, 3));
  with_address("bytes appended", ucx.worker_address() + "xyz");
  {
    peer::v1::UcxDetails u = ucx;
    u.mutable_pools(0)->set_rkey(std::string(3, '\xff'));
    with_ucx("pool key cut short", u);
  }
  if (ucx.lanes_size() > 0) {
    peer::v1::UcxDetails u = ucx;
    u.mutable_lanes(0)->set_worker_address(version);
    with_ucx("lane address of an unknown version", u);
  }
  {
    peer::v1::UcxDetails u = ucx;
    for (int i = 0; i < 65; ++i) *u.add_pools() = ucx.pools(0);
    with_ucx("65 more pools", u);
  }
  {
    peer::v1::NodeDescriptor d = real;
    SetPathBlob(d, "ucx", std::string("\x0a\xff\xff\xff\x7f", 5));  // Cut short.
    spoofed.emplace_back("a UCX blob that is no UcxDetails", d);
  }
  {
    peer::v1::NodeDescriptor d = real;
    SetPathBlob(d, "ucx", std::string("\x0f\x00", 2));  // Wire type 7: none is.
    spoofed.emplace_back("a UCX blob with an invalid wire type", d);
  }
  {
    peer::v1::NodeDescriptor d = real;
    SetPathBlob(d, "someone-else", std::string((1 << 20) + 1, 'x'));
    spoofed.emplace_back("a blob over 1 MiB", d);
  }
  {
    peer::v1::NodeDescriptor d = real;
    for (int i = 0; i < 8; ++i) SetPathBlob(d, absl::StrCat("path-", i), "x");
    spoofed.emplace_back("too many blobs", d);
  }
  {
    peer::v1::NodeDescriptor d = real;
    SetPathBlob(d, std::string(65, 'p'), "x");
    spoofed.emplace_back("a path name over 64 bytes", d);
  }
  {
    peer::v1::NodeDescriptor d = real;
    d.add_paths()->set_path("ucx");
    spoofed.emplace_back("the UCX blob twice", d);
  }
  {
    peer::v1::NodeDescriptor d = real;
    d.set_node(std::string(100000, 'n'));
    spoofed.emplace_back("100000-byte node name", d);
  }
  for (const auto& [what, d] : spoofed) {
    grpc::Status st = Hello(a, d);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
    EXPECT_LT(st.error_message().size(), 2048u) << what;
  }
  // A path a does not run: its blob is ignored, the rest taken.
  peer::v1::NodeDescriptor unknown = real;
  SetPathBlob(unknown, "a-path-from-the-future", RandomBytes(100, 7));
  EXPECT_TRUE(Hello(a, unknown).ok());
  for (uint64_t seed = 1; seed <= 3; ++seed) PushVerified(a, b, seed);
  auto info = a.client->GetInfo();
  EXPECT_TRUE(info.ok()) << info.status();
}

// A peer request about the hold of mallory's transfer "t".
template <class Request>
Request OnTheHold() {
  Request r;
  r.set_transfer_id("t");
  r.set_from_node("mallory");
  return r;
}

// A path call's request about that hold (mallory is the path call's caller).
template <class Request>
Request PathCallOnTheHold() {
  Request r;
  r.set_transfer_id("t");
  return r;
}

// A hold, its staging calls (StageChunk, TakeStageSlots: path calls of path UCX) and its
// acknowledgement for one hold, from four threads at once for a second and a half:
// nothing may crash (a hold once handed out pointers into itself that a concurrent
// Complete freed), and afterwards the buffer is free again. Staging is forced, so holds
// take bounce rings and StageChunk copies.
TEST(HostilePeer, PeerCallsRacingOnOneHoldDoNotCrashTheDaemon) {
  Node a = Launch("node-a", "", {"--ucx_force_staging"});
  auto buffer = a.client->Allocate(4 << 20, v1::HOST);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  // Holds are for peers a has met: mallory says Hello first (at an address that refuses,
  // so a sees it down once --peer_timeout passes, and drops what it holds for it).
  peer::v1::NodeDescriptor mallory;
  mallory.set_node("mallory");
  mallory.set_incarnation(1);
  mallory.set_address("127.0.0.1:9");
  ASSERT_TRUE(Hello(a, mallory).ok());
  std::atomic<int> prepared{0}, completed{0}, staged{0};
  const absl::Time end = absl::Now() + absl::Milliseconds(1500);
  auto call = [&](int which) {
    auto channel = grpc::CreateChannel(a.process->address(), grpc::InsecureChannelCredentials());
    auto stub = peer::v1::PeerService::NewStub(channel);
    for (int i = 0; i < 100000 && absl::Now() < end; ++i) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      if (which % 2 == 0) {
        auto r = OnTheHold<peer::v1::PrepareRemoteRequest>();
        r.set_from_incarnation(1);
        r.set_owner("anonymous");
        r.mutable_range()->set_buffer_id(buffer->id());
        r.set_write(true);
        peer::v1::PrepareRemoteResponse response;
        prepared += PrepareOne(*stub, &context, r, &response).ok();
      } else if (i % 3 == 0) {
        auto r = PathCallOnTheHold<peer::v1::StageChunkRequest>();
        r.set_slot(0);
        r.set_length(64 << 10);
        r.set_to_range(true);
        peer::v1::StageChunkResponse response;
        staged +=
            CallPath(*stub, &context, "ucx", "stage_chunk", "mallory", 1, r, &response).ok();
      } else if (i % 3 == 1) {
        auto r = PathCallOnTheHold<peer::v1::TakeStageSlotsRequest>();
        peer::v1::TakeStageSlotsResponse response;
        CallPath(*stub, &context, "ucx", "take_stage_slots", "mallory", 1, r, &response);
      } else {
        auto r = OnTheHold<peer::v1::CompleteRemoteRequest>();
        r.set_checksum(i % 2 == 0);
        peer::v1::CompleteRemoteResponse response;
        completed += CompleteOne(*stub, &context, r, &response).ok();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(call, t);
  for (auto& t : threads) t.join();
  EXPECT_GT(prepared.load(), 0);
  EXPECT_GT(completed.load(), 0);
  // One last Complete ends a hold still there; then the buffer is free to release.
  {
    grpc::ClientContext context;
    auto r = OnTheHold<peer::v1::CompleteRemoteRequest>();
    peer::v1::CompleteRemoteResponse response;
    CompleteOne(*a.peer, &context, r, &response);
  }
  EXPECT_TRUE(a.client->Release(buffer->id()).ok());
  EXPECT_TRUE(a.client->GetInfo().ok());
  EXPECT_EQ(a.process->WaitExit(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded)
      << "the daemon exited:\n" << a.process->Log();
}

// A 1 MiB id is refused (past the 1 KiB any id may have) as a short message, not echoed
// whole.
TEST(HostilePeer, HugeIdsAreNotEchoedWhole) {
  Node a = Launch("node-a", "");
  const std::string id(1 << 20, 'x');
  auto buffer = a.client->GetBuffer(id);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(buffer.status().message().size(), 2048u);
  auto transfer = a.client->GetTransfer(id);
  EXPECT_EQ(transfer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(transfer.status().message().size(), 2048u);
  v1::BufferRef ref = Ref("b-1");
  ref.set_node(id);
  auto read = a.client->Read(ref);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(read.status().message().size(), 2048u);
  // Under the limit, an unknown id is NOT_FOUND, said shortly.
  auto missing = a.client->GetBuffer(std::string(1000, 'y'));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(missing.status().message().size(), 256u);
}

}  // namespace
}  // namespace gpumove

namespace gpumove {
namespace {

// Calls forwarded to a node that stops answering (SIGSTOP) end UNAVAILABLE once it is seen
// down (--peer_timeout 1.5 s here), even when the caller set no deadline; they used to
// wait as long as the node was stopped. The node is resumed after 12 s at the latest.
TEST(HostilePeer, ForwardedCallsToAStoppedNodeEndWithoutAClientDeadline) {
  Node a = Launch("node-a", "");
  Node b = Launch("node-b", a.process->address());
  AwaitPeers(a, 1);
  auto buffer = b.client->Allocate(4096, v1::HOST);
  ASSERT_TRUE(buffer.ok());
  auto stub = v1::TransferService::NewStub(
      grpc::CreateChannel(a.process->address(), grpc::InsecureChannelCredentials()));
  auto buffers = v1::BufferService::NewStub(
      grpc::CreateChannel(a.process->address(), grpc::InsecureChannelCredentials()));
  b.process->Signal(SIGSTOP);
  absl::Notification done;
  std::thread resume([&] {
    done.WaitForNotificationWithTimeout(absl::Seconds(12));
    b.process->Signal(SIGCONT);
  });
  struct Case {
    const char* what;
    std::function<grpc::Status(grpc::ClientContext*)> call;
  };
  const std::vector<Case> cases = {
      {"Get of a transfer", [&](grpc::ClientContext* c) {
         v1::GetTransferRequest r;
         r.set_id("t-1.node-b");
         v1::Transfer t;
         return stub->Get(c, r, &t);
       }},
      {"Wait without a timeout", [&](grpc::ClientContext* c) {
         v1::WaitRequest r;
         r.set_id("t-1.node-b");
         v1::Transfer t;
         return stub->Wait(c, r, &t);
       }},
      {"Get of a buffer", [&](grpc::ClientContext* c) {
         v1::GetBufferRequest r;
         r.set_buffer_id(buffer->id());
         r.set_node("node-b");
         v1::Buffer out;
         return buffers->Get(c, r, &out);
       }},
  };
  for (const Case& k : cases) {
    grpc::ClientContext context;  // No deadline.
    const absl::Time t0 = absl::Now();
    grpc::Status st = k.call(&context);
    const absl::Duration took = absl::Now() - t0;
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << k.what << ": " << st.error_message();
    EXPECT_LT(took, absl::Seconds(6)) << k.what;
  }
  done.Notify();
  resume.join();
  AwaitPeers(a, 1);
  auto got = a.client->GetBuffer(buffer->id(), "node-b");
  EXPECT_TRUE(got.ok()) << got.status();
}

// A fake peer whose address is the daemon itself: a call for its buffers is forwarded
// once, back to the daemon, and refused there at once (it once looped until the forward
// timeout, thousands of threads deep).
TEST(HostilePeer, AForwardingLoopEndsAtTheSecondHop) {
  Node a = Launch("node-a", "");
  ASSERT_NE(a.process, nullptr);
  peer::v1::NodeDescriptor ghost;
  ghost.set_node("ghost");
  ghost.set_address(a.process->address());
  ghost.set_host_id("elsewhere");
  ghost.set_incarnation(7);
  ASSERT_TRUE(Hello(a, ghost).ok());
  bool known = false;
  for (absl::Time end = absl::Now() + absl::Seconds(5); !known && absl::Now() < end;) {
    auto peers = a.client->ListPeers();
    for (const auto& p : peers.ok() ? *peers : std::vector<v1::PeerInfo>{})
      known |= p.node() == "ghost";
    if (!known) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(known);
  for (int i = 0; i < 20; ++i) {
    const absl::Time t0 = absl::Now();
    auto got = a.client->GetBuffer("b-anything", "ghost");
    EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), "forwarded again")) << got.status();
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  }
}

// Connections that never finish the HTTP/2 handshake (silent, or a few bytes and then
// silence) are closed after --handshake_timeout, and the daemon goes on serving.
TEST(HostilePeer, SilentConnectionsAreClosedAfterTheHandshakeTimeout) {
  Node a = Launch("node-a", "", {"--handshake_timeout=1s"});
  ASSERT_NE(a.process, nullptr);
  const std::string& address = a.process->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    if (i % 2 == 1) ASSERT_EQ(write(fd, "PRI * HTTP", 10), 10);  // Half a preface.
    fds.push_back(fd);
  }
  const absl::Time t0 = absl::Now();
  for (int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 8000), 1) << "a silent connection was still open after 8 s";
    char buf[256];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
  }
  EXPECT_LT(absl::Now() - t0, absl::Seconds(6));
  EXPECT_TRUE(a.client->GetInfo().ok());
}

}  // namespace
}  // namespace gpumove

namespace gpumove {
namespace {

// `n` TCP connections to 127.0.0.1:`port` (fewer when one fails).
std::vector<int> ConnectMany(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      break;
    }
    fds.push_back(fd);
  }
  return fds;
}

// Started with a soft limit of 96 open files (as a shell's ulimit -S -n would), the daemon
// raises it to the hard limit: 300 connections at once are accepted, and once they
// close, new clients are served. (The gRPC this is built with stops accepting for good
// after one EMFILE, so reaching the soft limit once would leave the daemon deaf.)
TEST(HostilePeer, ManyConnectionsPastTheSoftOpenFileLimitLeaveTheDaemonServing) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 1024) {
    GTEST_SKIP() << "SKIPPED: the hard limit on open files here is " << saved.rlim_max;
  }
  rlimit low = saved;
  low.rlim_cur = 96;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  auto d = DaemonProcess::Start({"--node=a", "--host_pool_size=64MiB", "--pinned_pool_size=16MiB"});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);  // This process's own again.
  ASSERT_TRUE(d.ok()) << d.status();
  const int port = std::stoi((*d)->address().substr((*d)->address().rfind(':') + 1));
  const std::vector<int> fds = ConnectMany(port, 300);
  ASSERT_EQ(fds.size(), 300u);
  absl::SleepFor(absl::Seconds(1));  // The daemon accepts them all meanwhile.
  for (int fd : fds) close(fd);
  absl::SleepFor(absl::Milliseconds(500));
  ConnectOptions o;
  o.timeout = absl::Seconds(5);
  auto c = Client::Connect((*d)->address(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto info = (*c)->GetInfo();
  EXPECT_TRUE(info.ok()) << info.status() << (*d)->Log();
  EXPECT_FALSE(absl::StrContains((*d)->Log(), "Too many open files")) << (*d)->Log();
}

// --max_message_size bounds what one call may carry: past it RESOURCE_EXHAUSTED and the
// daemon goes on; a limit below what read streams need is refused at start.
TEST(HostilePeer, MessagesPastTheSizeLimitAreRefused) {
  EXPECT_FALSE(DaemonProcess::Start({"--node=a", "--max_message_size=1MiB"}).ok());
  auto d = DaemonProcess::Start({"--node=a", "--max_message_size=8MiB", "--host_pool_size=64MiB",
                                 "--pinned_pool_size=16MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto stub = v1::BufferService::NewStub(
      grpc::CreateCustomChannel((*d)->address(), grpc::InsecureChannelCredentials(), [] {
        grpc::ChannelArguments args;
        args.SetMaxSendMessageSize(-1);
        return args;
      }()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::AllocateRequest request;
  request.set_size(4096);
  request.set_label(std::string(9 << 20, 'x'));
  v1::Buffer response;
  EXPECT_EQ(stub->Allocate(&context, request, &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  ConnectOptions o;
  auto c = Client::Connect((*d)->address(), o);
  ASSERT_TRUE(c.ok());
  auto buf = (*c)->Allocate(6 << 20);
  ASSERT_TRUE(buf.ok()) << buf.status();
  const std::string data = RandomBytes(6 << 20, 9);
  ASSERT_TRUE((*c)->Write(Ref(buf->id()), data).ok());
  auto back = (*c)->Read(Ref(buf->id()));  // Read streams stay within the limit.
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == data);
  EXPECT_TRUE((*c)->ListBuffers().ok());
}

}  // namespace
}  // namespace gpumove

namespace gpumove {
namespace {

// The hard limit on open files reached: connections that arrive then are closed at once
// (not left hanging), and once the load is gone the daemon serves new clients again.
// (gRPC's own listener, which the daemon used before it accepted its connections
// itself, closed for good at the first EMFILE.)
TEST(HostilePeer, TheHardOpenFileLimitReachedLeavesTheDaemonServing) {
  auto d = DaemonProcess::Start({"--node=a", "--host_pool_size=64MiB", "--pinned_pool_size=16MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  int open_now = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", (*d)->pid(), "/fd"))) {
    ++open_now;
  }
  rlimit low{};
  low.rlim_cur = low.rlim_max = static_cast<rlim_t>(open_now + 20);
  ASSERT_EQ(prlimit((*d)->pid(), RLIMIT_NOFILE, &low, nullptr), 0) << std::strerror(errno);
  const int port = std::stoi((*d)->address().substr((*d)->address().rfind(':') + 1));
  const std::vector<int> fds = ConnectMany(port, 100);
  ASSERT_EQ(fds.size(), 100u);
  // Those past the limit end: a read sees end of file (or a reset) within a few seconds.
  int ended = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    const int wait =
        static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    char c;
    if (poll(&p, 1, wait) == 1 && recv(fd, &c, 1, MSG_DONTWAIT) <= 0) ++ended;
  }
  EXPECT_GE(ended, 50) << (*d)->Log();
  for (int fd : fds) close(fd);
  EXPECT_TRUE(absl::StrContains((*d)->Log(), "open-file limit reached")) << (*d)->Log();
  absl::SleepFor(absl::Milliseconds(500));
  ConnectOptions o;
  o.timeout = absl::Seconds(5);
  auto c = Client::Connect((*d)->address(), o);
  ASSERT_TRUE(c.ok()) << c.status() << (*d)->Log();
  auto info = (*c)->GetInfo();
  EXPECT_TRUE(info.ok()) << info.status() << (*d)->Log();
}

}  // namespace
}  // namespace gpumove
