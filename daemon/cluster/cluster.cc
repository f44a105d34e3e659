#include "daemon/cluster/cluster.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/common/status_macros.h"

namespace gpumove {

absl::StatusOr<std::vector<std::string>> ResolvePeer(const std::string& spec) {
  if (absl::StartsWith(spec, "unix:")) return std::vector<std::string>{spec};
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos || colon + 1 == spec.size()) {
    return absl::InvalidArgumentError(absl::StrCat("peer \"", spec, "\" has no port"));
  }
  std::string host = spec.substr(0, colon);
  const std::string port = spec.substr(colon + 1);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))
    host = host.substr(1, host.size() - 2);
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve peer \"", spec, "\": ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, ip, sizeof(ip));
      out.push_back(absl::StrCat(ip, ":", port));
    } else if (ai->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, ip, sizeof(ip));
      out.push_back(absl::StrCat("[", ip, "]:", port));
    }
  }
  freeaddrinfo(result);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

uint64_t NewIncarnation() {
  absl::BitGen rng;
  return absl::Uniform<uint64_t>(rng, 1, UINT64_MAX);
}

std::string HostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return absl::StrCat(name, "/", absl::StripAsciiWhitespace(boot));
}

Cluster::Cluster(ClusterOptions options, peer::v1::NodeDescriptor self)
    : options_(std::move(options)), node_(self.node()), self_(std::move(self)) {}

peer::v1::NodeDescriptor Cluster::self() const {
  absl::MutexLock lock(&mu_);
  return self_;
}

void Cluster::SetAdvertisedAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  self_.set_address(address);
}

Cluster::~Cluster() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Cluster::Start(LostCallback on_lost) {
  on_lost_ = std::move(on_lost);
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

std::shared_ptr<grpc::Channel> Cluster::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& channel = channels_[address];
  if (channel == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    // Fail fast on a dead peer instead of waiting out gRPC's long reconnect backoff.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    if (!options_.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls_server_name);
    }
    channel = grpc::CreateCustomChannel(
        address,
        options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials(),
        args);
  }
  return channel;
}

absl::Status CheckDescriptor(const peer::v1::NodeDescriptor& d) {
  constexpr size_t kMaxName = 253, kMaxAddress = 1024;
  if (d.node().size() > kMaxName) {
    return absl::InvalidArgumentError(
        absl::StrCat("node name ", Quoted(d.node()), " is longer than ", kMaxName, " bytes"));
  }
  if (d.address().size() > kMaxAddress || d.host_id().size() > kMaxAddress ||
      d.version().size() > kMaxAddress) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", Quoted(d.node()), ": address, host id or version longer than ", kMaxAddress,
        " bytes"));
  }
  if (static_cast<size_t>(d.paths_size()) > kMaxHelloPaths) {
    return absl::InvalidArgumentError(absl::StrCat("node ", Quoted(d.node()), " describes ",
                                                   d.paths_size(), " paths; at most ",
                                                   kMaxHelloPaths));
  }
  for (int i = 0; i < d.paths_size(); ++i) {
    const peer::v1::PathDetails& p = d.paths(i);
    if (p.path().empty() || p.path().size() > kMaxHelloPathName ||
        p.details().size() > kMaxHelloDetails) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node ", Quoted(d.node()), ": path ", i, " (", Quoted(p.path().substr(0, 80)),
          ", ", p.details().size(), " bytes of details): a path's name is 1 to ",
          kMaxHelloPathName, " bytes, its details at most ", kMaxHelloDetails));
    }
    for (int j = 0; j < i; ++j) {
      if (d.paths(j).path() == p.path()) {
        return absl::InvalidArgumentError(absl::StrCat("node ", Quoted(d.node()),
                                                       " describes path ", Quoted(p.path()),
                                                       " twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, std::shared_ptr<const PathView>>>>
Cluster::ReadPaths(const peer::v1::NodeDescriptor& d) {
  std::vector<std::pair<std::string, std::shared_ptr<const PathView>>> views;
  if (options_.paths.empty()) return views;
  // What the same incarnation said before (the heartbeat re-learns it every beat): its
  // views are kept while its blobs stay the same, so a blob is read once.
  peer::v1::NodeDescriptor before;
  std::vector<std::pair<std::string, std::shared_ptr<const PathView>>> kept;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(d.node());
    if (it != peers_.end() && it->second.view.descriptor.incarnation() == d.incarnation()) {
      before = it->second.view.descriptor;
      kept = it->second.view.paths;
    }
  }
  auto blob_of = [](const peer::v1::NodeDescriptor& n,
                    absl::string_view path) -> const std::string* {
    for (const peer::v1::PathDetails& p : n.paths()) {
      if (p.path() == path) return &p.details();
    }
    return nullptr;
  };
  for (const PathHello* hello : options_.paths) {
    const std::string* blob = blob_of(d, hello->path());
    if (blob == nullptr) continue;  // The peer does not run this path.
    const std::string* old = blob_of(before, hello->path());
    std::shared_ptr<const PathView> view;
    if (old != nullptr && *old == *blob) {
      for (const auto& [name, v] : kept) {
        if (name == hello->path()) view = v;
      }
    }
    if (view == nullptr) {
      auto read = hello->Read(*blob);
      if (!read.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("node ", Quoted(d.node()), ": its ", hello->path(),
                         " details were refused: ", read.status().message()));
      }
      view = *std::move(read);
    }
    views.emplace_back(std::string(hello->path()), std::move(view));
  }
  return views;
}

absl::Status Cluster::Learn(const peer::v1::NodeDescriptor& d, const std::string& via) {
  if (d.node().empty() || d.node() == node_) return absl::OkStatus();
  GPUMOVE_RETURN_IF_ERROR(CheckDescriptor(d));
  auto paths = ReadPaths(d);
  if (!paths.ok()) return paths.status();
  absl::MutexLock lock(&mu_);
  Peer& p = peers_[d.node()];
  const uint64_t old = p.view.descriptor.incarnation();
  // A node keeps its address for its life: a Hello that moves a live incarnation
  // elsewhere is someone else's.
  if (p.view.up && old == d.incarnation() && !d.address().empty() &&
      d.address() != p.view.address) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", Quoted(d.node()), " (incarnation ", old, ") is at ", p.view.address,
                     "; a descriptor moving it to ", Quoted(d.address()), " was refused"));
  }
  if (old != 0 && old != d.incarnation()) {
    LOG(INFO) << "peer " << d.node() << " restarted (incarnation " << old << " -> "
              << d.incarnation() << ")";
    // An incarnation already marked down had its loss reported then: once is enough.
    if (p.view.up) lost_.emplace_back(d.node(), old);
  } else if (!p.view.up) {
    LOG(INFO) << "peer " << d.node() << " is up at " << d.address();
  }
  p.view.node = d.node();
  p.view.address = d.address().empty() ? via : d.address();
  p.view.descriptor = d;
  p.view.paths = *std::move(paths);
  p.view.up = true;
  p.view.last_seen = absl::Now();
  if (!via.empty() && std::find(p.addresses.begin(), p.addresses.end(), via) == p.addresses.end()) {
    p.addresses.push_back(via);
  }
  return absl::OkStatus();
}

