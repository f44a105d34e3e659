// Daemon's life: Start as a list of named steps (each defined beside the modules it makes,
// in start_*.cc), the drain, and the teardown in order.
#include "daemon/app/daemon.h"

#include <chrono>
#include <thread>

#include "daemon/common/log.h"
#include "daemon/common/thread_pool.h"

namespace gpumove {

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  options = WithMachineDefaults(std::move(options), std::thread::hardware_concurrency());
  std::unique_ptr<Daemon> d(new Daemon());
  SetPoolIdleSpin(options.pool_spin);
  // Each step makes one part from its options and the parts made before it.
  if (absl::Status st = d->JoinMpiJob(options); !st.ok()) return st;  // May name this node.
  for (auto step : {
           &Daemon::FindGpus,          // start_pools.cc
           &Daemon::StartUcx,          // start_paths.cc
           &Daemon::MakePools,         // start_pools.cc
           &Daemon::StartUcxLanes,     // start_paths.cc
           &Daemon::ShareDevicePools,  // start_pools.cc
           &Daemon::MakeRegistry,      // start_pools.cc
           &Daemon::DescribeSelf,      // start_cluster.cc
           &Daemon::JoinCluster,       // start_cluster.cc
           &Daemon::MakeEngines,       // start_paths.cc
           &Daemon::StartMetrics,      // start_metrics.cc
           &Daemon::MakeScheduler,     // start_services.cc
           &Daemon::MakeServices,      // start_services.cc
           &Daemon::Serve,             // start_server.cc
           &Daemon::Advertise,         // start_cluster.cc
       }) {
    if (absl::Status st = (d.get()->*step)(options); !st.ok()) return st;
  }
  return d;
}

Daemon::~Daemon() {
  // The metrics' refresher reads the scheduler, which goes first.
  if (metrics_ != nullptr) metrics_->StopRefreshing();
  // Peer calls stop before the services they run on go.
  if (peer_calls_ != nullptr) peer_calls_->StopServing();
  if (listeners_ != nullptr) listeners_->Stop();
  if (server_ != nullptr) {
    scheduler_->CancelAll();
    notifications_->Stop();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  // metrics_ goes before remote_ranges_, whose retries may still call peers.
  if (remote_ranges_ != nullptr) remote_ranges_->set_observer(nullptr);
}

void Daemon::Shutdown(absl::Duration grace) {
  LOG(INFO) << "draining: refusing new transfers; " << scheduler_->active()
            << " queued or running get " << absl::FormatDuration(grace) << " to finish";
  server_->GetHealthCheckService()->SetServingStatus(false);
  scheduler_->StopAccepting();
  if (!scheduler_->Drain(absl::Now() + grace)) {
    LOG(WARNING) << "drain grace ran out; cancelling " << scheduler_->active() << " transfer(s)";
    scheduler_->CancelAll();
    scheduler_->Drain(absl::Now() + absl::Seconds(10));
  }
  // Let Wait/Watch callers see the final states before their streams are cut.
  notifications_->Stop();
  listeners_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  LOG(INFO) << "stopped";
}

void Daemon::CancelAll() { scheduler_->CancelAll(); }

void Daemon::Wait() { server_->Wait(); }

std::shared_ptr<grpc::Channel> Daemon::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return server_->InProcessChannel(args);
}

}  // namespace gpumove
