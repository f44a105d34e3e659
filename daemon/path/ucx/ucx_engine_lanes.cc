// The UCX engine's lanes: which a move takes, its shares over them with failover inside
// the move (RunShares), and each lane's health toward each peer.
#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/path/ucx/ucx_engine.h"

namespace gpumove {

std::vector<size_t> ChooseLanes(const std::vector<int>& busy, uint64_t most, bool spread) {
  std::vector<size_t> order(busy.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&busy](size_t a, size_t b) { return busy[a] < busy[b]; });
  const size_t idle = std::count(busy.begin(), busy.end(), 0);
  order.resize(std::clamp<uint64_t>(spread ? busy.size() : idle, 1, std::max<uint64_t>(most, 1)));
  return order;
}

ShareLanes UcxEngine::TakeLanes(const std::string& peer_key, size_t usable, uint64_t most,
                                bool spread) {
  absl::MutexLock lock(&lane_mu_);
  if (lane_busy_.size() < usable) lane_busy_.resize(usable, 0);
  // Lanes up toward the peer, and those down whose probe is due.
  std::vector<size_t> up;
  const auto down = lanes_down_.find(peer_key);
  const absl::Time now = absl::Now();
  for (size_t l = 0; l < usable; ++l) {
    if (down != lanes_down_.end()) {
      auto d = down->second.find(l);
      if (d != down->second.end() && now < d->second.retry_at) continue;
    }
    up.push_back(l);
  }
  ShareLanes lanes;
  if (up.empty()) {
    // Every lane failed lately: the main one carries the move (and fails it if it is
    // still down: the move fails as it would with one lane).
    lanes.use = {0};
  } else {
    // Rails carry the shares and the first transport is their spare, while a rail is up.
    std::vector<size_t> candidates = up;
    if (lanes_.rails && candidates.size() > 1 && candidates[0] == 0) {
      candidates.erase(candidates.begin());
    }
    std::vector<int> busy;
    for (size_t l : candidates) busy.push_back(lane_busy_[l]);
    for (size_t i : ChooseLanes(busy, most, spread)) lanes.use.push_back(candidates[i]);
    for (size_t l : up) {
      if (std::find(lanes.use.begin(), lanes.use.end(), l) == lanes.use.end()) {
        lanes.spare.push_back(l);
      }
    }
  }
  for (size_t l : lanes.use) ++lane_busy_[l];
  return lanes;
}

void UcxEngine::GiveBackLanes(const std::vector<size_t>& lanes) {
  absl::MutexLock lock(&lane_mu_);
  for (size_t l : lanes) --lane_busy_[l];
}

void UcxEngine::LaneOutcome(const std::string& peer_key, const SharesOutcome& out) {
  if (out.failed.empty() && out.carried.empty()) return;
  absl::MutexLock lock(&lane_mu_);
  auto peer = lanes_down_.find(peer_key);
  if (out.failed.empty() && peer == lanes_down_.end()) return;  // The usual case.
  if (peer == lanes_down_.end()) {
    if (lanes_down_.size() >= kMaxDownPeers) {
      // Peers long gone (restarted: a new key) leave entries: drop those not due.
      absl::erase_if(lanes_down_, [now = absl::Now()](const auto& p) {
        return std::all_of(p.second.begin(), p.second.end(),
                           [now](const auto& l) { return l.second.retry_at <= now; });
      });
      if (lanes_down_.size() >= kMaxDownPeers) lanes_down_.clear();
    }
    peer = lanes_down_.emplace(peer_key, std::map<size_t, LaneDown>{}).first;
  }
  for (const auto& [lane, bytes] : out.carried) {
    if (peer->second.erase(lane) > 0) {
      LOG(INFO) << "UCX lane " << lane << " to " << peer_key << " is back up (carried " << bytes
                << " bytes)";
    }
  }
  for (size_t lane : out.failed) {
    auto [it, fresh] = peer->second.try_emplace(lane, LaneDown{{}, kLaneBackoffFirst});
    if (!fresh) it->second.backoff = std::min(it->second.backoff * 2, kLaneBackoffMost);
    it->second.retry_at = absl::Now() + it->second.backoff;
    LOG(WARNING) << "UCX lane " << lane << " to " << peer_key << " failed under a move; left out "
                 << "of moves to it for " << absl::FormatDuration(it->second.backoff)
                 << ", then tried again";
  }
  if (peer->second.empty()) lanes_down_.erase(peer);
}