absl::StatusOr<peer::v1::NodeDescriptor> Cluster::Probe(const std::string& address,
                                                         absl::Duration timeout) {
  auto stub = peer::v1::PeerService::NewStub(ChannelTo(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  peer::v1::HelloRequest request;
  *request.mutable_from() = self();
  peer::v1::HelloResponse response;
  const std::string mac = StampGrpcCall(auth(), kHelloMethod, request, 0, &context);
  const grpc::Status answer = stub->Hello(&context, request, &response);
  if (!answer.ok()) return absl::UnavailableError(answer.error_message());
  if (!AnswerSigned(auth(), mac, response, context)) {
    return absl::UnauthenticatedError("an answer not signed with the cluster's secret");
  }
  return response.node();
}

absl::StatusOr<std::vector<std::string>> Cluster::OnHello(const peer::v1::NodeDescriptor& from) {
  // A Hello that says a live node restarted (another incarnation) is taken only once the
  // node's address stops answering as the old one: otherwise anyone could re-point a
  // live peer (every move to it would then fail).
  std::string live_at;
  uint64_t live_incarnation = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(from.node());
    if (it != peers_.end() && it->second.view.up &&
        it->second.view.descriptor.incarnation() != from.incarnation()) {
      live_at = it->second.view.address;
      live_incarnation = it->second.view.descriptor.incarnation();
    }
  }
  if (!live_at.empty()) {
    auto there = Probe(live_at, std::min(options_.peer_timeout, absl::Seconds(1)));
    if (there.ok() && there->node() == from.node() && there->incarnation() == live_incarnation) {
      LOG(WARNING) << "a Hello as node " << Quoted(from.node()) << " (incarnation "
                   << from.incarnation() << ") was refused: the node answers at " << live_at
                   << " as incarnation " << live_incarnation;
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", Quoted(from.node()), " is live at ", live_at, " (incarnation ",
          live_incarnation, "); a Hello as another incarnation of it was refused"));
    }
  }
  if (absl::Status st = Learn(from, from.address()); !st.ok()) {
    LOG(WARNING) << "a Hello was refused: " << st;
    return st;
  }
  std::vector<std::string> known;
  absl::MutexLock lock(&mu_);
  for (const auto& [node, p] : peers_) {
    if (node != from.node() && p.view.up) known.push_back(p.view.address);
  }
  return known;
}

bool Cluster::Matches(const std::string& node, uint64_t incarnation,
                      const std::function<bool(const PeerView&)>& match) const {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(node);
  return it != peers_.end() && it->second.view.up &&
         it->second.view.descriptor.incarnation() == incarnation &&
         match(it->second.view);
}

absl::StatusOr<PeerView> Cluster::Find(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(node);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown node ", Quoted(node)));
  }
  if (!it->second.view.up) {
    return absl::UnavailableError(absl::StrCat("node ", Quoted(node), " is down (last seen ",
                                               absl::FormatTime(it->second.view.last_seen), ")"));
  }
  PeerView v = it->second.view;
  return v;
}

