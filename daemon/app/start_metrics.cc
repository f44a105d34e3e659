// Start's step that serves Prometheus metrics: the pools', cluster's and transfers' own, and
// the counters of UCX, host copies, GPU piece copies, staging holds and peer calls.
#include "daemon/app/daemon.h"
#include "daemon/common/host_copy.h"
#include "daemon/common/log.h"

namespace gpumove {

absl::Status Daemon::StartMetrics(const DaemonOptions& options) {
  if (!options.serve.metrics_listen.empty()) {
    auto metrics = Metrics::Start(options.serve.metrics_listen, pools_.get(), cluster_.get());
    if (!metrics.ok()) return metrics.status();
    metrics_ = *std::move(metrics);
    LOG(INFO) << "metrics on http://" << metrics_->address() << "/metrics";
    if (ucx_ != nullptr) {
      UcxTransport* ucx = ucx_.get();
      metrics_->AddTotal("ucx_direct_bytes_total",
                         "Bytes of UCX moves copied directly through shared memory with "
                         "daemons on this host.",
                         [ucx] { return ucx->direct_bytes(); });
      UcxEngine* engine = ucx_engine_.get();
      metrics_->AddTotal("ucx_lane_bytes_total",
                         "Bytes of UCX moves carried by lanes besides the first.",
                         [engine] { return engine->lane_bytes(); });
      metrics_->AddTotal("ucx_lane_failovers_total",
                         "Lanes that failed under a UCX move's share: the share was sent "
                         "again on another lane (or the move failed with none left).",
                         [engine] { return engine->lane_failovers(); });
      metrics_->AddTotal("ucx_lane_resent_bytes_total",
                         "Bytes of UCX moves sent again on another lane after theirs failed.",
                         [engine] { return engine->lane_resent_bytes(); });
      metrics_->AddGauge("ucx_lanes_down",
                         "Lanes left out of moves to a peer after failing toward it (each "
                         "tried again after a backoff of 1 s doubling to 60 s), counted per "
                         "peer and lane.",
                         [engine] { return static_cast<double>(engine->lanes_down()); });
    }
    metrics_->AddTotal("host_copy_streamed_bytes_total",
                       "Bytes copied between host buffers with streaming stores (big "
                       "copies, and staged pieces' copies to and from bounce slots).",
                       [] { return StreamedCopyBytes(); });
    metrics_->AddTotal("host_copy_helper_bytes_total",
                       "Bytes of host copies split over threads that helper threads copied "
                       "(see --direct_copy_threads, --staged_copy_threads).",
                       [] { return HelperCopyBytes(); });
    GpuRuntime* gpu = gpu_.get();
    metrics_->AddTotal("gpu_pieces_copied_one_by_one_total",
                       "Pieces of vectored moves with GPU memory copied one call each, no "
                       "gather kernel reaching both ends (pageable host memory, GPUs "
                       "without peer access): slow for small pieces.",
                       [gpu] { return gpu->pieces_copied_one_by_one(); });
    StageHolder* stage = stage_holder_.get();
    metrics_->AddTotal("staging_holds_deferred_total",
                       "Ranges held for staged moves while the pinned pool had no room for "
                       "their bounce slots (taken when the move ran): a pinned pool small "
                       "for the load.",
                       [stage] { return stage != nullptr ? stage->deferred() : 0; });
    if (remote_ranges_ != nullptr) remote_ranges_->set_observer(metrics_.get());
    if (ucx_engine_ != nullptr) {
      UcxEngine* ucx = ucx_engine_.get();
      metrics_->AddTotal("ucx_fallback_moves_total",
                         "UCX moves to nodes on other hosts that ran without RDMA although "
                         "this host has RDMA devices (UCX chose TCP or another transport: "
                         "see each transfer's transport). Anything above zero on an RDMA "
                         "cluster is a misconfiguration running slow.",
                         [ucx] { return ucx->fallbacks(); });
      metrics_->AddTotal("ucx_required_refusals_total",
                         "UCX moves refused because UCX would not carry them over the "
                         "transport class --ucx_require names.",
                         [ucx] { return ucx->refused(); });
    }

    if (peer_calls_ != nullptr) {
      UcxPeerCalls* calls = peer_calls_.get();
      metrics_->AddTotal("ucx_peer_calls_served_total",
                         "Peer calls (holds, acknowledgements, staging and MPI steps) this "
                         "node served as UCX active messages.",
                         [calls] { return calls->served(); });
      UcxTransport* ucx = ucx_.get();
      metrics_->AddTotal("ucx_peer_calls_refused_total",
                         "Active messages on the UCX call channel dropped unanswered: not "
                         "stamped with the cluster's secret, from a node this one has not "
                         "met, or malformed. Anything above zero is a misconfigured peer or "
                         "someone probing the UCX port.",
                         [calls, ucx] { return calls->refused() + ucx->calls_dropped(); });
    }
  }
  return absl::OkStatus();
}

}  // namespace gpumove
