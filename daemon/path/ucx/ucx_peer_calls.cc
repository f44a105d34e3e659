#include "daemon/path/ucx/ucx_peer_calls.h"

#include "daemon/path/ucx/ucx_hello.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"

namespace gpumove {
namespace {

// A body with a length-prefixed part ahead of it (a call's stamp, an answer's mac).
std::string Framed(absl::string_view head, std::string body) {
  std::string out;
  out.reserve(4 + head.size() + body.size());
  const uint32_t n = static_cast<uint32_t>(head.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  out.append(head.data(), head.size());
  out.append(body);
  return out;
}

// Splits what Framed made; false when `framed` is not that.
bool Unframe(const std::string& framed, absl::string_view* head, absl::string_view* body) {
  if (framed.size() < 4) return false;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t{static_cast<unsigned char>(framed[i])} << (8 * i);
  if (n > framed.size() - 4) return false;
  *head = absl::string_view(framed).substr(4, n);
  *body = absl::string_view(framed).substr(4 + n);
  return true;
}

}  // namespace

absl::StatusOr<CheckedUcxCall> CheckUcxCall(PeerAuth* auth, absl::string_view caller_key,
                                            uint32_t method, const std::string& framed) {
  absl::string_view stamp, rest;
  if (!Unframe(framed, &stamp, &rest)) {
    return absl::InvalidArgumentError("a malformed peer call");
  }
  CheckedUcxCall out{std::string(rest), {}};
  if (auth == nullptr) return out;
  auto who = auth->Check(method, out.body, stamp);
  if (!who.ok()) return who.status();
  // The answer goes to the key the message names: it must be the stamp's.
  if (PeerId{who->node, who->incarnation}.Key() != caller_key) {
    return absl::UnauthenticatedError(absl::StrCat("stamped by ", Quoted(who->node),
                                                   " at incarnation ", who->incarnation,
                                                   " but answered to another key"));
  }
  out.mac = std::move(who->mac);
  return out;
}

UcxPeerCalls::UcxPeerCalls(UcxTransport* transport, const peer::v1::NodeDescriptor& self,
                           int threads, absl::Duration poll_window, PeerAuth* auth)
    : transport_(transport),
      self_(self),
      auth_(auth),
      threads_(std::max(1, threads)),
      poll_window_(poll_window) {}

UcxPeerCalls::~UcxPeerCalls() { StopServing(); }

void UcxPeerCalls::Admit(KnownPeer known) { known_ = std::move(known); }

void UcxPeerCalls::Serve(PeerHandler* service) {
  {
    absl::MutexLock lock(&mu_);
    service_ = service;
  }
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
  // Runs on the transport's progress thread.
  transport_->ServeCalls(
      PeerId{self_.node(), self_.incarnation()}.Key(),
      [this](const UcxPeer& caller, uint32_t method, std::string framed, UcxReply reply) {
        OnCall(caller, method, std::move(framed), std::move(reply));
      });
}

void UcxPeerCalls::OnCall(const UcxPeer& caller, uint32_t method, std::string framed,
                          UcxReply reply) {
  auto checked = CheckUcxCall(auth_, caller.key, method, framed);
  if (!checked.ok()) return Refuse(caller, checked.status().message());
  std::string body = std::move(checked->body);
  if (auth_ != nullptr) {
    // The answer is signed with the call's mac.
    reply = [this, mac = std::move(checked->mac), inner = std::move(reply)](const absl::Status& st,
                                                                            std::string answer) {
      if (!st.ok()) return inner(st, {});
      std::string sig = auth_->SignReply(mac, answer);
      inner(st, Framed(sig, std::move(answer)));
    };
  } else {
    reply = [inner = std::move(reply)](const absl::Status& st, std::string answer) {
      inner(st, st.ok() ? Framed("", std::move(answer)) : std::string());
    };
  }
  if (Known(caller)) return Dispatch(method, body, std::move(reply), /*on_worker=*/false);
  // A node met a moment ago (its Hello's answer still on its way here) may call before this
  // node has learned it: a few such calls wait on a serving thread, briefly.
  if (admit_waiting_.fetch_add(1) >= kMaxAdmitWaiting) {
    admit_waiting_.fetch_sub(1);
    return Refuse(caller, "not a peer this node has met");
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back([this, caller, method, body = std::move(body), reply = std::move(reply)] {
    bool known = false;
    for (const absl::Time until = absl::Now() + kAdmitWait; !(known = Known(caller));) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_ || absl::Now() >= until) break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    admit_waiting_.fetch_sub(1);
    if (!known) return Refuse(caller, "not a peer this node has met");
    Dispatch(method, body, reply, /*on_worker=*/true);
  });
}

bool UcxPeerCalls::Known(const UcxPeer& caller) const {
  std::optional<PeerId> id = ParsePeerKey(caller.key);
  return id.has_value() && known_ && known_(id->node, id->incarnation, caller.worker_address);
}

void UcxPeerCalls::Dispatch(uint32_t method, const std::string& body, UcxReply reply,
                            bool on_worker) {
  PeerHandler* s = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !on_worker) {
      reply(absl::UnavailableError("node is shutting down"), {});
      return;
    }
    s = service_;
  }
  if (s == nullptr) {
    reply(absl::UnavailableError("this node does not serve peer calls"), {});
    return;
  }
  ++served_;
  auto call = ParsePeerCall(s, method, body);
  if (!call.ok()) {
    reply(call.status(), {});
    return;
  }
  if (on_worker || call->at_once) {
    call->run(reply);
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back([run = std::move(call->run), reply = std::move(reply)] { run(reply); });
}

void UcxPeerCalls::Refuse(const UcxPeer& caller, absl::string_view why) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  ++refusals_unlogged_;
  const absl::Time now = absl::Now();
  if (now - refusal_logged_ < absl::Seconds(10)) return;
  LOG(WARNING) << "dropped " << refusals_unlogged_
               << " peer call(s) over UCX unanswered since the last report; the last: " << why
               << " (it named itself " << Quoted(caller.key) << ")";
  refusals_unlogged_ = 0;
  refusal_logged_ = now;
}

