#include "daemon/server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <exception>

#include "absl/strings/str_cat.h"

namespace gpumove {

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& given, PoolSet* pools,
                                                        Cluster* cluster) {
  // A port alone ("9464", ":9464") is this host's loopback: metrics tell how busy the
  // node is and what it holds, for the local scraper unless a host is named.
  std::string listen = given;
  if (listen.find(':') == std::string::npos) listen = ":" + listen;
  if (listen.front() == ':') listen = "127.0.0.1" + listen;
  std::unique_ptr<Metrics> m(new Metrics());
  m->pools_ = pools;
  m->cluster_ = cluster;
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", listen, ": ", e.what()));
  }
  const auto ports = m->exposer_->GetListeningPorts();
  const size_t colon = listen.rfind(':');
  m->address_ = absl::StrCat(listen.substr(0, colon), ":", ports.empty() ? 0 : ports.front());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->transfers_ = &prometheus::BuildCounter()
                       .Name("gpumoved_transfers_total")
                       .Help("Transfers that ended, by path and outcome")
                       .Register(*m->registry_);
  m->bytes_ = &prometheus::BuildCounter()
                   .Name("gpumoved_transfer_bytes_total")
                   .Help("Bytes moved by transfers that succeeded, by path")
                   .Register(*m->registry_);
  m->carrier_bytes_ = &prometheus::BuildCounter()
                           .Name("gpumoved_transport_bytes_total")
                           .Help("Bytes moved by transfers that succeeded, by path and by "
                                 "the transports that carried them (UCX: the transports "
                                 "and devices UCX chose, e.g. rc_verbs/rxe0:1)")
                           .Register(*m->registry_);
  m->tenant_bytes_ = &prometheus::BuildCounter()
                          .Name("gpumoved_tenant_bytes_total")
                          .Help("Bytes moved by transfers that succeeded, by tenant and priority "
                                "class (at most 192 pairs named, the rest tenant other)")
                          .Register(*m->registry_);
  m->queue_wait_family_ = &prometheus::BuildHistogram()
                               .Name("gpumoved_queue_wait_seconds")
                               .Help("Time from Submit to the start of transfers that started "
                                     "(waiting for earlier moves over the same bytes and for a "
                                     "worker), by priority class")
                               .Register(*m->registry_);
  m->seconds_ = &prometheus::BuildHistogram()
                     .Name("gpumoved_transfer_seconds")
                     .Help("Time from start to end of transfers that succeeded, by path")
                     .Register(*m->registry_);
  m->latency_ = &prometheus::BuildHistogram()
                     .Name("gpumoved_transfer_latency_seconds")
                     .Help("Time from Submit to the end of transfers that succeeded (queueing "
                           "included), by path and size class (le_4KiB, le_64KiB, le_1MiB, "
                           "le_16MiB, le_256MiB, gt_256MiB)")
                     .Register(*m->registry_);
  m->peer_call_seconds_ = &prometheus::BuildHistogram()
                               .Name("gpumoved_peer_call_seconds")
                               .Help("Calls this node made to peers during moves (holds, "
                                     "acknowledgements, staging and MPI steps), by method and "
                                     "channel (ucx active messages or grpc), failed ones too")
                               .Register(*m->registry_);
  m->peer_call_failures_ = &prometheus::BuildCounter()
                                .Name("gpumoved_peer_call_failures_total")
                                .Help("Peer calls that failed, by method and gRPC code")
                                .Register(*m->registry_);
  m->pool_bytes_ = &prometheus::BuildGauge()
                        .Name("gpumoved_pool_bytes")
                        .Help("Pool capacity and free bytes, by kind and device")
                        .Register(*m->registry_);
  m->peers_up_ = &prometheus::BuildGauge()
                      .Name("gpumoved_peers_up")
                      .Help("Peers answering heartbeats")
                      .Register(*m->registry_)
                      .Add({});
  m->Refresh();
  m->exposer_->RegisterCollectable(m->registry_);
  Metrics* raw = m.get();
  m->refresher_ = std::thread([raw] {
    while (!raw->stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) raw->Refresh();
  });
  return m;
}

Metrics::~Metrics() { StopRefreshing(); }

void Metrics::StopRefreshing() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (refresher_.joinable()) refresher_.join();
}