std::vector<PeerView> Cluster::List() const {
  std::vector<PeerView> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [node, p] : peers_) out.push_back(p.view);
  std::sort(out.begin(), out.end(),
            [](const PeerView& a, const PeerView& b) { return a.node < b.node; });
  return out;
}

uint64_t Cluster::WatchLoss(const std::string& node, std::function<void()> lost) {
  bool down = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node);
    down = it == peers_.end() || !it->second.view.up;
  }
  if (down) {
    lost();
    return 0;
  }
  absl::MutexLock lock(&watch_mu_);
  const uint64_t id = next_watch_++;
  watches_.emplace(id, LossWatch{node, std::move(lost)});
  return id;
}

void Cluster::Forget(uint64_t id) {
  absl::MutexLock lock(&watch_mu_);
  watches_.erase(id);
}

void Cluster::AddPeers(const std::vector<std::string>& addresses) {
  absl::MutexLock lock(&mu_);
  added_.insert(added_.end(), addresses.begin(), addresses.end());
}

std::vector<std::string> Cluster::Targets() {
  bool refresh = false;
  {
    absl::MutexLock lock(&mu_);
    refresh = absl::Now() - resolved_at_ > options_.dns_refresh;
  }
  if (refresh) {
    std::vector<std::string> resolved;
    for (const std::string& spec : options_.peers) {
      auto addrs = ResolvePeer(spec);
      if (!addrs.ok()) {
        VLOG(1) << addrs.status();
        continue;
      }
      resolved.insert(resolved.end(), addrs->begin(), addrs->end());
    }
    absl::MutexLock lock(&mu_);
    resolved_ = std::move(resolved);
    resolved_at_ = absl::Now();
  }
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out = resolved_;
  out.insert(out.end(), gossiped_.begin(), gossiped_.end());
  out.insert(out.end(), added_.begin(), added_.end());
  for (const auto& [node, p] : peers_) out.push_back(p.view.address);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), self_.address()), out.end());
  return out;
}

void Cluster::HeartbeatLoop() {
  while (true) {
    for (const std::string& address : Targets()) {
      auto stub = peer::v1::PeerService::NewStub(ChannelTo(address));
      grpc::ClientContext context;
      context.set_deadline(
          absl::ToChronoTime(absl::Now() + std::min(options_.peer_timeout, absl::Seconds(1))));
      peer::v1::HelloRequest request;
      *request.mutable_from() = self();
      peer::v1::HelloResponse response;
      const std::string mac = StampGrpcCall(auth(), kHelloMethod, request, 0, &context);
      const grpc::Status answer = stub->Hello(&context, request, &response);
      if (answer.ok() && !AnswerSigned(auth(), mac, response, context)) {
        LOG(WARNING) << "the answer of " << address
                     << " to Hello is not signed with the cluster's secret: ignored";
        continue;
      }
      if (!answer.ok()) {
        if (answer.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
          LOG(WARNING) << "Hello to " << address << " refused: " << answer.error_message();
        }
        // A gossiped address that does not answer is forgotten (a peer's old port);
        // configured addresses and known nodes' addresses are kept trying.
        absl::MutexLock lock(&mu_);
        gossiped_.erase(std::remove(gossiped_.begin(), gossiped_.end(), address), gossiped_.end());
        continue;
      }
      if (absl::Status st = Learn(response.node(), address); !st.ok()) {
        LOG(WARNING) << "the answer of " << address << " was refused: " << st;
        continue;
      }
      absl::MutexLock lock(&mu_);
      for (const std::string& a : response.known_addresses()) {
        if (std::find(gossiped_.begin(), gossiped_.end(), a) == gossiped_.end()) {
          gossiped_.push_back(a);
        }
      }
    }
    std::vector<std::pair<std::string, uint64_t>> lost;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      for (auto& [node, p] : peers_) {
        if (p.view.up && now - p.view.last_seen > options_.peer_timeout) {
          LOG(WARNING) << "peer " << node << " is down: no answer for "
                       << absl::FormatDuration(now - p.view.last_seen);
          p.view.up = false;
          lost_.emplace_back(node, p.view.descriptor.incarnation());
          // Its connections may be stuck in TCP retransmission (a cut link): calls made
          // once it is back get fresh channels.
          channels_.erase(p.view.address);
          for (const std::string& a : p.addresses) channels_.erase(a);
        }
      }
      lost.swap(lost_);
    }
    for (const auto& [node, incarnation] : lost) {
      if (on_lost_) on_lost_(node, incarnation);
      absl::MutexLock lock(&watch_mu_);
      for (auto it = watches_.begin(); it != watches_.end();) {
        if (it->second.node == node) {
          it->second.lost();
          watches_.erase(it++);
        } else {
          ++it;
        }
      }
    }
    absl::MutexLock lock(&mu_);
    auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopped), options_.heartbeat)) return;
  }
}

}  // namespace gpumove
