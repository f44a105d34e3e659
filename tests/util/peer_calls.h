// Peer calls a test makes by hand over a PeerService stub, in the forms the moving side
// sends: one hold or acknowledgement as a batch of one (the item's outcome is the call's),
// and a path's own call with the path's message as its body.
#ifndef GPUMOVE_TESTS_UTIL_PEER_CALLS_H_
#define GPUMOVE_TESTS_UTIL_PEER_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <string>

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

inline peer::v1::PathCallRequest PathCallOf(const std::string& path, const std::string& method,
                                            const std::string& from_node, uint64_t from_incarnation,
                                            const google::protobuf::Message& body) {
  peer::v1::PathCallRequest call;
  call.set_path(path);
  call.set_method(method);
  call.set_from_node(from_node);
  call.set_from_incarnation(from_incarnation);
  call.set_body(body.SerializeAsString());
  return call;
}

// `path`'s `method` called as `from_node` at `from_incarnation`; `response` parsed from
// the answer.
inline grpc::Status CallPath(peer::v1::PeerService::Stub& stub, grpc::ClientContext* context,
                             const std::string& path, const std::string& method,
                             const std::string& from_node, uint64_t from_incarnation,
                             const google::protobuf::Message& request,
                             google::protobuf::Message* response) {
  peer::v1::PathCallResponse answer;
  grpc::Status st = stub.PathCall(
      context, PathCallOf(path, method, from_node, from_incarnation, request), &answer);
  if (st.ok() && !response->ParseFromString(answer.body())) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "malformed path call answer");
  }
  return st;
}

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_PEER_CALLS_H_
