// Peer calls a test makes by hand over a PeerService stub, in the forms the moving side
// sends: one hold or acknowledgement as a batch of one (the item's outcome is the call's).
#ifndef GPUMOVE_TESTS_UTIL_PEER_CALLS_H_
#define GPUMOVE_TESTS_UTIL_PEER_CALLS_H_

#include <grpcpp/grpcpp.h>

#include "proto/gpumove/peer/v1/peer.grpc.pb.h"

namespace gpumove {

inline peer::v1::PrepareRemoteBatchRequest BatchOf(const peer::v1::PrepareRemoteRequest& item) {
  peer::v1::PrepareRemoteBatchRequest batch;
  *batch.add_items() = item;
  return batch;
}

inline peer::v1::CompleteRemoteBatchRequest BatchOf(const peer::v1::CompleteRemoteRequest& item) {
  peer::v1::CompleteRemoteBatchRequest batch;
  *batch.add_items() = item;
  return batch;
}

// The call's status when it failed, else its one item's.
inline grpc::Status PrepareOne(peer::v1::PeerService::Stub& stub, grpc::ClientContext* context,
                               const peer::v1::PrepareRemoteRequest& request,
                               peer::v1::PrepareRemoteResponse* response) {
  peer::v1::PrepareRemoteBatchResponse batch;
  grpc::Status st = stub.PrepareRemoteBatch(context, BatchOf(request), &batch);
  if (!st.ok()) return st;
  if (batch.results_size() != 1) return grpc::Status(grpc::StatusCode::INTERNAL, "not one result");
  const peer::v1::PrepareRemoteResult& r = batch.results(0);
  *response = r.response();
  return grpc::Status(static_cast<grpc::StatusCode>(r.code()), r.message());
}

inline grpc::Status CompleteOne(peer::v1::PeerService::Stub& stub, grpc::ClientContext* context,
                                const peer::v1::CompleteRemoteRequest& request,
                                peer::v1::CompleteRemoteResponse* response) {
  peer::v1::CompleteRemoteBatchResponse batch;
  grpc::Status st = stub.CompleteRemoteBatch(context, BatchOf(request), &batch);
  if (!st.ok()) return st;
  if (batch.results_size() != 1) return grpc::Status(grpc::StatusCode::INTERNAL, "not one result");
  const peer::v1::CompleteRemoteResult& r = batch.results(0);
  response->set_xxh3(r.xxh3());
  return grpc::Status(static_cast<grpc::StatusCode>(r.code()), r.message());
}

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_PEER_CALLS_H_
