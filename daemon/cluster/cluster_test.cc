#include "daemon/cluster/cluster.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(ResolvePeer, LiteralAddressesAndNames) {
  EXPECT_EQ(*ResolvePeer("127.0.0.1:7470"), std::vector<std::string>{"127.0.0.1:7470"});
  EXPECT_EQ(*ResolvePeer("unix:/tmp/x.sock"), std::vector<std::string>{"unix:/tmp/x.sock"});
  auto local = ResolvePeer("localhost:9");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(local->empty());
  for (const auto& a : *local) EXPECT_TRUE(a == "127.0.0.1:9" || a == "[::1]:9") << a;
}

TEST(ResolvePeer, RejectsMissingPortsAndUnknownNames) {
  EXPECT_EQ(ResolvePeer("127.0.0.1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolvePeer("host:").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolvePeer("no-such-host.invalid:7470").status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(Cluster, LearnsFromHelloAndReportsRestarts) {
  peer::v1::NodeDescriptor self;
  self.set_node("a");
  self.set_address("127.0.0.1:1");
  Cluster c({}, self);
  EXPECT_EQ(c.Find("b").status().code(), absl::StatusCode::kNotFound);
  peer::v1::NodeDescriptor b;
  b.set_node("b");
  b.set_address("127.0.0.1:2");
  b.set_incarnation(7);
  EXPECT_TRUE(c.OnHello(b).ok());
  auto found = c.Find("b");
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(found->up);
  EXPECT_EQ(found->address, "127.0.0.1:2");
  EXPECT_TRUE(c.OnHello(self).ok());  // Our own echo is not a peer.
  peer::v1::NodeDescriptor d;
  d.set_node("d");
  d.set_address("127.0.0.1:4");
  d.set_incarnation(1);
  EXPECT_EQ(*c.OnHello(d), std::vector<std::string>{"127.0.0.1:2"});  // d hears of b.
  EXPECT_EQ(c.List().size(), 2u);
}

TEST(Cluster, MarksSilentPeersDownAndTellsListeners) {
  peer::v1::NodeDescriptor self;
  self.set_node("a");
  self.set_address("127.0.0.1:1");
  ClusterOptions options;
  options.heartbeat = absl::Milliseconds(20);
  options.peer_timeout = absl::Milliseconds(200);
  // Before the cluster: its heartbeat thread, which calls the listener, ends first.
  absl::Mutex mu;
  std::vector<std::pair<std::string, uint64_t>> lost;
  Cluster c(options, self);
  c.Start([&](const std::string& node, uint64_t inc) {
    absl::MutexLock lock(&mu);
    lost.emplace_back(node, inc);
  });
  peer::v1::NodeDescriptor b;
  b.set_node("b");
  b.set_address("127.0.0.1:9");  // Nobody answers there.
  b.set_incarnation(7);
  EXPECT_TRUE(c.OnHello(b).ok());
  b.set_incarnation(8);  // b restarted.
  EXPECT_TRUE(c.OnHello(b).ok());
  // Both losses (the restart's, then b's silence past the timeout) within a bound, each
  // incarnation once (the second Hello probes b's old address first, which may take long
  // enough, under a sanitizer, for incarnation 7 to be marked down by silence before the
  // restart is seen: it is not reported again).
  auto two = [&lost]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lost.size() >= 2; };
  absl::MutexLock lock(&mu);
  mu.AwaitWithTimeout(absl::Condition(&two), absl::Seconds(10));
  EXPECT_EQ(c.Find("b").status().code(), absl::StatusCode::kUnavailable);
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0], std::make_pair(std::string("b"), uint64_t{7}));
  EXPECT_EQ(lost[1], std::make_pair(std::string("b"), uint64_t{8}));
}

