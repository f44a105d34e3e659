// Priority classes and fair shares (issue 56): the queue's picking policy in-process with
// time driven by the test (class order, weights on bytes, the starvation bound), the
// weights file, and a scheduler with one worker: classes reorder ready moves, never
// moves over overlapping bytes.
#include "daemon/core/qos.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/watched_files.h"
#include "daemon/core/transfer_scheduler.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

TEST(QosQueueTest, HigherClassesFirstAndFirstComeFirstServedWithinOne) {
  QosQueue<int> q;
  q.Push(1, "a", Priority::kBulk, 10, kT0);
  q.Push(2, "a", Priority::kNormal, 10, kT0);
  q.Push(3, "a", Priority::kLatency, 10, kT0);
  q.Push(4, "a", Priority::kNormal, 10, kT0);
  q.Push(5, "a", Priority::kLatency, 10, kT0);
  EXPECT_EQ(q.size(), 5u);
  EXPECT_EQ(q.size(Priority::kNormal), 2u);
  std::vector<int> order;
  while (!q.empty()) order.push_back(q.Pop(kT0));
  EXPECT_EQ(order, (std::vector<int>{3, 5, 2, 4, 1}));
}

// Sizes from 4 KiB to 1 MiB, the same sequence every run.
uint64_t NextSize(uint64_t& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return (4u << 10) + (state >> 33) % (1u << 20);
}

TEST(QosQueueTest, WeightsThreeToOneGiveThreeToOneBytes) {
  TenantWeights weights;
  weights.Set({{"a", 3}, {"b", 1}});
  QosQueue<std::string> q({}, &weights);
  uint64_t state = 7;
  // Both keep far more queued than the run takes: both saturate.
  for (int i = 0; i < 3000; ++i) {
    q.Push("a", "a", Priority::kNormal, NextSize(state), kT0);
    q.Push("b", "b", Priority::kNormal, NextSize(state), kT0);
  }
  std::map<std::string, uint64_t> bytes;
  // The sizes again, per tenant in the order pushed, to count the bytes of each pick.
  std::map<std::string, std::vector<uint64_t>> pushed;
  state = 7;
  for (int i = 0; i < 3000; ++i) {
    pushed["a"].push_back(NextSize(state));
    pushed["b"].push_back(NextSize(state));
  }
  std::map<std::string, size_t> taken;
  for (int pick = 0; pick < 2000; ++pick) {
    const std::string who = q.Pop(kT0);
    bytes[who] += pushed[who][taken[who]++];
  }
  ASSERT_GT(bytes["b"], 0u);
  const double ratio = static_cast<double>(bytes["a"]) / static_cast<double>(bytes["b"]);
  EXPECT_GT(ratio, 3 * 0.9) << bytes["a"] << " : " << bytes["b"];
  EXPECT_LT(ratio, 3 * 1.1) << bytes["a"] << " : " << bytes["b"];
}

TEST(QosQueueTest, SharesAreOnBytesNotMoves) {
  QosQueue<std::string> q;  // Equal weights.
  for (int i = 0; i < 4000; ++i) q.Push("small", "small", Priority::kBulk, 64 << 10, kT0);
  for (int i = 0; i < 200; ++i) q.Push("large", "large", Priority::kBulk, 4 << 20, kT0);
  std::map<std::string, uint64_t> bytes;
  for (int pick = 0; pick < 1000; ++pick) {
    const std::string who = q.Pop(kT0);
    bytes[who] += who == "small" ? (64 << 10) : (4 << 20);
  }
  const double ratio = static_cast<double>(bytes["small"]) / static_cast<double>(bytes["large"]);
  EXPECT_GT(ratio, 0.9);
  EXPECT_LT(ratio, 1.1);
}

TEST(QosQueueTest, AMoveFarLargerThanTheQuantumStillStartsAtOnce) {
  QosQueue<int> q;
  q.Push(1, "huge", Priority::kNormal, uint64_t{1} << 44, kT0);  // 16 TiB: 2^24 quanta.
  q.Push(2, "small", Priority::kNormal, 4096, kT0);
  EXPECT_EQ(q.Pop(kT0), 2);
  EXPECT_EQ(q.Pop(kT0), 1);  // Alone: the rounds it would wait are skipped.
  EXPECT_TRUE(q.empty());
}

