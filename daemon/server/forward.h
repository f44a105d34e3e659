// Calls forwarded to the node they belong to: the caller's deadline and cancellation
// carried over, no longer than the cluster's forward_timeout for calls that do not wait,
// and ended as UNAVAILABLE when that node is seen down while they run, so that a stopped
// or cut-off peer never holds a caller longer than --peer_timeout (plus a heartbeat).
#ifndef GPUMOVE_DAEMON_SERVER_FORWARD_H_
#define GPUMOVE_DAEMON_SERVER_FORWARD_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/cluster/cluster.h"
#include "daemon/common/quote.h"
#include "daemon/server/auth.h"

namespace gpumove {

// Set on a forwarded call: a node that would forward it again refuses instead (one hop:
// any node serves every node's buffers, so a second hop only ever means that the nodes
// disagree on where one is, or a peer's address points back at a node).
inline constexpr char kForwardedKey[] = "x-gpumove-forwarded";

// The cluster's forward_timeout; 10 s for a node without a cluster.
inline absl::Duration ForwardTimeout(const Cluster* cluster) {
  return cluster != nullptr ? cluster->forward_timeout() : absl::Seconds(10);
}

class ForwardedCall {
 public:
  // `bound`: how long the call may take at most (absl::InfiniteDuration() for one that
  // waits as long as its caller asks: Wait, Watch, a waiting Submit, byte streams).
  // The caller's credentials go along (`auth`'s Forward).
  ForwardedCall(const grpc::ServerContextBase& server, const Authenticator* auth, Cluster& cluster,
                std::string node, absl::Duration bound)
      : cluster_(cluster),
        node_(std::move(node)),
        client_(grpc::ClientContext::FromServerContext(server)) {
    grpc::ClientContext* c = client_.get();
    if (auth != nullptr) {
      auto peer = cluster_.Find(node_);
      auth->Forward(server, peer.ok() ? peer->descriptor.incarnation() : 0, c);
      // The node it goes to takes the caller this node asserts: ending the call when the
      // caller's credentials go is this node's to do.
      auth_ = auth;
      revocation_ = auth->WatchRevocation(&server, [this, c] {
        revoked_ = true;
        c->TryCancel();
      });
    }
    client_->AddMetadata(kForwardedKey, "1");
    if (bound != absl::InfiniteDuration()) {
      bound_deadline_ = absl::Now() + bound;
      if (bound_deadline_ < absl::FromChrono(server.deadline())) {
        client_->set_deadline(absl::ToChronoTime(bound_deadline_));
      } else {
        bound_deadline_ = absl::InfiniteFuture();  // The caller's own deadline is earlier.
      }
    }
    watch_ = cluster_.WatchLoss(node_, [this, c] {
      lost_ = true;
      c->TryCancel();
    });
  }
  ~ForwardedCall() {
    cluster_.Forget(watch_);
    if (auth_ != nullptr) auth_->Unwatch(revocation_);
  }
  ForwardedCall(const ForwardedCall&) = delete;
  ForwardedCall& operator=(const ForwardedCall&) = delete;

  grpc::ClientContext* context() { return client_.get(); }

  // The forwarded call's status, with the node's loss or silence told apart.
  grpc::Status Finish(const grpc::Status& st) const {
    if (st.ok()) return st;
    if (revoked_) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "credentials revoked while the call ran (on the node it was sent to)");
    }
    if (lost_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("node ", Quoted(node_), " went down during the call"));
    }
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && absl::Now() >= bound_deadline_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("node ", Quoted(node_), " did not answer within ",
                                       absl::FormatDuration(cluster_.forward_timeout())));
    }
    return st;
  }

 private:
  Cluster& cluster_;
  const std::string node_;
  std::unique_ptr<grpc::ClientContext> client_;
  absl::Time bound_deadline_ = absl::InfiniteFuture();
  std::atomic<bool> lost_{false};
  std::atomic<bool> revoked_{false};
  uint64_t watch_ = 0;
  const Authenticator* auth_ = nullptr;
  uint64_t revocation_ = 0;
};

// A stub of `Service` on `node`, a peer of node `self`, for the call of `context`;
// NOT_FOUND saying why when this node knows no such peer, UNAVAILABLE when the call was
// forwarded here already.
template <typename Service>
absl::StatusOr<std::unique_ptr<typename Service::Stub>> StubOn(
    const grpc::ServerContextBase& context, Cluster* cluster, const std::string& self,
    const std::string& node) {
  if (context.client_metadata().count(kForwardedKey) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "a call forwarded to node ", Quoted(self), " would be forwarded again, to node ",
        Quoted(node), ": the nodes disagree on where it is (or a peer's address points back)"));
  }
  if (cluster == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown node ", Quoted(node), " (this node is ",
                                            Quoted(self), " and has no peers)"));
  }
  auto peer = cluster->Find(node);
  if (!peer.ok()) return peer.status();
  return Service::NewStub(cluster->ChannelTo(peer->address));
}

// A unary call forwarded to `node` through `stub`, bounded by the cluster's
// forward_timeout unless `bound` says otherwise.
template <typename Stub, typename Request, typename Response>
grpc::Status ForwardUnary(
    Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    grpc::ServerContextBase* context, const Authenticator* auth, Cluster& cluster,
    const std::string& node, const Request& request, Response* response, absl::Duration bound) {
  ForwardedCall call(*context, auth, cluster, node, bound);
  return call.Finish((stub.*method)(call.context(), request, response));
}

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_FORWARD_H_
