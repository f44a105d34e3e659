// RMA put/get: a move in slices with a window in flight, flushed, on the progress thread.
#include <ucp/api/ucp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/host_copy.h"
#include "daemon/common/log.h"
#include "daemon/path/ucx/ucx_transport_impl.h"

namespace gpumove {

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
      Fail(op, peer, UcxError(st, op.put ? "ucp_put_nbx" : "ucp_get_nbx"));
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
  while (op.pieces != nullptr && op.piece < op.piece_end &&
         op.requests.size() < static_cast<size_t>(options.window)) {
    const Segment& p = op.pieces[op.piece];
    const uint64_t local = (op.put ? p.src : p.dst) + op.in_piece;
    const uint64_t remote = (op.put ? p.dst : p.src) + op.in_piece;
    const uint64_t n = std::min(options.chunk, p.length - op.in_piece);
    ucp_request_param_t param = {};
    void* req =
        op.put
            ? ucp_put_nbx(peer->ep, op.local + local, n, op.remote.address + remote, rkey, &param)
            : ucp_get_nbx(peer->ep, op.local + local, n, op.remote.address + remote, rkey, &param);
    op.posted += n;
    op.in_piece += n;
    if (op.in_piece == p.length) {
      ++op.piece;
      op.in_piece = 0;
    }
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
  while (op.pieces == nullptr && op.posted < op.length &&
         op.requests.size() < static_cast<size_t>(options.window)) {
    const uint64_t n = std::min(options.chunk, op.length - op.posted);
    ucp_request_param_t param = {};
    void* req = op.put ? ucp_put_nbx(peer->ep, op.local + op.posted, n,
                                     op.remote.address + op.posted, rkey, &param)
                       : ucp_get_nbx(peer->ep, op.local + op.posted, n,
                                     op.remote.address + op.posted, rkey, &param);
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
  const uint64_t slice =
      std::max<uint64_t>(impl_->options.chunk * impl_->options.window / 2, impl_->options.chunk);
  const uint64_t generation = impl_->Generation(remote.peer_key);
  auto start = [&](uint64_t offset, bool flush) {
    auto op = std::make_shared<Impl::Op>();
    op->generation = generation;
    op->put = put;
    op->flush = flush;
    op->remote = remote;
    op->remote.address += offset;
    op->local = static_cast<char*>(local) + offset;
    op->length = flush ? 0 : std::min(slice, length - offset);
    op->last_progress = absl::Now();
    impl_->Post([this, op] { impl_->active.push_back(op); });
    return op;
  };
  auto wait = [&](Impl::Op& op) -> absl::Status {
    // The progress thread enforces op_timeout; this bound only guards against a stuck
    // thread, with room for it to fail the op first.
    if (!op.finished.WaitForNotificationWithTimeout(impl_->options.op_timeout + absl::Seconds(5))) {
      op.abandon = true;
      op.finished.WaitForNotification();
    }
    return op.status;
  };
  uint64_t done = 0;
  std::shared_ptr<Impl::Op> current = start(0, false);
  bool stopped = false;
  while (current != nullptr) {
    const uint64_t next_offset = done + current->length;
    std::shared_ptr<Impl::Op> next;
    if (next_offset < length && !stopped) next = start(next_offset, false);
    absl::Status st = wait(*current);
    if (!st.ok()) {
      if (next != nullptr) wait(*next).IgnoreError();
      return st;
    }
    done = next_offset;
    if (progress && !progress(done) && done < length) stopped = true;
    if (stopped && next != nullptr) {
      if (absl::Status n = wait(*next); !n.ok()) return n;
      done += next->length;
      next = nullptr;
    }
    current = next;
  }
  if (put) {
    // Puts complete locally before they land; the flush makes them visible remotely.
    auto flush = start(0, true);
    if (absl::Status st = wait(*flush); !st.ok()) return st;
  }
  if (stopped && done < length) return absl::CancelledError("cancelled");
  return absl::OkStatus();
}

absl::Status UcxTransport::RmaPieces(bool put, const RemoteRange& remote, char* local,
                                     const Segments& pieces,
                                     const std::function<bool(uint64_t)>& progress) {
  const std::vector<Segment>& list = pieces.list;
  const uint64_t slice =
      std::max<uint64_t>(impl_->options.chunk * impl_->options.window / 2, impl_->options.chunk);
  if (impl_->options.direct) {
    if (std::shared_ptr<Impl::Direct> d = impl_->AcquireDirect(remote); d != nullptr) {
      // A plain copy per piece through the mapping of the peer's pool.
      char* mapped = reinterpret_cast<char*>(remote.address + d->delta);
      const uint64_t generation = impl_->Generation(remote.peer_key);
      const int threads = DirectCopyThreads(impl_->options, remote);
      absl::Status st;
      uint64_t done = 0;
      // Rounds of about 16 MiB per thread, split over the threads at piece boundaries.
      const uint64_t round = std::max<uint64_t>(slice, uint64_t{16} << 20) * threads;
      for (size_t begin = 0; begin < list.size() && st.ok();) {
        size_t end = begin;
        uint64_t bytes = 0;
        while (end < list.size() && (bytes == 0 || bytes + list[end].length <= round)) {
          bytes += list[end++].length;
        }
        const int parts = static_cast<int>(
            std::clamp<uint64_t>(bytes / kParallelCopyPart, 1, static_cast<uint64_t>(threads)));
        const std::vector<size_t> cut = CutPieces(list, begin, end, bytes, parts);
        RunCopyParts(parts, [&](int part) {
          for (size_t i = cut[part]; i < cut[part + 1]; ++i) {
            const Segment& p = list[i];
            if (put) {
              HostCopy(mapped + p.dst, local + p.src, p.length);
            } else {
              HostCopy(local + p.dst, mapped + p.src, p.length);
            }
          }
        });
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
  auto start = [&](size_t begin, bool flush) {
    auto op = std::make_shared<Impl::Op>();
    op->generation = generation;
    op->put = put;
    op->flush = flush;
    op->remote = remote;
    op->local = local;
    op->last_progress = absl::Now();
    if (!flush) {
      op->pieces = list.data();
      op->piece = begin;
      size_t end = begin;
      while (end < list.size() && (op->length == 0 || op->length + list[end].length <= slice)) {
        op->length += list[end++].length;
      }
      op->piece_end = end;
    }
    impl_->Post([this, op] { impl_->active.push_back(op); });
    return op;
  };
  auto wait = [&](Impl::Op& op) -> absl::Status {
    if (!op.finished.WaitForNotificationWithTimeout(impl_->options.op_timeout + absl::Seconds(5))) {
      op.abandon = true;
      op.finished.WaitForNotification();
    }
    return op.status;
  };
  uint64_t done = 0;
  std::shared_ptr<Impl::Op> current = start(0, false);
  bool stopped = false;
  while (current != nullptr) {
    std::shared_ptr<Impl::Op> next;
    if (current->piece_end < list.size() && !stopped) next = start(current->piece_end, false);
    absl::Status st = wait(*current);
    if (!st.ok()) {
      if (next != nullptr) wait(*next).IgnoreError();
      return st;
    }
    done += current->length;
    if (progress && !progress(done) && done < pieces.total) stopped = true;
    if (stopped && next != nullptr) {
      if (absl::Status n = wait(*next); !n.ok()) return n;
      done += next->length;
      next = nullptr;
    }
    current = next;
  }
  if (put) {
    auto flush = start(0, true);
    if (absl::Status st = wait(*flush); !st.ok()) return st;
  }
  if (stopped && done < pieces.total) return absl::CancelledError("cancelled");
  return absl::OkStatus();
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