void UcxPeerCalls::StopServing() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  // Calls still arriving are dropped by the transport (their callers time out, as they
  // would for a node gone); queued ones run.
  transport_->ServeCalls(PeerId{self_.node(), self_.incarnation()}.Key(), nullptr);
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  absl::MutexLock lock(&mu_);
  service_ = nullptr;
}

void UcxPeerCalls::Work() {
  bool served = false;
  while (true) {
    // Just served a call: poll for the next one a while (one thread at a time).
    if (served && poll_window_ > absl::ZeroDuration() && !polling_.exchange(true)) {
      for (const absl::Time until = absl::Now() + poll_window_; absl::Now() < until;) {
        {
          absl::MutexLock lock(&mu_);
          if (stop_ || !queue_.empty()) break;
        }
        std::this_thread::yield();
      }
      polling_ = false;
    }
    served = true;
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

bool UcxPeerCalls::Reaches(const PeerView& peer) const {
  const peer::v1::UcxDetails* ucx = UcxDetailsOf(peer);
  return ucx != nullptr && ucx->peer_calls() && !ucx->worker_address().empty();
}

absl::StatusOr<std::string> UcxPeerCalls::Call(const PeerView& view, PeerMethod method,
                                               std::string request, absl::Duration timeout) {
  const peer::v1::NodeDescriptor& peer = view.descriptor;
  const peer::v1::UcxDetails* ucx = UcxDetailsOf(view);
  if (ucx == nullptr) {
    return absl::UnavailableError(absl::StrCat("node ", peer.node(), " has no UCX engine"));
  }
  UcxPeer to{PeerId{peer.node(), peer.incarnation()}.Key(), ucx->worker_address(),
             /*error_handling=*/peer.host_id() != self_.host_id()};
  PeerAuth::Stamped stamped;
  if (auth_ != nullptr) {
    stamped = auth_->Stamp(static_cast<uint32_t>(method), request, peer.incarnation());
  }
  auto framed = transport_->Call(to, static_cast<uint32_t>(method),
                                 Framed(stamped.stamp, std::move(request)), timeout);
  if (!framed.ok()) return framed.status();
  absl::string_view mac, body;
  if (!Unframe(*framed, &mac, &body)) {
    return absl::InternalError(absl::StrCat("a malformed answer from node ", peer.node()));
  }
  if (auth_ != nullptr && !auth_->CheckReply(stamped.mac, body, mac)) {
    return absl::UnauthenticatedError(absl::StrCat("the answer of node ", peer.node(),
                                                   " is not signed with the cluster's secret"));
  }
  return std::string(body);
}

}  // namespace gpumove