TEST(Cluster, AnIncarnationAlreadyDownIsNotReportedLostAgainOnItsRestart) {
  peer::v1::NodeDescriptor self;
  self.set_node("a");
  ClusterOptions options;
  options.heartbeat = absl::Milliseconds(10);
  options.peer_timeout = absl::Milliseconds(50);
  absl::Mutex mu;
  std::vector<std::pair<std::string, uint64_t>> lost;
  Cluster c(options, self);
  c.Start([&](const std::string& node, uint64_t inc) {
    absl::MutexLock lock(&mu);
    lost.emplace_back(node, inc);
  });
  peer::v1::NodeDescriptor b;
  b.set_node("b");
  b.set_address("127.0.0.1:9");
  b.set_incarnation(7);
  EXPECT_TRUE(c.OnHello(b).ok());
  {
    auto one = [&lost]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !lost.empty(); };
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&one), absl::Seconds(10)));  // Silent.
  }
  EXPECT_EQ(c.Find("b").status().code(), absl::StatusCode::kUnavailable);
  b.set_incarnation(8);
  EXPECT_TRUE(c.OnHello(b).ok());  // Back as a new incarnation: up, 7 not lost twice.
  absl::SleepFor(absl::Milliseconds(20));
  absl::MutexLock lock(&mu);
  ASSERT_GE(lost.size(), 1u);
  EXPECT_EQ(lost[0], std::make_pair(std::string("b"), uint64_t{7}));
  for (size_t i = 1; i < lost.size(); ++i) EXPECT_EQ(lost[i].second, 8u) << i;
}

// A path's part of Hello as a test has it: a blob is taken unless it is "bad"; its view
// keeps the blob; reads are counted.
struct TestView : PathView {
  std::string blob;
};
class TestHello : public PathHello {
 public:
  absl::string_view path() const override { return "test"; }
  std::string Pack() const override { return "mine"; }
  absl::StatusOr<std::shared_ptr<const PathView>> Read(absl::string_view blob) const override {
    ++reads;
    if (blob == "bad") return absl::InvalidArgumentError("a bad blob");
    auto view = std::make_shared<TestView>();
    view->blob = std::string(blob);
    return std::shared_ptr<const PathView>(std::move(view));
  }
  mutable std::atomic<int> reads{0};
};

void AddPath(peer::v1::NodeDescriptor& d, std::string path, std::string details) {
  peer::v1::PathDetails* p = d.add_paths();
  p->set_path(std::move(path));
  p->set_details(std::move(details));
}

peer::v1::NodeDescriptor Node(const std::string& node, const std::string& address,
                              uint64_t incarnation) {
  peer::v1::NodeDescriptor d;
  d.set_node(node);
  d.set_address(address);
  d.set_incarnation(incarnation);
  return d;
}

// A cluster of node "a" whose one path is `hello`.
std::unique_ptr<Cluster> ClusterWith(TestHello* hello) {
  ClusterOptions options;
  options.paths = {hello};
  return std::make_unique<Cluster>(options, Node("a", "", 0));
}

TEST(Cluster, RefusedDescriptorsAreNotLearned) {
  TestHello hello;
  std::unique_ptr<Cluster> cluster = ClusterWith(&hello);
  Cluster& c = *cluster;
  const peer::v1::NodeDescriptor b = Node("b", "127.0.0.1:2", 7);
  std::vector<peer::v1::NodeDescriptor> bad(8, b);
  bad[0].set_node(std::string(254, 'b'));
  bad[1].set_address(std::string(2000, '1'));
  for (int i = 0; i < 9; ++i) AddPath(bad[2], absl::StrCat("p", i), "");  // Too many paths.
  AddPath(bad[3], std::string(65, 'p'), "");                           // A name too long.
  AddPath(bad[4], "other", std::string((1 << 20) + 1, 'x'));            // Details too big.
  AddPath(bad[5], "other", "");
  AddPath(bad[5], "other", "");  // One path twice.
  AddPath(bad[6], "", "x");      // A path with no name.
  AddPath(bad[7], "test", "bad");  // The path refuses its blob.
  for (const peer::v1::NodeDescriptor& d : bad) {
    EXPECT_EQ(c.OnHello(d).status().code(), absl::StatusCode::kInvalidArgument)
        << d.ShortDebugString().substr(0, 200);
  }
  EXPECT_EQ(hello.reads.load(), 1);  // Only a well-bounded list reaches the path.
  EXPECT_TRUE(c.List().empty());
  ASSERT_TRUE(c.OnHello(b).ok());
  // A refused descriptor under a known name changes nothing of what was known.
  peer::v1::NodeDescriptor spoofed = bad[7];
  spoofed.set_address("127.0.0.1:666");
  EXPECT_FALSE(c.OnHello(spoofed).ok());
  EXPECT_EQ(c.Find("b")->address, "127.0.0.1:2");
  EXPECT_EQ(c.Find("b")->path<TestView>("test"), nullptr);
}

