// Same-host direct copies: a peer pool UCX maps through shared memory is copied with
// memcpy on the caller's thread (split over helper threads), no progress-thread hand-off.
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/host_copy.h"
#include "daemon/path/ucx/ucx_transport_impl.h"

namespace gpumove {

using ucx_internal::FindMapping;

std::shared_ptr<UcxTransport::Impl::Direct> UcxTransport::Impl::AcquireDirect(
    const RemoteRange& r) {
  const std::string key = absl::StrCat(r.peer_key, std::string(1, '\0'), r.rkey);
  {
    absl::MutexLock lock(&direct_mu);
    auto it = direct.find(key);
    if (it != direct.end()) {
      if (it->second == nullptr) return nullptr;
      ++it->second->users;
      return it->second;
    }
  }
  // First move to this peer pool: unpack its key and ask UCX for a local pointer.
  std::shared_ptr<Direct> found;
  std::shared_ptr<Direct> fresh;
  const uint64_t generation = Generation(r.peer_key);
  bool inserted = false;
  Call([&] {
    Peer* peer = GetPeer(r);
    if (peer->failed || peer->ep == nullptr || peer->generation > generation) return;
    ucp_rkey_h rkey = nullptr;
    if (ucp_ep_rkey_unpack(peer->ep, r.rkey.data(), &rkey) != UCS_OK) return;
    void* local = nullptr;
    if (ucp_rkey_ptr(rkey, r.address, &local) != UCS_OK) {
      ucp_rkey_destroy(rkey);
      absl::MutexLock lock(&direct_mu);
      direct.emplace(key, nullptr);
      return;
    }
    auto d = std::make_shared<Direct>();
    d->rkey = rkey;
    d->delta = reinterpret_cast<intptr_t>(local) - static_cast<intptr_t>(r.address);
    absl::MutexLock lock(&direct_mu);
    auto [it, added] = direct.emplace(key, d);
    inserted = added;
    if (!inserted) {
      ucp_rkey_destroy(rkey);  // Another move got there first.
      d = it->second;
    }
    if (d != nullptr) ++d->users;
    if (inserted) fresh = d;
    found = d;
  });
  if (fresh != nullptr) Prefault(fresh, reinterpret_cast<char*>(r.address + fresh->delta));
  return found;
}

void UcxTransport::Impl::Prefault(const std::shared_ptr<Direct>& d, char* inside) {
  uintptr_t lo = 0, hi = 0;
  std::string line;
  if (!FindMapping(reinterpret_cast<uintptr_t>(inside), &lo, &hi, &line)) return;
  {
    absl::MutexLock lock(&direct_mu);
    ++d->users;
    ++prefaulting;
  }
  std::thread([this, d, lo, hi] {
    // Kernels before 5.14 refuse MADV_POPULATE_WRITE; the pages then fault on use.
    madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
    ReleaseDirect(d);
    absl::MutexLock lock(&direct_mu);
    --prefaulting;
  }).detach();
}

void UcxTransport::Impl::ReleaseDirect(const std::shared_ptr<Direct>& d) {
  absl::MutexLock lock(&direct_mu);
  if (--d->users == 0 && d->dead) {
    Post([d] { ucp_rkey_destroy(d->rkey); });
  }
}

void UcxTransport::Impl::ForgetDirect(const std::string& peer_key) {
  const std::string prefix = absl::StrCat(peer_key, std::string(1, '\0'));
  absl::MutexLock lock(&direct_mu);
  for (auto it = direct.begin(); it != direct.end();) {
    if (!absl::StartsWith(it->first, prefix)) {
      ++it;
      continue;
    }
    if (it->second != nullptr) {
      it->second->dead = true;
      if (it->second->users == 0) ucp_rkey_destroy(it->second->rkey);
    }
    direct.erase(it++);
  }
}

int DirectCopyThreads(const UcxOptions& options, const RemoteRange& remote) {
  const int direct = std::max(1, options.direct_threads);
  if (!remote.staged) return direct;
  if (options.staged_threads > 0) return options.staged_threads;
  return std::max(1, remote.bounce ? direct / 2 : direct / 4);
}

absl::Status UcxTransport::CopyDirect(bool put, const RemoteRange& remote, char* mapped,
                                      char* local, uint64_t length,
                                      const std::function<bool(uint64_t)>& progress) {
  // Slices of at least 16 MiB per copying thread (big enough for streaming stores):
  // progress, rate limits and cancel act between them. The peer sees the bytes once the
  // copy returns (HostCopy fences its streaming stores).
  const uint64_t generation = impl_->Generation(remote.peer_key);
  const int threads = DirectCopyThreads(impl_->options, remote);
  const uint64_t slice = std::max<uint64_t>(impl_->options.chunk, 16 << 20) * threads;
  const uint64_t streaming_min = remote.bounce ? kBounceStreamingMin : kStreamingCopyMin;
  uint64_t done = 0;
  while (done < length) {
    const uint64_t n = std::min(slice, length - done);
    if (put) {
      ParallelHostCopy(mapped + done, local + done, n, threads, streaming_min);
    } else {
      ParallelHostCopy(local + done, mapped + done, n, threads, streaming_min);
    }
    done += n;
    impl_->direct_bytes += n;
    if (impl_->Generation(remote.peer_key) != generation) {
      return absl::UnavailableError("peer restarted or down during the move");
    }
    if (progress && !progress(done) && done < length) return absl::CancelledError("cancelled");
  }
  return absl::OkStatus();
}

bool UcxTransport::Direct(const RemoteRange& remote) {
  if (!impl_->options.direct) return false;
  std::shared_ptr<Impl::Direct> d = impl_->AcquireDirect(remote);
  if (d == nullptr) return false;
  impl_->ReleaseDirect(d);
  return true;
}

uint64_t UcxTransport::direct_bytes() const { return impl_->direct_bytes; }

}  // namespace gpumove