namespace {

constexpr const char* kSizeClassNames[] = {"le_4KiB",   "le_64KiB",  "le_1MiB",
                                           "le_16MiB", "le_256MiB", "gt_256MiB"};

// The series `slot` caches, made by `make` the first time (two threads that race make the
// same series: a family hands back the one it has for the same labels).
template <typename T, typename Make>
T& Cached(std::atomic<T*>& slot, Make make) {
  T* p = slot.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = &make();
    slot.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace

static_assert(static_cast<int>(PathKind::kFile) + 1 == 6, "Metrics::kPaths");
static_assert(static_cast<int>(TransferState::kCancelled) + 1 == 5, "Metrics::kStates");

void Metrics::OnTransferEnd(const TransferEnd& t) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10, 30};
  const int p = static_cast<int>(t.path), st = static_cast<int>(t.state);
  if (p < 0 || p >= kPaths || st < 0 || st >= kStates) return;
  PathSeries& s = series_[p];
  const char* path = PathKindName(t.path);
  CountClass(t);
  Cached(s.transfers[st], [&]() -> prometheus::Counter& {
    return transfers_->Add({{"path", path}, {"outcome", TransferStateName(t.state)}});
  }).Increment();
  if (t.state != TransferState::kSucceeded) return;
  Cached(s.bytes, [&]() -> prometheus::Counter& {
    return bytes_->Add({{"path", path}});
  }).Increment(static_cast<double>(t.length));
  if (!t.carrier.empty()) {
    absl::MutexLock lock(&carriers_mu_);
    const std::string key = absl::StrCat(path, "\n", t.carrier);
    auto it = carriers_.find(key);
    if (it == carriers_.end()) {
      const bool room = carriers_.size() < kMostCarriers;
      const std::string shown = room ? std::string(t.carrier) : "other";
      it = carriers_
               .emplace(room ? key : absl::StrCat(path, "\nother"),
                        &carrier_bytes_->Add({{"path", path}, {"transport", shown}}))
               .first;
    }
    it->second->Increment(static_cast<double>(t.length));
  }
  Cached(s.seconds, [&]() -> prometheus::Histogram& {
    return seconds_->Add({{"path", path}}, kBuckets);
  }).Observe(absl::ToDoubleSeconds(t.end_time - t.start_time));
  if (t.create_time != absl::InfinitePast()) {
    const int size = SizeClass(t.length);
    Cached(s.latency[size], [&]() -> prometheus::Histogram& {
      return latency_->Add({{"path", path}, {"size", kSizeClassNames[size]}}, kBuckets);
    }).Observe(absl::ToDoubleSeconds(t.end_time - t.create_time));
  }
}

void Metrics::CountClass(const TransferEnd& t) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10, 30};
  const int c = static_cast<int>(t.priority);
  if (c < 0 || c >= kPriorities) return;
  const char* name = PriorityName(t.priority);
  if (t.start_time != absl::InfinitePast() && t.create_time != absl::InfinitePast()) {
    Cached(queue_wait_[c], [&]() -> prometheus::Histogram& {
      return queue_wait_family_->Add({{"class", name}}, kBuckets);
    }).Observe(absl::ToDoubleSeconds(t.start_time - t.create_time));
  }
  if (t.state != TransferState::kSucceeded) return;
  absl::MutexLock lock(&carriers_mu_);
  const std::string key = absl::StrCat(name, "\n", t.owner);
  auto it = tenants_.find(key);
  if (it == tenants_.end()) {
    // Pairs of a tenant and a class past the most are counted under tenant other.
    const bool room = tenants_.size() < kMostTenants * kPriorities;
    const std::string shown = room ? std::string(t.owner) : "other";
    it = tenants_
             .emplace(room ? key : absl::StrCat(name, "\nother"),
                      &tenant_bytes_->Add({{"tenant", shown}, {"class", name}}))
             .first;
  }
  it->second->Increment(static_cast<double>(t.length));
}

int Metrics::SizeClass(uint64_t bytes) {
  if (bytes <= (4u << 10)) return 0;
  if (bytes <= (64u << 10)) return 1;
  if (bytes <= (1u << 20)) return 2;
  if (bytes <= (16u << 20)) return 3;
  if (bytes <= (256u << 20)) return 4;
  return 5;
}

void Metrics::OnPeerCall(absl::string_view method, const char* channel, absl::Duration took,
                         const absl::Status& outcome) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10};
  const std::string name(method);
  peer_call_seconds_->Add({{"method", name}, {"channel", channel}}, kBuckets)
      .Observe(absl::ToDoubleSeconds(took));
  if (!outcome.ok()) {
    peer_call_failures_->Add({{"method", name}, {"code", absl::StatusCodeToString(outcome.code())}})
        .Increment();
  }
}

void Metrics::AddGauge(const std::string& name, const std::string& help,
                       std::function<double()> read) {
  prometheus::Gauge& g = prometheus::BuildGauge()
                             .Name(absl::StrCat("gpumoved_", name))
                             .Help(help)
                             .Register(*registry_)
                             .Add({});
  absl::MutexLock lock(&totals_mu_);
  g.Set(read());
  gauges_.push_back(Reading{&g, std::move(read)});
}

void Metrics::AddTotal(const std::string& name, const std::string& help,
                       std::function<uint64_t()> read) {
  prometheus::Counter& c = prometheus::BuildCounter()
                               .Name(absl::StrCat("gpumoved_", name))
                               .Help(help)
                               .Register(*registry_)
                               .Add({});
  absl::MutexLock lock(&totals_mu_);
  totals_.push_back(Total{&c, std::move(read)});
  Total& t = totals_.back();
  t.seen = t.read();
  t.counter->Increment(static_cast<double>(t.seen));
}

void Metrics::Refresh() {
  {
    absl::MutexLock lock(&totals_mu_);
    for (Total& t : totals_) {
      const uint64_t now = t.read();
      if (now > t.seen) t.counter->Increment(static_cast<double>(now - t.seen));
      t.seen = now;
    }
    for (Reading& r : gauges_) r.gauge->Set(r.read());
  }
  for (const auto& pool : pools_->pools()) {
    const PoolStats s = pool->Stats();
    const std::string device = s.device >= 0 ? absl::StrCat(s.device) : "";
    pool_bytes_->Add({{"kind", MemoryKindName(s.kind)}, {"device", device}, {"state", "capacity"}})
        .Set(static_cast<double>(s.capacity));
    pool_bytes_->Add({{"kind", MemoryKindName(s.kind)}, {"device", device}, {"state", "free"}})
        .Set(static_cast<double>(s.free));
  }
  if (cluster_ != nullptr) {
    int up = 0;
    for (const PeerView& p : cluster_->List()) up += p.up;
    peers_up_->Set(up);
  }
}

}  // namespace gpumove