size_t UcxEngine::lanes_down() {
  absl::MutexLock lock(&lane_mu_);
  size_t n = 0;
  for (const auto& [peer, lanes] : lanes_down_) n += lanes.size();
  return n;
}

absl::Status UcxEngine::MoveOverLanes(bool push, const RemoteRange& remote, const UcxOffer& offer,
                                      char* local, uint64_t length, MoveControl& control,
                                      const ShareLanes& use) {
  auto transport = [this](size_t lane) { return lane == 0 ? transport_ : lanes_.lanes[lane - 1]; };
  auto range = [&](size_t lane, uint64_t offset) {
    RemoteRange r = remote;
    if (lane > 0) {
      r.worker_address = offer.lanes[lane - 1].worker_address;
      r.rkey = offer.lanes[lane - 1].rkey;
    }
    r.address += offset;
    return r;
  };
  ShareRma rma = [&](size_t lane, uint64_t offset, uint64_t n,
                     const std::function<bool(uint64_t)>& progress) {
    UcxTransport* t = transport(lane);
    return push ? t->Put(range(lane, offset), local + offset, n, progress)
                : t->Get(range(lane, offset), local + offset, n, progress);
  };
  // A share fails over only while the peer is up as it was when the move began (a peer
  // seen down or restarted is forgotten on every lane: its moves fail), and only to a lane
  // that already has an endpoint to it (UCX 1.13 connects TCP blocking: toward an
  // unreachable host a new endpoint holds the lane's progress thread for minutes).
  const uint64_t generation = transport_->Generation(remote.peer_key);
  auto may_take = [&](size_t lane) {
    return transport_->Generation(remote.peer_key) == generation &&
           transport(lane)->Connected(remote.peer_key);
  };
  SharesOutcome out =
      RunShares(length, use, rma, control.Reporter(), absl::Milliseconds(2), may_take);
  for (const auto& [lane, bytes] : out.carried) {
    if (lane > 0) lane_bytes_ += bytes;
  }
  if (!out.failed.empty()) {
    // A failed lane's endpoint to the peer is closed: the probe that tries it again later
    // connects afresh (a broken endpoint stays broken).
    for (size_t lane : out.failed) transport(lane)->Forget(remote.peer_key);
    lane_failovers_ += out.failed.size();
    lane_resent_bytes_ += out.resent;
    std::vector<std::string> failed;
    for (size_t i = 0; i < out.failed.size(); ++i) {
      failed.push_back(absl::StrCat(out.failed[i], " (", out.why[i].message(), ")"));
    }
    LOG(WARNING) << "UCX move of " << length << " bytes: lane(s) " << absl::StrJoin(failed, ", ")
                 << " failed; "
                 << (out.status.ok() ? absl::StrCat(out.resent, " bytes sent again on the others")
                                     : absl::StrCat("no lane left: ", out.status.ToString()));
  }
  LaneOutcome(remote.peer_key, out);
  if (out.status.ok() && lanes_.rails) {
    // What carried the bytes: each rail that carried a share, as its own UCX route says
    // ("rc_verbs/rxe0:1,rc_verbs/rxe1:1"), not only the first transport's.
    std::vector<std::string> carriers;
    for (const auto& [lane, bytes] : out.carried) {
      auto route = transport(lane)->Route(range(lane, 0));
      if (!route.ok()) continue;
      for (absl::string_view c : absl::StrSplit(route->Summary(), ',', absl::SkipEmpty())) {
        if (std::find(carriers.begin(), carriers.end(), c) == carriers.end()) {
          carriers.emplace_back(c);
        }
      }
    }
    if (!carriers.empty()) control.Carried(absl::StrJoin(carriers, ","));
  }
  return out.status;
}

}  // namespace gpumove