TEST(Cluster, EachPathReadsItsBlobOncePerIncarnation) {
  TestHello hello;
  std::unique_ptr<Cluster> cluster = ClusterWith(&hello);
  Cluster& c = *cluster;
  peer::v1::NodeDescriptor b = Node("b", "127.0.0.1:2", 7);
  AddPath(b, "elsewhere", "not ours");  // A path this node does not run: ignored.
  AddPath(b, "test", "b7");
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.OnHello(b).ok());  // Heartbeats say it again.
  EXPECT_EQ(hello.reads.load(), 1);
  auto found = c.Find("b");
  ASSERT_TRUE(found.ok());
  ASSERT_NE(found->path<TestView>("test"), nullptr);
  EXPECT_EQ(found->path<TestView>("test")->blob, "b7");
  EXPECT_EQ(found->path<TestView>("elsewhere"), nullptr);
  // A restart (another incarnation) is read anew; so is a changed blob.
  b.set_incarnation(8);
  b.mutable_paths(1)->set_details("b8");
  ASSERT_TRUE(c.OnHello(b).ok());
  EXPECT_EQ(hello.reads.load(), 2);
  EXPECT_EQ(c.Find("b")->path<TestView>("test")->blob, "b8");
  b.mutable_paths(1)->set_details("b8'");
  ASSERT_TRUE(c.OnHello(b).ok());
  EXPECT_EQ(hello.reads.load(), 3);
  EXPECT_EQ(c.Find("b")->path<TestView>("test")->blob, "b8'");
  // A node that does not describe the path has no view of it.
  ASSERT_TRUE(c.OnHello(Node("d", "127.0.0.1:4", 1)).ok());
  EXPECT_EQ(c.Find("d")->path<TestView>("test"), nullptr);
  EXPECT_TRUE(c.Matches("b", 8, [](const PeerView& v) {
    return v.path<TestView>("test") != nullptr;
  }));
  EXPECT_FALSE(c.Matches("d", 1, [](const PeerView& v) {
    return v.path<TestView>("test") != nullptr;
  }));
}

TEST(Cluster, LossWatchesRunWhenTheirNodeGoesDownUnlessForgotten) {
  peer::v1::NodeDescriptor self;
  self.set_node("a");
  self.set_address("127.0.0.1:1");
  ClusterOptions options;
  options.heartbeat = absl::Milliseconds(20);
  options.peer_timeout = absl::Milliseconds(200);
  // Before the cluster: its heartbeat thread, which runs the watches, ends first.
  std::atomic<int> unknown{0}, watched{0}, forgotten{0};
  Cluster c(options, self);
  c.Start(nullptr);
  c.WatchLoss("nobody", [&] { ++unknown; });  // Not a peer: at once.
  EXPECT_EQ(unknown.load(), 1);
  peer::v1::NodeDescriptor b;
  b.set_node("b");
  b.set_address("127.0.0.1:9");  // Nobody answers there.
  b.set_incarnation(7);
  ASSERT_TRUE(c.OnHello(b).ok());
  c.WatchLoss("b", [&] { ++watched; });
  c.Forget(c.WatchLoss("b", [&] { ++forgotten; }));
  EXPECT_EQ(watched.load(), 0);
  // b goes down past the timeout (a loaded machine may take longer: bounded at 10 s).
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (watched.load() == 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(watched.load(), 1);
  absl::SleepFor(absl::Milliseconds(100));  // A forgotten watch would run beside it.
  EXPECT_EQ(forgotten.load(), 0);
}

}  // namespace
}  // namespace gpumove
