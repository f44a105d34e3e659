// Prometheus metrics on their own HTTP port (gpumoved_ prefix): transfers and bytes by
// path and outcome, move durations, pool capacity and free bytes, peers up.
#ifndef GPUMOVE_DAEMON_SERVER_METRICS_H_
#define GPUMOVE_DAEMON_SERVER_METRICS_H_

#include <atomic>
#include <memory>
#include <string>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/cluster/cluster.h"
#include "daemon/peer/remote_ranges.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/memory/pool.h"

namespace prometheus {
class Exposer;
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace gpumove {

class Metrics : public PeerCallObserver {
 public:
  // Serves /metrics on `listen` (host:port; port 0 picks one). `pools` and `cluster`
  // (may be null) must outlive this. UNAVAILABLE when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen, PoolSet* pools,
                                                        Cluster* cluster);
  ~Metrics();
  // Stops reading the totals and gauges (before what they read goes). Idempotent.
  void StopRefreshing();

  // host:port actually bound.
  const std::string& address() const { return address_; }
  // Counts a transfer that reached its end state. Thread-safe and lock-free once each
  // series was seen (its counters are looked up in a table, not by labels), so cheap
  // enough to be called under the scheduler's lock.
  void OnTransferEnd(const TransferEnd& t);
  // A counter read from elsewhere (a running total) on every refresh, exported as
  // gpumoved_<name>. Call before the first scrape matters; not thread-safe with itself.
  void AddTotal(const std::string& name, const std::string& help, std::function<uint64_t()> read);
  // A gauge read from elsewhere on every refresh, exported as gpumoved_<name>; same rules.
  void AddGauge(const std::string& name, const std::string& help, std::function<double()> read);
  // gpumoved_peer_call_seconds{method, channel} and gpumoved_peer_call_failures_total.
  void OnPeerCall(absl::string_view method, const char* channel, absl::Duration took,
                  const absl::Status& outcome) override;

 private:
  Metrics() = default;
  void Refresh();
  static int SizeClass(uint64_t bytes);

  // The series of one path (one state, one size class), made on first use.
  static constexpr int kPaths = 6, kStates = 5, kSizeClasses = 6;
  struct PathSeries {
    std::atomic<prometheus::Counter*> transfers[kStates] = {};
    std::atomic<prometheus::Counter*> bytes{nullptr};
    std::atomic<prometheus::Histogram*> seconds{nullptr};
    std::atomic<prometheus::Histogram*> latency[kSizeClasses] = {};
  };
  PathSeries series_[kPaths];

  std::string address_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* transfers_ = nullptr;
  prometheus::Family<prometheus::Counter>* bytes_ = nullptr;
  prometheus::Family<prometheus::Histogram>* seconds_ = nullptr;
  prometheus::Family<prometheus::Histogram>* latency_ = nullptr;
  prometheus::Family<prometheus::Histogram>* peer_call_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* peer_call_failures_ = nullptr;
  prometheus::Family<prometheus::Gauge>* pool_bytes_ = nullptr;
  prometheus::Gauge* peers_up_ = nullptr;
  // Bytes by what carried them (TransferEnd::carrier), a series per path and carrier,
  // at most kMostCarriers of them (the rest counted as "other").
  static constexpr size_t kMostCarriers = 32;
  prometheus::Family<prometheus::Counter>* carrier_bytes_ = nullptr;
  absl::Mutex carriers_mu_;
  absl::flat_hash_map<std::string, prometheus::Counter*> carriers_ ABSL_GUARDED_BY(carriers_mu_);
  // Bytes by tenant and priority class, at most kMostTenants * kPriorities pairs named
  // (the rest tenant "other"), and the time moves waited to start, by class.
  static constexpr size_t kMostTenants = 64;
  prometheus::Family<prometheus::Counter>* tenant_bytes_ = nullptr;
  absl::flat_hash_map<std::string, prometheus::Counter*> tenants_ ABSL_GUARDED_BY(carriers_mu_);
  std::atomic<prometheus::Histogram*> queue_wait_[kPriorities] = {};
  prometheus::Family<prometheus::Histogram>* queue_wait_family_ = nullptr;
  // Counts `t`'s bytes for its tenant and class, and the time it waited to start.
  void CountClass(const TransferEnd& t);
  struct Total {
    prometheus::Counter* counter;
    std::function<uint64_t()> read;
    uint64_t seen = 0;
  };
  struct Reading {
    prometheus::Gauge* gauge;
    std::function<double()> read;
  };
  absl::Mutex totals_mu_;
  std::vector<Total> totals_ ABSL_GUARDED_BY(totals_mu_);
  std::vector<Reading> gauges_ ABSL_GUARDED_BY(totals_mu_);
  PoolSet* pools_ = nullptr;
  Cluster* cluster_ = nullptr;
  absl::Notification stop_;
  std::thread refresher_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_METRICS_H_