TEST(QosQueueTest, ALowerClassPastTheBoundGetsATurnBeforeItAndNotBefore) {
  QosOptions options;
  options.starvation_bound = absl::Milliseconds(500);
  options.starved_turn_every = 4;
  QosQueue<std::string> q(options);
  q.Push("bulk", "b", Priority::kBulk, 1 << 20, kT0);
  int latency = 0;
  int bulk_at = -1;
  for (int pick = 0; pick < 100 && bulk_at < 0; ++pick) {
    const absl::Time now = kT0 + absl::Milliseconds(50) * pick;
    q.Push("latency", "a", Priority::kLatency, 4096, now);  // Latency load never stops.
    if (q.Pop(now) == "bulk") {
      bulk_at = pick;
      EXPECT_GT(now - kT0, options.starvation_bound);
    } else {
      ++latency;
    }
  }
  // Past the bound at pick 11 (550 ms); a turn within the next 4 picks.
  ASSERT_GE(bulk_at, 11);
  EXPECT_LE(bulk_at, 11 + options.starved_turn_every);
}

TEST(QosQueueTest, ABacklogOfStarvedMovesTakesAtMostItsShare) {
  QosOptions options;
  options.starvation_bound = absl::Milliseconds(10);
  options.starved_turn_every = 4;
  QosQueue<std::string> q(options);
  for (int i = 0; i < 100; ++i) q.Push("bulk", "b", Priority::kBulk, 1 << 20, kT0);
  const absl::Time later = kT0 + absl::Seconds(10);  // All of them long past the bound.
  int bulk = 0;
  for (int pick = 0; pick < 80; ++pick) {
    q.Push("latency", "a", Priority::kLatency, 4096, later);
    bulk += q.Pop(later) == "bulk";
  }
  EXPECT_EQ(bulk, 80 / options.starved_turn_every);
}

TEST(TenantWeightsTest, FileLinesAndDefaults) {
  auto w = ParseTenantWeights("# weights\nteam-a 3\nteam-b,1\n\n*\t2\n");
  ASSERT_TRUE(w.ok()) << w.status();
  TenantWeights weights;
  weights.Set(*w);
  EXPECT_EQ(weights.Of("team-a"), 3u);
  EXPECT_EQ(weights.Of("team-b"), 1u);
  EXPECT_EQ(weights.Of("someone"), 2u);  // `*`.
  weights.Set({});
  EXPECT_EQ(weights.Of("team-a"), 1u);
  for (const char* bad : {"team-a\n", "team-a 0\n", "team-a 1001\n", "team-a three\n",
                          "team-a 1 2\n", "team-a 1\nteam-a 2\n", "team-a -1\n"}) {
    auto r = ParseTenantWeights(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("line "), std::string::npos) << r.status();
  }
  std::string many;
  for (size_t i = 0; i <= kMaxWeightedTenants; ++i) many += "t" + std::to_string(i) + " 1\n";
  EXPECT_EQ(ParseTenantWeights(many).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePriority("bulk"), Priority::kBulk);
  EXPECT_FALSE(ParsePriority("urgent").has_value());
}

// As the daemon watches --tenant_weights: re-read when it changes; a file with a bad line
// is refused (naming the file and line) and the weights before kept.
TEST(TenantWeightsTest, TheFileIsReReadAndABadOneKeepsTheWeightsBefore) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/weights.", getpid());
  auto put = [&](const std::string& text) {
    std::ofstream(path + ".new") << text;
    std::rename((path + ".new").c_str(), path.c_str());
  };
  TenantWeights weights;
  auto start = [&] {
    return WatchedFiles::StartParsed(
        path, absl::Milliseconds(20), "tenant weights file", ParseTenantWeights,
        [&weights](absl::flat_hash_map<std::string, uint32_t> w) { weights.Set(std::move(w)); });
  };
  auto weighs = [&](const std::string& tenant, uint32_t w) {
    for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;) {
      if (weights.Of(tenant) == w) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  };
  put("a 9\nb zero\n");
  auto refused = start();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(path + ": line 2: weight \"zero\""),
            std::string::npos)
      << refused.status();
  put("a 3\n");
  auto w = start();
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(weights.Of("a"), 3u);
  put("a 3\nb 0\n");
  absl::SleepFor(absl::Milliseconds(200));  // Ten re-reads: refused each time.
  EXPECT_EQ(weights.Of("a"), 3u);
  put("a 5\n* 2\n");
  EXPECT_TRUE(weighs("a", 5));
  EXPECT_EQ(weights.Of("c"), 2u);
  w->reset();
  std::remove(path.c_str());
}

