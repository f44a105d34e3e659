// MpiEngine's control messages of a move: the other node's piece list (the move's first
// message) and the go a sending half with known pieces waits for.
#include <bit>

#include "absl/strings/str_cat.h"
#include "daemon/path/mpi/mpi_engine.h"
#include "daemon/path/mpi/mpi_sender_stopped.h"

namespace gpumove {

absl::Status MpiEngine::SendPieceList(const std::vector<uint64_t>& list, int peer, int tag) {
  auto r = mpi_->Wait(mpi_->Isend(list.data(), list.size() * sizeof(uint64_t), peer, tag));
  return r.status();
}

absl::Status MpiEngine::SendGo(int peer, int tag) {
  const uint64_t go = kGo;
  return mpi_->Wait(mpi_->Isend(&go, sizeof(go), peer, tag)).status();
}

absl::Status MpiEngine::ReceiveGo(int peer, int tag, bool patient,
                                  const std::function<void()>& posted) {
  uint64_t go = 0;
  auto op = mpi_->Irecv(&go, sizeof(go), peer, tag, patient);
  posted();
  auto r = mpi_->Wait(op);
  if (!r.ok()) return r.status();
  if (*r == 0) return absl::AbortedError(kSenderStopped);
  if (*r != sizeof(go) || go != kGo) {
    return absl::InvalidArgumentError(absl::StrCat("the go came as ", *r, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const std::vector<Segment>>> MpiEngine::ReceivePieceList(
    int peer, int tag, uint64_t count, uint64_t range, const std::function<void()>& posted,
    uint64_t* total, bool patient) {
  static_assert(std::endian::native == std::endian::little,
                "the list's integers are little-endian");
  std::vector<uint64_t> raw(2 * count);
  const uint64_t bytes = raw.size() * sizeof(uint64_t);
  auto op = mpi_->Irecv(raw.data(), bytes, peer, tag, patient);
  posted();
  auto r = mpi_->Wait(op);
  if (!r.ok()) return r.status();
  // An empty message: the move will not run (Abandon).
  if (*r == 0) return absl::AbortedError(kSenderStopped);
  if (*r != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the piece list came as ", *r, " bytes; ", count, " pieces are ", bytes));
  }
  auto pieces = std::make_shared<std::vector<Segment>>(count);
  Segment* out = pieces->data();
  for (uint64_t i = 0; i < count; ++i) out[i] = Segment{raw[2 * i], raw[2 * i], raw[2 * i + 1]};
  // Untrusted: every piece must lie in the range held.
  auto sum = CheckPiecesIn(*pieces, range, kMaxHalfPieces);
  if (!sum.ok()) return sum.status();
  *total = *sum;
  return pieces;
}

}  // namespace gpumove
