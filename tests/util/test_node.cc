#include "tests/util/test_node.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/util/random_bytes.h"

namespace gpumove {
namespace {

// How long a node waits for a peer's answer. Sanitizer builds run several times slower, and
// on a loaded 2-CPU machine a busy peer's answer (a hold, an acknowledgement that hashes
// hundreds of MiB) can take longer than 1.5 s without anything being wrong.
constexpr const char* PeerTimeoutFlag() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return "--peer_timeout=4s";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return "--peer_timeout=4s";
#else
  return "--peer_timeout=1500ms";
#endif
#else
  return "--peer_timeout=1500ms";
#endif
}

}  // namespace

TestNode LaunchNode(const std::string& name, const std::string& join,
                    std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--node=" + name, "--heartbeat=100ms", PeerTimeoutFlag()});
  if (!join.empty()) flags.push_back("--peers=" + join);
  TestNode n;
  n.name = name;
  auto p = DaemonProcess::Start(flags);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return n;
  n.process = *std::move(p);
  auto c = Client::Connect(n.process->address());
  EXPECT_TRUE(c.ok()) << c.status();
  if (c.ok()) n.client = *std::move(c);
  return n;
}

void PushVerified(TestNode& a, TestNode& b, uint64_t seed) {
  auto src = a.client->Allocate(1 << 20, v1::HOST);
  auto dst = b.client->Allocate(1 << 20, v1::HOST);
  ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
  const std::string data = RandomBytes(1 << 20, seed);
  ASSERT_TRUE(a.client->Write(Ref(src->id()), data).ok());
  v1::BufferRef to = Ref(dst->id());
  to.set_node(b.name);
  MoveOptions o;
  o.checksum = true;
  auto moved = a.client->Move(Ref(src->id()), to, o);
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  EXPECT_TRUE(*b.client->Read(Ref(dst->id())) == data);
  EXPECT_TRUE(a.client->Release(src->id()).ok());
  EXPECT_TRUE(b.client->Release(dst->id()).ok());
}

absl::Status AwaitPeersUp(const TestNode& n, size_t want, bool exactly) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  size_t up = 0;
  while (absl::Now() < deadline) {
    auto peers = n.client->ListPeers();
    up = 0;
    if (peers.ok()) {
      for (const auto& p : *peers) up += p.up();
    }
    if (exactly ? up == want : up >= want) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(n.name, " sees ", up, " peers up, not ", exactly ? "" : "at least ", want));
}

}  // namespace gpumove