// Copies with memcpy; held until opened; records the order its moves ran in.
class OrderEngine : public Engine {
 public:
  PathKind path() const override { return PathKind::kLocal; }
  absl::Status CanServe(const Endpoint&, const Endpoint&) const override {
    return absl::OkStatus();
  }
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override {
    absl::MutexLock lock(&mu_);
    order_.push_back(dst.data);
    if (!free_.contains(dst.data)) mu_.Await(absl::Condition(&open_));
    std::memcpy(dst.data, src.data, length);
    control.Progress(length);
    return absl::OkStatus();
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Moves into `dst` run without waiting for Open.
  void PassFreely(char* dst) {
    absl::MutexLock lock(&mu_);
    free_.insert(dst);
  }
  bool AwaitStarted(size_t n) {
    absl::MutexLock lock(&mu_);
    auto started = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return order_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&started), absl::Seconds(10));
  }
  std::vector<char*> order() {
    absl::MutexLock lock(&mu_);
    return order_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<char*> free_ ABSL_GUARDED_BY(mu_);
  std::vector<char*> order_ ABSL_GUARDED_BY(mu_);
};

// Host pools, a registry, and a scheduler of one worker over an OrderEngine; the hour's
// starvation bound leaves only classes and weights to order its moves, however slow the
// run.
struct OneWorker {
  explicit OneWorker(SchedulerOptions options = {}) {
    PoolSizes sizes;
    sizes.host = 4 << 20;
    sizes.pinned = 0;
    pools = *PoolSet::Create(sizes, {}, gpu.get());
    registry = std::make_unique<BufferRegistry>(pools.get(), absl::ZeroDuration());
    options.node = "n1";
    options.workers = 1;
    options.qos.starvation_bound = absl::Hours(1);
    sched = std::make_unique<TransferScheduler>(
        options, registry.get(), std::vector<Engine*>{&engine},
        [](const Endpoint&, uint64_t) { return absl::StatusOr<uint64_t>(0); });
  }
  std::unique_ptr<GpuRuntime> gpu = GpuRuntime::CreateHostOnly("test");
  std::unique_ptr<PoolSet> pools;
  std::unique_ptr<BufferRegistry> registry;
  OrderEngine engine;
  std::unique_ptr<TransferScheduler> sched;  // Last: it stops first.
};

TEST(QosSchedulerTest, ClassesReorderReadyMovesButNotOverlappingOnes) {
  OneWorker w;
  BufferRegistry& registry = *w.registry;
  TransferScheduler& sched = *w.sched;
  OrderEngine& engine = w.engine;
  std::map<char*, std::string> names;
  auto buffer = [&](const std::string& name) {
    AllocateOptions o;
    o.size = 4096;
    o.owner = "me";
    BufferInfo b = *registry.Allocate(o);
    names[registry.Acquire("me", b.id, 0, 0)->data()] = name;
    return b.id;
  };
  const std::string src = buffer("src");
  auto submit = [&](const std::string& dst, Priority p) {
    TransferSpec s;
    s.source = {"", src, 0, 0};
    s.destination = {"", dst, 0, 0};
    s.priority = p;
    auto r = sched.Submit("me", {s}, "");
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->at(0).priority, p);
    return r->at(0);
  };
  const std::string first = buffer("first"), bulk = buffer("bulk"), normal = buffer("normal"),
                    latency = buffer("latency");
  submit(first, Priority::kNormal);  // Takes the one worker.
  ASSERT_TRUE(engine.AwaitStarted(1));
  submit(bulk, Priority::kBulk);
  submit(normal, Priority::kNormal);
  submit(latency, Priority::kLatency);
  // Writes the bulk move's destination: it waits for that move, class or not.
  const TransferSnapshot after = submit(bulk, Priority::kLatency);
  EXPECT_EQ(after.state, TransferState::kQueued);
  EXPECT_EQ(after.waits_for, 1);
  EXPECT_EQ(sched.Get("me", after.id)->waits_for, 1);
  engine.Open();
  ASSERT_TRUE(sched.Wait("me", after.id, absl::Now() + absl::Seconds(10)).ok());
  std::vector<std::string> order;
  for (char* d : engine.order()) order.push_back(names[d]);
  EXPECT_EQ(order, (std::vector<std::string>{"first", "latency", "normal", "bulk", "bulk"}));
  EXPECT_EQ(sched.Get("me", after.id)->waits_for, 0);
}

