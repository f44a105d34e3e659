// RMA put/get: a move in slices with a window in flight, flushed, on the progress thread.
#include <ucp/api/ucp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"
#include "daemon/path/ucx/ucx_transport_impl.h"

namespace gpumove {
namespace {

// Bytes per put/get of a move to or from `remote`.
uint64_t ChunkFor(const UcxOptions& options, const RemoteRange& remote) {
  return remote.device ? std::max(options.chunk, options.device_chunk) : options.chunk;
}

}  // namespace

using ucx_internal::UcxError;

void UcxTransport::Impl::Fail(Op& op, Peer* peer, absl::Status status) {
  if (!op.status.ok()) return;
  op.status = std::move(status);
  op.failed_at = absl::Now();
  // Outstanding requests still point at local memory: force the endpoint closed so they
  // complete (with errors) before the caller may reuse it.
  if (peer != nullptr && !op.requests.empty()) ClosePeer(peer, std::string(op.status.message()));
  for (auto& [req, n] : op.requests) ucp_request_cancel(worker, req);
}

bool UcxTransport::Impl::GiveUp(const Op& op) {
  if (absl::Now() - op.failed_at < absl::Seconds(1)) return false;
  LOG(WARNING) << "abandoning " << op.requests.size() << " UCX request(s) to a failed peer";
  return true;
}

void UcxTransport::Impl::ReapRequests(Op& op, Peer* peer) {
  for (auto it = op.requests.begin(); it != op.requests.end();) {
    ucs_status_t st = ucp_request_check_status(it->first);
    if (st == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    ucp_request_free(it->first);
    if (st != UCS_OK) {
      Fail(op, peer,
           UcxError(st, it->second == 0 ? "ucp_ep_flush_nbx"
                                        : (op.put ? "ucp_put_nbx" : "ucp_get_nbx")));
    } else {
      op.done += it->second;
      op.last_progress = absl::Now();
    }
    it = op.requests.erase(it);
  }
}

bool UcxTransport::Impl::Advance(Op& op) {
  if (!op.status.ok()) {
    // Failed (Forget, timeout, error): only its requests' ends are awaited.
    ReapRequests(op, nullptr);
    return op.requests.empty() || GiveUp(op);
  }
  Peer* peer = GetPeer(op.remote);
  if (op.generation < peer->generation) {
    Fail(op, nullptr, absl::UnavailableError("peer restarted or down during the move"));
    return op.requests.empty();
  }
  if (peer->failed && op.status.ok()) Fail(op, peer, absl::UnavailableError(peer->error));
  if (op.abandon && op.status.ok()) {
    Fail(op, peer, absl::UnavailableError("move abandoned after a timeout"));
  }
  ReapRequests(op, peer);
  if (!op.status.ok()) return op.requests.empty() || GiveUp(op);
  ucp_rkey_h rkey = nullptr;
  if (!op.flush) {
    auto found = peer->rkeys.find(op.remote.rkey);
    if (found == peer->rkeys.end()) {
      ucs_status_t st = ucp_ep_rkey_unpack(peer->ep, op.remote.rkey.data(), &rkey);
      if (st != UCS_OK) {
        Fail(op, peer, UcxError(st, "ucp_ep_rkey_unpack"));
        return op.requests.empty();
      }
      peer->rkeys.emplace(op.remote.rkey, rkey);
    } else {
      rkey = found->second;
    }
  }
  if (op.flush) {
    if (!op.flush_posted) {
      ucp_request_param_t param = {};
      void* req = ucp_ep_flush_nbx(peer->ep, &param);
      op.flush_posted = true;
      if (UCS_PTR_IS_ERR(req)) {
        Fail(op, peer, UcxError(UCS_PTR_STATUS(req), "ucp_ep_flush_nbx"));
        return true;
      }
      if (req == nullptr) return true;
      op.requests.emplace_back(req, 0);
    }
    return op.requests.empty() && op.flush_posted;
  }
  // Chunks of the range, or of the op's pieces in turn, while the window has room.
  auto more = [&] {
    return op.pieces != nullptr ? op.piece < op.piece_end : op.posted < op.length;
  };
  while (more() && op.requests.size() < static_cast<size_t>(options.window)) {
    uint64_t local = op.posted, remote = op.posted, n = 0;
    if (op.pieces != nullptr) {
      const Segment& p = op.pieces[op.piece];
      local = (op.put ? p.src : p.dst) + op.in_piece;
      remote = (op.put ? p.dst : p.src) + op.in_piece;
      n = std::min(ChunkFor(options, op.remote), p.length - op.in_piece);
      op.in_piece += n;
      if (op.in_piece == p.length) {
        ++op.piece;
        op.in_piece = 0;
      }
    } else {
      n = std::min(ChunkFor(options, op.remote), op.length - op.posted);
    }
    ucp_request_param_t param = {};
    void* req =
        op.put
            ? ucp_put_nbx(peer->ep, op.local + local, n, op.remote.address + remote, rkey, &param)
            : ucp_get_nbx(peer->ep, op.local + local, n, op.remote.address + remote, rkey, &param);
    op.posted += n;
    if (req == nullptr) {
      op.done += n;
      op.last_progress = absl::Now();
    } else if (UCS_PTR_IS_ERR(req)) {
      Fail(op, peer, UcxError(UCS_PTR_STATUS(req), op.put ? "ucp_put_nbx" : "ucp_get_nbx"));
      return op.requests.empty();
    } else {
      op.requests.emplace_back(req, n);
    }
  }
  if (op.flush_after && !more() && !op.flush_posted) {
    // Everything is posted: the flush completes once all of it is visible at the peer.
    ucp_request_param_t param = {};
    void* req = ucp_ep_flush_nbx(peer->ep, &param);
    op.flush_posted = true;
    if (UCS_PTR_IS_ERR(req)) {
      Fail(op, peer, UcxError(UCS_PTR_STATUS(req), "ucp_ep_flush_nbx"));
      return op.requests.empty();
    }
    if (req != nullptr) op.requests.emplace_back(req, 0);
  }
  if (absl::Now() - op.last_progress > options.op_timeout) {
    Fail(op, peer,
         absl::UnavailableError(absl::StrCat("no progress from the peer for ",
                                             absl::FormatDuration(options.op_timeout))));
    return op.requests.empty();
  }
  return op.done == op.length && op.requests.empty();
}

absl::Status UcxTransport::Rma(bool put, const RemoteRange& remote, void* local, uint64_t length,
                               const std::function<bool(uint64_t)>& progress) {
  if (impl_->options.direct) {
    if (std::shared_ptr<Impl::Direct> d = impl_->AcquireDirect(remote); d != nullptr) {
      absl::Status st = CopyDirect(put, remote, reinterpret_cast<char*>(remote.address + d->delta),
                                   static_cast<char*>(local), length, progress);
      impl_->ReleaseDirect(d);
      return st;
    }
  }
  // The move is cut into slices that the caller waits for one at a time (with the next
  // already posted), so progress, rate limits and cancel act between slices.
  const uint64_t chunk = ChunkFor(impl_->options, remote);
  const uint64_t slice = std::max<uint64_t>(chunk * impl_->options.window / 2, chunk);
  const uint64_t generation = impl_->Generation(remote.peer_key);
  return impl_->RunOps(
      put, remote, generation, length,
      [&](const Impl::Op* prev) -> std::shared_ptr<Impl::Op> {
        const uint64_t offset =
            prev == nullptr ? 0 : prev->remote.address - remote.address + prev->length;
        if (prev != nullptr && offset >= length) return nullptr;
        auto op = std::make_shared<Impl::Op>();
        op->generation = generation;
        op->put = put;
        op->remote = remote;
        op->remote.address += offset;
        op->local = static_cast<char*>(local) + offset;
        op->length = std::min(slice, length - offset);
        op->flush_after = put && offset + op->length >= length;
        return op;
      },
      progress);
}

absl::Status UcxTransport::Impl::RunOps(
    bool put, const RemoteRange& remote, uint64_t generation, uint64_t total,
    const std::function<std::shared_ptr<Op>(const Op* prev)>& next_op,
    const std::function<bool(uint64_t)>& progress) {
  auto post = [&](std::shared_ptr<Op> op) {
    if (op == nullptr) return op;
    op->last_progress = absl::Now();
    Post([this, op] { active.push_back(op); });
    return op;
  };
  auto wait = [&](Op& op) -> absl::Status {
    // The progress thread enforces op_timeout; this bound only guards against a stuck
    // thread, with room for it to fail the op first.
    if (!op.finished.WaitForNotificationWithTimeout(options.op_timeout + absl::Seconds(5))) {
      op.abandon = true;
      op.finished.WaitForNotification();
    }
    return op.status;
  };
  uint64_t done = 0;
  std::shared_ptr<Op> current = post(next_op(nullptr));
  bool stopped = false;
  bool flushed = false;  // The last op waited for flushed everything before it.
  while (current != nullptr) {
    std::shared_ptr<Op> next;
    if (!stopped) next = post(next_op(current.get()));
    absl::Status st = wait(*current);
    if (!st.ok()) {
      if (next != nullptr) wait(*next).IgnoreError();
      return st;
    }
    flushed = current->flush_after;
    done += current->length;
    if (progress && !progress(done) && done < total) stopped = true;
    if (stopped && next != nullptr) {
      GPUMOVE_RETURN_IF_ERROR(wait(*next));
      done += next->length;
      flushed = next->flush_after;
      next = nullptr;
    }
    current = next;
  }
  if (put && !flushed) {
    // Puts complete locally before they land; the flush makes them visible remotely
    // (the last op did it already unless the move stopped early).
    auto flush = std::make_shared<Op>();
    flush->generation = generation;
    flush->put = true;
    flush->flush = true;
    flush->remote = remote;
    GPUMOVE_RETURN_IF_ERROR(wait(*post(flush)));
  }
  if (stopped && done < total) return absl::CancelledError("cancelled");
  return absl::OkStatus();
}

absl::Status UcxTransport::RmaPieces(bool put, const RemoteRange& remote, char* local,
                                     const Segments& pieces,
                                     const std::function<bool(uint64_t)>& progress) {
  const std::vector<Segment>& list = pieces.list;
  const uint64_t chunk = ChunkFor(impl_->options, remote);
  const uint64_t slice = std::max<uint64_t>(chunk * impl_->options.window / 2, chunk);
  if (impl_->options.direct) {
    if (std::shared_ptr<Impl::Direct> d = impl_->AcquireDirect(remote); d != nullptr) {
      // A plain copy per piece through the mapping of the peer's pool.
      char* mapped = reinterpret_cast<char*>(remote.address + d->delta);
      const uint64_t generation = impl_->Generation(remote.peer_key);
      const int direct_threads = DirectCopyThreads(impl_->options, remote);
      const int threads =
          remote.staged ? direct_threads : std::max(direct_threads, impl_->options.piece_threads);
      absl::Status st;
      uint64_t done = 0;
      // Rounds of about 16 MiB per thread, split over the threads at piece boundaries.
      const uint64_t round = std::max<uint64_t>(slice, uint64_t{16} << 20) * threads;
      for (size_t begin = 0; begin < list.size() && st.ok();) {
        uint64_t bytes = 0;
        const size_t end = RoundEnd(list, begin, round, &bytes);
        if (put) {
          CopyPieces(mapped, local, list, begin, end, bytes, threads);
        } else {
          CopyPieces(local, mapped, list, begin, end, bytes, threads);
        }
        done += bytes;
        impl_->direct_bytes += bytes;
        begin = end;
        if (impl_->Generation(remote.peer_key) != generation) {
          st = absl::UnavailableError("peer restarted or down during the move");
        } else if (progress && !progress(done) && begin < list.size()) {
          st = absl::CancelledError("cancelled");
        }
      }
      impl_->ReleaseDirect(d);
      return st;
    }
  }
  const uint64_t generation = impl_->Generation(remote.peer_key);
  // Slices of whole pieces, about `slice` bytes each (at least one piece).
  return impl_->RunOps(
      put, remote, generation, pieces.total,
      [&](const Impl::Op* prev) -> std::shared_ptr<Impl::Op> {
        const size_t begin = prev == nullptr ? 0 : prev->piece_end;
        if (begin >= list.size()) return nullptr;
        auto op = std::make_shared<Impl::Op>();
        op->generation = generation;
        op->put = put;
        op->remote = remote;
        op->local = local;
        op->pieces = list.data();
        op->piece = begin;
        op->piece_end = RoundEnd(list, begin, slice, &op->length);
        op->flush_after = put && op->piece_end >= list.size();
        return op;
      },
      progress);
}

absl::Status UcxTransport::PutPieces(const RemoteRange& remote, const void* local,
                                     const Segments& pieces,
                                     const std::function<bool(uint64_t)>& progress) {
  return RmaPieces(true, remote, static_cast<char*>(const_cast<void*>(local)), pieces, progress);
}

absl::Status UcxTransport::GetPieces(const RemoteRange& remote, void* local, const Segments& pieces,
                                     const std::function<bool(uint64_t)>& progress) {
  return RmaPieces(false, remote, static_cast<char*>(local), pieces, progress);
}

absl::Status UcxTransport::Put(const RemoteRange& remote, const void* local, uint64_t length,
                               const std::function<bool(uint64_t)>& progress) {
  return Rma(true, remote, const_cast<void*>(local), length, progress);
}

absl::Status UcxTransport::Get(const RemoteRange& remote, void* local, uint64_t length,
                               const std::function<bool(uint64_t)>& progress) {
  return Rma(false, remote, local, length, progress);
}

}  // namespace gpumove
