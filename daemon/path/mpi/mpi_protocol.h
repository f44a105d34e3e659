// Path MPI's part of the hold handshake: a push may ask the holder to start its receiving
// half with the hold (saving the runner a round trip), and the runner learns the holder's
// rank in the MPI job both nodes are ranks of; the runner starts and stops the holder's
// half of a move.
#ifndef GPUMOVE_DAEMON_PATH_MPI_PROTOCOL_H_
#define GPUMOVE_DAEMON_PATH_MPI_PROTOCOL_H_

#include <cstdint>
#include <vector>

#include "daemon/common/segment.h"
#include "daemon/path/mpi/mpi_hello.h"
#include "daemon/peer/path_codec.h"
#include "daemon/peer/remote_ranges.h"

namespace gpumove {

// A push's ask, or a vectored move's: the holder starts its half with the hold, under
// `tag`, in `chunk`-byte messages; a vectored move's (`piece_count` pieces, which come as
// the move's first message) only where the holder says it can.
struct MpiAsk : PathAsk {
  int tag = 0;
  uint64_t chunk = 0;
  uint64_t piece_count = 0;
  uint64_t list_key = 0;  // MpiAsk.list_key (0: none).
};

// How the runner reaches the holder over MPI.
struct MpiOffer : PathOffer {
  int rank = -1;  // The holder's rank in the job both nodes are ranks of.
  // The tag and chunk the holder's half started under with the hold (0: it did not).
  int started_tag = 0;
  uint64_t started_chunk = 0;
  // The started vectored half has its pieces already (kept from an earlier move).
  bool list_known = false;
};

// Offers path MPI when both nodes are ranks of one MPI job.
class MpiCodec : public PathCodec {
 public:
  // `self`: this node's part of Hello (null: it is no rank), which must outlive this.
  explicit MpiCodec(const MpiHello* self) : self_(self) {}
  void EncodeAsk(const PathAsk& ask, const PeerView& holder,
                 peer::v1::PrepareRemoteRequest* request) const override;
  void DecodeOffer(const PeerView& holder, const RemoteAsk& ask,
                   const peer::v1::PrepareRemoteResponse& response,
                   RemoteHold* hold) const override;

 private:
  const MpiHello* const self_;
};

// Path MPI's own peer calls (PathCall), as its holder registers them (mpi_calls.h) and
// the runner makes them.
inline constexpr char kMpiCalls[] = "mpi";
inline constexpr char kStartMpiCall[] = "start_mpi";
inline constexpr char kStopMpiCall[] = "stop_mpi";

// Runner: has the holder start its half of the move, sending the held range to our rank
// (`from_rank`; `send`, a pull) or receiving it, under `tag` in `chunk`-byte messages. Returns once
// its first receives are posted. A vectored move gives the count of the holder's pieces,
// which the runner sends next as an MPI message (MpiEngine::SendPieceList).
absl::Status StartMpi(ClusterRemoteRanges& remote, const RemoteHold& hold, int from_rank, int tag,
                      uint64_t chunk, bool send, uint64_t piece_count = 0);
// Runner: asks the holder, the sender of a pull, to stop after the chunks in flight (a
// cancel).
absl::Status StopMpi(ClusterRemoteRanges& remote, const RemoteHold& hold);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_MPI_PROTOCOL_H_
