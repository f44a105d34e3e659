#include "daemon/server/listeners.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"

namespace gpumove {
namespace {

// Puts the uid of its slot into every connection's AuthContext, once.
class UidProperty : public grpc::AuthMetadataProcessor {
 public:
  explicit UidProperty(std::shared_ptr<std::atomic<int64_t>> uid) : uid_(std::move(uid)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    if (context->FindPropertyValues(kUnixUidProperty).empty()) {
      const int64_t uid = uid_->load(std::memory_order_acquire);
      if (uid < 0) return grpc::Status(grpc::StatusCode::INTERNAL, "a unix caller without uid");
      context->AddProperty(kUnixUidProperty, std::to_string(uid));
    }
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<std::atomic<int64_t>> uid_;
};

std::string Errno() { return std::strerror(errno); }

}  // namespace

absl::StatusOr<std::unique_ptr<Listeners>> Listeners::Bind(const ListenOptions& options) {
  std::unique_ptr<Listeners> l(new Listeners(options));
  for (const std::string& address : options.addresses) {
    absl::Status st =
        absl::StartsWith(address, "unix:") ? l->BindUnix(address) : l->BindTcp(address);
    if (!st.ok()) return st;  // The destructor closes what was bound.
  }
  l->reserve_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  l->wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->wake_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", Errno()));
  return l;
}

absl::Status Listeners::BindTcp(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address ", Quoted(address), " is not host:port or unix:/path"));
  }
  std::string host = address.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address ", Quoted(address), ": the port is not 0-65535"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &found); e != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", gai_strerror(e)));
  }
  int count = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) ++count;
  std::string last_error;
  int bound_port = port;
  int bound = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = Errno();
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6) {
      // A lone IPv6 address ("[::]") takes IPv4 too, as gRPC's own listener did.
      const int v6only = count > 1 ? 1 : 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
      reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_port = htons(bound_port);
    } else if (a->ai_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_port = htons(bound_port);
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      last_error = Errno();
      close(fd);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      bound_port = local.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    }
    sockets_.push_back(Socket{fd, false, "", 0});
    ++bound;
  }
  freeaddrinfo(found);
  if (bound == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", last_error));
  }
  bound_.push_back(absl::StrCat(address.substr(0, colon), ":", bound_port));
  return absl::OkStatus();
}

absl::Status Listeners::BindUnix(const std::string& address) {
  const std::string path = address.substr(5);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unix socket path ", Quoted(path), " is empty or longer than ", sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    // A socket left by an earlier daemon is replaced; anything else is not ours to remove.
    if (!S_ISSOCK(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot listen on ", address, ": the path exists and is not a socket"));
    }
    unlink(path.c_str());
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", Errno()));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    const std::string e = Errno();
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", e));
  }
  Socket s{fd, true, path, 0};
  if (lstat(path.c_str(), &st) == 0) s.inode = st.st_ino;
  sockets_.push_back(s);
  bound_.push_back(address);
  if (chmod(path.c_str(), options_.unix_socket_mode) != 0) {
    return absl::InternalError(absl::StrCat("cannot chmod ", path, ": ", Errno()));
  }
  if (!options_.unix_socket_group.empty()) {
    struct group* g = getgrnam(options_.unix_socket_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--unix_socket_group: no group ", options_.unix_socket_group));
    }
    if (chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
      return absl::InternalError(absl::StrCat("cannot give ", path, " to group ",
                                              options_.unix_socket_group, ": ", Errno()));
    }
  }
  return absl::OkStatus();
}

void Listeners::Register(grpc::ServerBuilder& builder,
                         std::shared_ptr<grpc::ServerCredentials> tcp) {
  using Type = grpc::ServerBuilder::experimental_type::ExternalConnectionType;
  uid_acceptors_.clear();
  slot_uid_.clear();
  slot_of_.clear();
  tcp_ = builder.experimental().AddExternalConnectionAcceptor(Type::FROM_FD, std::move(tcp));
  unix_ = builder.experimental().AddExternalConnectionAcceptor(Type::FROM_FD,
                                                               grpc::InsecureServerCredentials());
  if (!options_.unix_uids) return;
  for (int i = 0; i < kUidSlots; ++i) {
    // Local credentials: no handshake on the wire (a plaintext client connects as before),
    // and unlike plaintext ones they take a metadata processor.
    std::shared_ptr<grpc::ServerCredentials> creds =
        grpc::experimental::LocalServerCredentials(UDS);
    slot_uid_.push_back(std::make_shared<std::atomic<int64_t>>(-1));
    creds->SetAuthMetadataProcessor(std::make_shared<UidProperty>(slot_uid_.back()));
    uid_acceptors_.push_back(
        builder.experimental().AddExternalConnectionAcceptor(Type::FROM_FD, creds));
  }
}

