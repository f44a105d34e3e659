#include "daemon/path/mpi/mpi_protocol.h"

#include <memory>

namespace gpumove {

void MpiCodec::EncodeAsk(const PathAsk& ask, const PeerView& holder,
                         peer::v1::PrepareRemoteRequest* request) const {
  const auto* mpi = dynamic_cast<const MpiAsk*>(&ask);
  if (self_ == nullptr || mpi == nullptr || mpi->tag == 0) return;
  peer::v1::MpiAsk* out = request->mutable_mpi();
  out->set_from_rank(self_->self().rank);
  out->set_tag(mpi->tag);
  out->set_chunk(mpi->chunk);
  out->set_piece_count(mpi->piece_count);
  if (mpi->piece_count > 0) out->set_list_key(mpi->list_key);
}

void MpiCodec::DecodeOffer(const PeerView& holder, const RemoteAsk& ask,
                           const peer::v1::PrepareRemoteResponse& response,
                           RemoteHold* hold) const {
  if (self_ == nullptr || !self_->SameJob(holder)) return;
  auto offer = std::make_shared<MpiOffer>();
  offer->rank = MpiViewOf(holder)->rank;
  const auto* asked = dynamic_cast<const MpiAsk*>(ask.path_ask.get());
  if (asked != nullptr && response.has_mpi() && response.mpi().started()) {
    offer->started_tag = asked->tag;
    offer->started_chunk = asked->chunk;
    offer->list_known = asked->piece_count > 0 && response.mpi().list_known();
  }
  hold->offers.push_back(std::move(offer));
}

absl::Status StartMpi(ClusterRemoteRanges& remote, const RemoteHold& hold, int from_rank, int tag,
                      uint64_t chunk, bool send, uint64_t piece_count) {
  peer::v1::StartMpiRequest request;
  request.set_transfer_id(hold.transfer_id);
  request.set_from_rank(from_rank);
  request.set_tag(tag);
  request.set_chunk(chunk);
  request.set_send(send);
  request.set_piece_count(piece_count);
  peer::v1::StartMpiResponse response;
  return remote.CallPath(hold, kMpiCalls, kStartMpiCall, request, &response);
}

absl::Status StopMpi(ClusterRemoteRanges& remote, const RemoteHold& hold) {
  peer::v1::StopMpiRequest request;
  request.set_transfer_id(hold.transfer_id);
  peer::v1::StopMpiResponse response;
  return remote.CallPath(hold, kMpiCalls, kStopMpiCall, request, &response);
}

}  // namespace gpumove
