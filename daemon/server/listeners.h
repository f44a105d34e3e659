// The daemon's listening sockets. The daemon binds and accepts them itself and hands each
// connection to gRPC as an external connection, for two reasons:
// - The gRPC this is built with (Debian's 1.51) closes a listener for good the first time
//   accept4 fails with EMFILE (grpc/grpc#20418): a daemon that reached its open-file limit
//   once never took another client or peer. Here connections stop short of the limit (a
//   few descriptors are kept for the rest of the daemon: gRPC itself misbehaved when it
//   found none), those past it are closed at once (their clients see the connection end
//   instead of hanging; at the limit itself one is taken on a reserved descriptor), and
//   the listener goes on.
// - A unix socket's caller is known by its uid (SO_PEERCRED), which gRPC does not expose:
//   each uid's connections go to an acceptor whose credentials put the uid into the
//   connection's AuthContext (kUnixUidProperty), where the Authenticator finds it.
#ifndef GPUMOVE_DAEMON_SERVER_LISTENERS_H_
#define GPUMOVE_DAEMON_SERVER_LISTENERS_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_builder.h>
#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gpumove {

// The AuthContext property holding a unix socket caller's uid (decimal).
inline constexpr char kUnixUidProperty[] = "gpumove_unix_uid";

struct ListenOptions {
  // "host:port" (port 0 picks a free one, the same for every address the host resolves
  // to) or "unix:/path".
  std::vector<std::string> addresses;
  // Unix sockets' mode and group (empty: the daemon's).
  uint32_t unix_socket_mode = 0660;
  std::string unix_socket_group;
  // Whether unix sockets' callers are told apart by uid (kUnixUidProperty).
  bool unix_uids = false;
};

class Listeners {
 public:
  // How many distinct uids get a property of their own; later ones connect unidentified
  // (logged).
  static constexpr int kUidSlots = 64;

  // Binds and listens on every address: UNAVAILABLE naming the address that cannot be
  // bound, INVALID_ARGUMENT for one that does not parse or a unix path that is not a socket.
  static absl::StatusOr<std::unique_ptr<Listeners>> Bind(const ListenOptions& options);
  ~Listeners();
  Listeners(const Listeners&) = delete;
  Listeners& operator=(const Listeners&) = delete;

  // The addresses as bound (port 0 replaced by the port).
  const std::vector<std::string>& bound() const { return bound_; }
  // Gives `builder` the acceptors: `tcp` credentials on TCP sockets, plaintext on unix ones.
  // Called again while paused, it moves the sockets to a new server (the one serving while
  // the daemon starts hands them to the daemon's server).
  void Register(grpc::ServerBuilder& builder, std::shared_ptr<grpc::ServerCredentials> tcp);
  // Starts accepting; after the server started.
  void Start();
  // Stops accepting but keeps the sockets bound (connections wait in their backlog) until
  // Start; idempotent.
  void Pause();
  // Stops accepting, closes the sockets and removes the unix sockets' files; idempotent.
  void Stop();

  // Connections closed at once because the open-file limit was reached.
  int64_t shed() const { return shed_.load(std::memory_order_relaxed); }

 private:
  struct Socket {
    int fd = -1;
    bool unix_socket = false;
    std::string path;  // A unix socket's file.
    ino_t inode = 0;   // Its inode: only our own file is removed.
  };
  explicit Listeners(ListenOptions options) : options_(std::move(options)) {}
  absl::Status BindTcp(const std::string& address);
  absl::Status BindUnix(const std::string& address);
  void Loop();
  // Accepts what is pending on `s`; false when accepting must pause (no memory).
  bool AcceptAll(const Socket& s);
  void Hand(const Socket& s, int fd);
  // Whether a connection on descriptor `fd` would leave the daemon fewer descriptors
  // than it keeps in hand (1/32 of the limit, 8 to 256).
  static bool NearTheLimit(int fd);
  void CountShed();
  // At the open-file limit: takes one pending connection on the reserved descriptor and
  // closes it. False when it could not.
  bool ShedOne(const Socket& s);

  // Whether a repeating warning is due (one per 5 s); accept thread only.
  bool WarnNow();

  const ListenOptions options_;
  std::vector<Socket> sockets_;
  std::vector<std::string> bound_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tcp_, unix_;
  // Per uid (unix_uids): the acceptors, the uid each slot was given (-1: free) and the
  // slot of each uid. Only the accept thread assigns.
  std::vector<std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor>> uid_acceptors_;
  std::vector<std::shared_ptr<std::atomic<int64_t>>> slot_uid_;
  absl::flat_hash_map<uid_t, int> slot_of_;
  bool slots_full_logged_ = false;
  absl::Time last_warning_ = absl::InfinitePast();
  int reserve_ = -1;  // /dev/null, given up to take one connection at the limit.
  int wake_ = -1;     // eventfd: Stop.
  std::atomic<int64_t> shed_{0};
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_LISTENERS_H_
