// Daemon's life: Start as a list of named steps (each defined beside the modules it makes,
// in start_*.cc), the drain, and the teardown in order.
#include "daemon/app/daemon.h"

#include <chrono>
#include <thread>
#include <utility>

#include "daemon/common/log.h"
#include "daemon/common/thread_pool.h"

namespace gpumove {

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  options = WithMachineDefaults(std::move(options), std::thread::hardware_concurrency());
  std::unique_ptr<Daemon> d(new Daemon());
  SetPoolIdleSpin(options.pool_spin);
  // Each step makes one part from its options and the parts made before it.
  if (absl::Status st = d->JoinMpiJob(options); !st.ok()) return st;  // May name this node.
  if (absl::Status st = d->Listen(options); !st.ok()) return st;
  const absl::Time started = absl::Now();
  // Each step makes one part from its options and the parts made before it; what a step
  // does is what a caller is told while it runs.
  using Step = absl::Status (Daemon::*)(const DaemonOptions&);
  for (auto [step, doing] : std::initializer_list<std::pair<Step, const char*>>{
           {&Daemon::FindGpus, "finding GPUs"},                       // start_pools.cc
           {&Daemon::StartUcx, "starting UCX"},                       // start_paths.cc
           {&Daemon::MakePools, "setting up memory pools"},           // start_pools.cc
           {&Daemon::StartUcxLanes, "starting UCX lanes"},            // start_paths.cc
           {&Daemon::ShareDevicePools, "sharing device pools"},       // start_pools.cc
           {&Daemon::MakeRegistry, "making the buffer registry"},     // start_pools.cc
           {&Daemon::DescribeSelf, "registering pools for peers"},    // start_cluster.cc
           {&Daemon::JoinCluster, "joining the cluster"},             // start_cluster.cc
           {&Daemon::MakeEngines, "starting the paths"},              // start_paths.cc
           {&Daemon::StartMetrics, "starting metrics"},               // start_metrics.cc
           {&Daemon::MakeScheduler, "starting the scheduler"},        // start_services.cc
           {&Daemon::MakeServices, "starting the services"},          // start_services.cc
           {&Daemon::Serve, "starting the server"},                   // start_server.cc
           {&Daemon::Advertise, "advertising this node"},             // start_cluster.cc
       }) {
    if (d->starting_ != nullptr) d->starting_->SetStep(doing);
    const absl::Time begun = absl::Now();
    if (absl::Status st = (d.get()->*step)(options); !st.ok()) return st;
    if (absl::Now() - begun > absl::Seconds(1)) {
      LOG(INFO) << "starting: " << doing << " took " << absl::FormatDuration(absl::Now() - begun);
    }
  }
  LOG(INFO) << "started in " << absl::FormatDuration(absl::Now() - started);
  return d;
}

Daemon::~Daemon() {
  // The metrics' refresher reads the scheduler, which goes first.
  if (metrics_ != nullptr) metrics_->StopRefreshing();
  // Peer calls stop before the services they run on go.
  if (peer_calls_ != nullptr) peer_calls_->StopServing();
  if (listeners_ != nullptr) listeners_->Stop();
  if (starting_ != nullptr) starting_->Stop();  // Start failed before serving.
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