void Listeners::Start() {
  if (stopped_ || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void Listeners::Pause() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  if (write(wake_, &one, sizeof(one)) < 0) LOG(WARNING) << "listeners: cannot wake: " << Errno();
  thread_.join();
  // Reset the wake, so that a later Start's loop does not return at once.
  uint64_t count = 0;
  if (read(wake_, &count, sizeof(count)) < 0 && errno != EAGAIN) {
    LOG(WARNING) << "listeners: cannot reset the wake: " << Errno();
  }
}

void Listeners::Stop() {
  if (stopped_) return;
  stopped_ = true;
  Pause();
  for (Socket& s : sockets_) {
    close(s.fd);
    struct stat st {};
    if (s.unix_socket && lstat(s.path.c_str(), &st) == 0 && st.st_ino == s.inode) {
      unlink(s.path.c_str());
    }
  }
  sockets_.clear();
}

Listeners::~Listeners() {
  Stop();
  if (reserve_ >= 0) close(reserve_);
  if (wake_ >= 0) close(wake_);
}

void Listeners::Loop() {
  std::vector<pollfd> fds;
  fds.push_back(pollfd{wake_, POLLIN, 0});
  for (const Socket& s : sockets_) fds.push_back(pollfd{s.fd, POLLIN, 0});
  bool paused = false;
  for (;;) {
    // While paused (no memory, no descriptor to shed with) only Stop is heard, for 100 ms.
    const int n = poll(fds.data(), paused ? 1 : fds.size(), paused ? 100 : -1);
    if (n < 0 && errno != EINTR) {
      LOG(ERROR) << "listeners: poll: " << Errno();
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (fds[0].revents & POLLIN) return;
    paused = false;
    for (size_t i = 1; i < fds.size() && n > 0; ++i) {
      if ((fds[i].revents & POLLIN) != 0 && !AcceptAll(sockets_[i - 1])) paused = true;
      fds[i].revents = 0;
    }
  }
}

bool Listeners::NearTheLimit(int fd) {
  // The kernel hands out the lowest free descriptor, so `fd` open means at least fd + 1
  // are. Connections stop short of the limit: the rest of the daemon (gRPC's own
  // descriptors, peers, files re-read) keeps some.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return false;
  const uint64_t soft = limit.rlim_cur;
  const uint64_t headroom = std::clamp<uint64_t>(soft / 32, 8, 256);
  return static_cast<uint64_t>(fd) + headroom >= soft;
}

bool Listeners::AcceptAll(const Socket& s) {
  // Bounded, so that one busy socket does not starve the others.
  for (int i = 0; i < 256; ++i) {
    const int fd = accept4(s.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0 && NearTheLimit(fd)) {
      close(fd);
      CountShed();
      continue;
    }
    if (fd >= 0) {
      Hand(s, fd);
      continue;
    }
    switch (errno) {
      case EAGAIN:
#if EWOULDBLOCK != EAGAIN
      case EWOULDBLOCK:
#endif
        return true;
      case EMFILE:
      case ENFILE:
        if (!ShedOne(s)) return false;
        continue;
      case ENOBUFS:
      case ENOMEM:
        if (WarnNow()) LOG(WARNING) << "listeners: accept: " << Errno() << "; pausing";
        return false;
      default:
        // The connection's own failure (ECONNABORTED, EPROTO, a firewall's EPERM): the
        // next one is unaffected.
        continue;
    }
  }
  return true;
}

bool Listeners::WarnNow() {
  const absl::Time now = absl::Now();
  if (now - last_warning_ < absl::Seconds(5)) return false;
  last_warning_ = now;
  return true;
}

bool Listeners::ShedOne(const Socket& s) {
  if (reserve_ < 0) {
    reserve_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (reserve_ < 0) return false;
  }
  close(reserve_);
  reserve_ = -1;
  const int fd = accept4(s.fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) close(fd);
  reserve_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  CountShed();
  return true;
}

void Listeners::CountShed() {
  const int64_t shed = shed_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (WarnNow()) {
    LOG(WARNING) << "open-file limit reached: closing new connections at once (" << shed
                 << " so far); raise the limit (ulimit -n, LimitNOFILE=)";
  }
}

void Listeners::Hand(const Socket& s, int fd) {
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
  p.listener_fd = s.fd;
  p.fd = fd;
  if (!s.unix_socket) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    tcp_->HandleNewConnection(&p);
    return;
  }
  if (uid_acceptors_.empty()) {
    unix_->HandleNewConnection(&p);
    return;
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    LOG(WARNING) << "unix socket " << s.path << ": no peer credentials: " << Errno();
    close(fd);
    return;
  }
  auto it = slot_of_.find(cred.uid);
  if (it == slot_of_.end()) {
    const int slot = static_cast<int>(slot_of_.size());
    if (slot >= kUidSlots) {
      if (!slots_full_logged_) {
        LOG(WARNING) << "unix sockets: more than " << kUidSlots << " distinct uids; uid "
                     << cred.uid << " and later ones connect as "
                     << "unidentified callers";
        slots_full_logged_ = true;
      }
      unix_->HandleNewConnection(&p);
      return;
    }
    slot_uid_[slot]->store(cred.uid, std::memory_order_release);
    it = slot_of_.emplace(cred.uid, slot).first;
  }
  uid_acceptors_[it->second]->HandleNewConnection(&p);
}

}  // namespace gpumove
