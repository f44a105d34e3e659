#include "daemon/path/mpi/mpi_holder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/peer/piece_list.h"

namespace gpumove {

absl::Status MpiPart::End(bool runner_ok) {
  std::unique_ptr<PassiveHalf> half;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;  // A StartMpi arriving now finds no hold to start.
    half = std::move(half_);
  }
  if (half == nullptr) return absl::OkStatus();
  if (!runner_ok) half->Stop();
  absl::Status st = half->Wait(absl::Now() + wait_);
  if (!st.ok() && runner_ok) {
    return absl::Status(st.code(), absl::StrCat("this node's half of the move: ", st.message()));
  }
  return absl::OkStatus();
}

bool MpiPart::EndBlocks() const {
  absl::MutexLock lock(&mu_);
  return half_ != nullptr;
}

absl::StatusOr<std::unique_ptr<HoldPart>> MpiHolder::Offer(
    const HoldContext& context, const BufferUse& range, peer::v1::PrepareRemoteResponse* response) {
  auto part = std::make_unique<MpiPart>(half_wait_);
  const peer::v1::PrepareRemoteRequest& r = context.request;
  if (r.mpi().tag() == 0 ||
      engine_->StagesRange(Endpoint{range.data(), range.kind(), range.device()})) {
    return part;
  }
  // A vectored move's half waits for its pieces (the move's first message) and then sends
  // (the range is the source) or receives them; a whole range's only receives.
  const bool vectored = r.mpi().piece_count() > 0;
  if (!r.write() && !vectored) {
    return absl::InvalidArgumentError(
        "an MPI half starts with the hold only for a push or a vectored move");
  }
  peer::v1::StartMpiRequest start;
  start.set_transfer_id(r.transfer_id());
  start.set_from_rank(r.mpi().from_rank());
  start.set_tag(r.mpi().tag());
  start.set_chunk(r.mpi().chunk());
  start.set_send(!r.write());
  start.set_piece_count(r.mpi().piece_count());
  // A list the runner keeps: this half's pieces may be kept here from a move before.
  std::string key;
  std::optional<MpiEngine::KnownPieces> known;
  if (vectored && r.mpi().list_key() != 0) {
    key = absl::StrCat(r.from_node(), "/", r.from_incarnation(), "/", r.mpi().list_key(),
                       r.write() ? "/w" : "/r");
    known = FindList(key);
    // Kept for another range's length (a move over a shorter range): read again.
    if (known.has_value() &&
        (known->end > range.length() || known->pieces->size() != r.mpi().piece_count())) {
      known.reset();
    }
  }
  // Patient: the runner's move may sit in its queue for a while before it sends.
  if (known.has_value()) start.set_piece_count(0);
  if (absl::Status st = StartOn(*part, range, r.from_node(), start, /*patient=*/true,
                                known.has_value() ? &*known : nullptr, known ? "" : key);
      !st.ok()) {
    return st;
  }
  response->mutable_mpi()->set_started(true);
  response->mutable_mpi()->set_list_known(known.has_value());
  return part;
}

std::optional<MpiEngine::KnownPieces> MpiHolder::FindList(const std::string& key) {
  absl::MutexLock lock(&lists_mu_);
  for (auto it = lists_.begin(); it != lists_.end(); ++it) {
    if (it->first == key) {
      lists_.splice(lists_.end(), lists_, it);  // Most recently used last.
      return lists_.back().second;
    }
  }
  return std::nullopt;
}

void MpiHolder::KeepList(const std::string& key, const MpiEngine::KnownPieces& list) {
  const uint64_t bytes = list.pieces->size() * sizeof(Segment);
  if (bytes > kKeptListBytes) return;
  absl::MutexLock lock(&lists_mu_);
  uint64_t kept = bytes;
  for (auto it = lists_.begin(); it != lists_.end();) {
    if (it->first == key) {
      it = lists_.erase(it);
    } else {
      kept += it->second.pieces->size() * sizeof(Segment);
      ++it;
    }
  }
  while (!lists_.empty() && (lists_.size() >= kKeptLists || kept > kKeptListBytes)) {
    kept -= lists_.front().second.pieces->size() * sizeof(Segment);
    lists_.pop_front();
  }
  lists_.emplace_back(key, list);
}

absl::Status MpiHolder::StartOn(MpiPart& part, const BufferUse& range, const std::string& from_node,
                                const peer::v1::StartMpiRequest& request, bool patient,
                                const MpiEngine::KnownPieces* known, std::string keep) {
  // The rank must be the one the runner's node announced in this job.
  auto runner = cluster_->Find(from_node);
  if (!runner.ok()) return runner.status();
  if (!self_->SameJob(*runner) || MpiViewOf(*runner)->rank != request.from_rank()) {
    return absl::FailedPreconditionError(absl::StrCat("node ", Quoted(from_node), " is not rank ",
                                                      request.from_rank(),
                                                      " of this node's MPI job"));
  }
  // Under the part's lock, so that the hold's end cannot pass between the check and the
  // start; starting only posts the first receives.
  absl::MutexLock lock(&part.mu_);
  if (part.ended_) {
    return absl::NotFoundError(
        absl::StrCat("the hold of transfer ", Quoted(request.transfer_id()), " has ended"));
  }
  if (part.half_ != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer ", Quoted(request.transfer_id()), " already started"));
  }
  const absl::Time began = absl::Now();
  // A vectored half's pieces come as the move's first message; StartPassive checks every
  // piece against the range.
  MpiEngine::OnPieceList on_list;
  if (!keep.empty()) {
    on_list = [this, keep = std::move(keep)](const MpiEngine::KnownPieces& list) {
      KeepList(keep, list);
    };
  }
  auto half =
      engine_->StartPassive(Endpoint{range.data(), range.kind(), range.device()}, range.length(),
                            request.from_rank(), request.tag(), request.chunk(), request.send(),
                            patient, request.piece_count(), known, std::move(on_list));
  VLOG(2) << "MPI half of transfer " << request.transfer_id() << " (" << request.piece_count()
          << " pieces to come) started in " << absl::ToDoubleMicroseconds(absl::Now() - began)
          << " us";
  if (!half.ok()) return half.status();
  part.half_ = *std::move(half);
  return absl::OkStatus();
}

absl::Status MpiHolder::Start(const HoldTable& holds, const std::string& from_node,
                              const peer::v1::StartMpiRequest& request) {
  auto hold = holds.Find(from_node, request.transfer_id());
  if (!hold.ok()) return hold.status();
  MpiPart* part = hold->part<MpiPart>();
  if (part == nullptr) return absl::FailedPreconditionError("this hold has no MPI half");
  return StartOn(*part, hold->range(), from_node, request, /*patient=*/false);
}

absl::Status MpiHolder::Stop(const HoldTable& holds, const std::string& from_node,
                             const peer::v1::StopMpiRequest& request) {
  auto hold = holds.Find(from_node, request.transfer_id());
  MpiPart* part = hold.ok() ? hold->part<MpiPart>() : nullptr;
  if (part != nullptr) {
    absl::MutexLock lock(&part->mu_);
    if (part->half_ != nullptr) {
      part->half_->Stop();
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "no running half for transfer ", Quoted(request.transfer_id()), " from ", Quoted(from_node)));
}

}  // namespace gpumove