// SchedulerOptions::latency_workers: with the one worker held by a bulk move and another
// bulk move queued, a latency move runs at once on the latency worker (and, without one,
// waits for the bulk move to end).
TEST(QosSchedulerTest, ALatencyMoveRunsWhileEveryWorkerRunsBulk) {
  for (int latency_workers : {1, 0}) {
    SCOPED_TRACE(latency_workers);
    SchedulerOptions options;
    options.latency_workers = latency_workers;
    OneWorker w(options);
    auto buffer = [&](char** data) {
      AllocateOptions o;
      o.size = 4096;
      o.owner = "me";
      BufferInfo b = *w.registry->Allocate(o);
      if (data != nullptr) *data = w.registry->Acquire("me", b.id, 0, 0)->data();
      return b.id;
    };
    char* latency_data = nullptr;
    const std::string src = buffer(nullptr), bulk1 = buffer(nullptr), bulk2 = buffer(nullptr),
                      latency = buffer(&latency_data);
    w.engine.PassFreely(latency_data);
    auto submit = [&](const std::string& dst, Priority p) {
      TransferSpec s;
      s.source = {"", src, 0, 0};
      s.destination = {"", dst, 0, 0};
      s.priority = p;
      auto r = w.sched->Submit("me", {s}, "");
      EXPECT_TRUE(r.ok()) << r.status();
      return r.ok() ? r->at(0).id : "";
    };
    const std::string b1 = submit(bulk1, Priority::kBulk);
    ASSERT_TRUE(w.engine.AwaitStarted(1));
    const std::string b2 = submit(bulk2, Priority::kBulk);
    const std::string l = submit(latency, Priority::kLatency);
    if (latency_workers == 1) {
      auto ended = w.sched->Wait("me", l, absl::Now() + absl::Seconds(10));
      ASSERT_TRUE(ended.ok()) << ended.status();
      EXPECT_EQ(ended->state, TransferState::kSucceeded);
      EXPECT_EQ(w.sched->Get("me", b1)->state, TransferState::kRunning);
      EXPECT_EQ(w.sched->Get("me", b2)->state, TransferState::kQueued);  // Not the latency worker's.
    } else {
      auto ended = w.sched->Wait("me", l, absl::Now() + absl::Milliseconds(300));
      EXPECT_TRUE(absl::IsDeadlineExceeded(ended.status())) << ended.status();
      EXPECT_EQ(w.sched->Get("me", l)->state, TransferState::kQueued);
    }
    w.engine.Open();
    for (const std::string& id : {b1, b2, l}) {
      auto end = w.sched->Wait("me", id, absl::Now() + absl::Seconds(10));
      ASSERT_TRUE(end.ok());
      EXPECT_EQ(end->state, TransferState::kSucceeded);
    }
  }
}

// The scheduler takes the tenants' weights (SchedulerOptions::weights): with one worker
// and both tenants' moves ready, 3:1 weights start 3:1 of the bytes.
TEST(QosSchedulerTest, TenantsWeightsShareTheWorker) {
  TenantWeights weights;
  weights.Set({{"a", 3}, {"b", 1}});
  SchedulerOptions options;
  options.weights = &weights;
  options.qos.quantum = 4096;  // One move of 4 KiB per round and unit of weight.
  OneWorker w(options);
  BufferRegistry& registry = *w.registry;
  TransferScheduler& sched = *w.sched;
  OrderEngine& engine = w.engine;
  constexpr int kMoves = 40;
  struct Tenant {
    std::string src, dst;
    char* base = nullptr;
  };
  std::map<std::string, Tenant> tenants;
  for (const std::string owner : {"a", "b"}) {
    AllocateOptions o;
    o.size = kMoves * 4096;
    o.owner = owner;
    Tenant& t = tenants[owner];
    t.src = registry.Allocate(o)->id;
    t.dst = registry.Allocate(o)->id;
    t.base = registry.Acquire(owner, t.dst, 0, 0)->data();
  }
  auto submit = [&](const std::string& owner, int slice) {
    TransferSpec s;
    s.source = {"", tenants[owner].src, 0, 4096};
    s.destination = {"", tenants[owner].dst, static_cast<uint64_t>(slice) * 4096, 0};
    auto r = sched.Submit(owner, {s}, "");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->at(0).id : "";
  };
  submit("a", 0);  // Takes the worker; the others wait for it, each into its own slice.
  ASSERT_TRUE(engine.AwaitStarted(1));
  std::string last;
  for (int i = 1; i < kMoves; ++i) {
    submit("a", i);
    last = submit("b", i);
  }
  engine.Open();
  ASSERT_TRUE(sched.Wait("b", last, absl::Now() + absl::Seconds(10)).ok());
  const std::vector<char*> order = engine.order();
  ASSERT_EQ(order.size(), 2u * kMoves - 1);
  int a = 0;
  for (size_t i = 1; i <= 20; ++i) {  // The first 20 after the first: both had moves ready.
    const char* base = tenants["a"].base;
    a += order[i] >= base && order[i] < base + kMoves * 4096;
  }
  EXPECT_EQ(a, 15);
}

}  // namespace
}  // namespace gpumove
