// Who is calling, and what they may do: bearer tokens from a token file (principal, tenant,
// role), or the verified client certificate of an mTLS connection looked up in a file of
// certificate identities; checked on every public RPC. A call forwarded by a peer carries
// the caller its first node identified, stamped with the cluster secret. Without either
// file the daemon is open: every caller is "anonymous" of tenant "anonymous", as before
// there were credentials.
#ifndef GPUMOVE_DAEMON_SERVER_AUTH_H_
#define GPUMOVE_DAEMON_SERVER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/common/watched_files.h"
#include "daemon/core/qos.h"

namespace gpumove {

inline constexpr char kAnonymous[] = "anonymous";

// admin: sees and manages every tenant's buffers and transfers. user: its tenant's, all
// of it. reader: its tenant's, without changing anything (no Allocate, Write, Submit,
// Release, Cancel, lease renewal, import or export).
enum class Role { kReader, kUser, kAdmin };
const char* RoleName(Role role);

struct Caller {
  std::string principal;
  std::string tenant;
  Role role = Role::kUser;
  // The highest class its moves may ask for (TransferSpec.priority); latency: no cap. A
  // caller forwarded by a peer was checked against it on the node it called.
  Priority max_priority = Priority::kLatency;
  // The owner the registry and scheduler see this caller as (kAnyOwner for an admin).
  std::string owner() const;
};

// What an RPC does, for the role check.
enum class Access { kRead, kChange };

// The lines of a token file, in the format of Kubernetes' static token file with a tenant
// and a role: `token,principal,tenant,role` (role admin, user or reader), and optionally
// the highest priority class the principal may ask for, `latency`, `normal` or `bulk`
// (`token,principal,tenant,role,normal`; none: no cap); blank lines and lines starting
// with '#' are skipped. INVALID_ARGUMENT naming the line for anything else
// (a missing field, an unknown role, a repeated token, a tenant named "*").
// `key` names the first field in messages ("token", "identity").
absl::StatusOr<absl::flat_hash_map<std::string, Caller>> ParseTokenFile(
    absl::string_view text, absl::string_view key = "token");

// Where callers' credentials are looked up; both empty: open.
struct AuthSources {
  // Bearer tokens: lines token,principal,tenant,role.
  std::string tokens;
  // Client certificates (mTLS): lines identity,principal,tenant,role, where identity is a
  // subject alternative name (DNS, IP, URI, email) or the common name of the verified
  // certificate; the first of the certificate's names (SANs in order, then CN) found is
  // the caller.
  std::string certificates;
  // Unix socket callers: lines user,principal,tenant,role, where user is a uid or a user
  // name, matched against the uid the listener put in the connection's AuthContext.
  std::string unix_users;
  absl::Duration refresh = absl::Seconds(1);
};

// The metadata key of a caller asserted by a forwarding peer.
inline constexpr char kForwardedCallerKey[] = "x-gpumove-caller-bin";

class Authenticator {
 public:
  // No credentials: everyone is anonymous, of tenant anonymous, a user.
  static std::unique_ptr<Authenticator> Open();
  // The files of `sources`, re-read every `refresh` when they changed (a file that does
  // not parse is refused and what it said before kept, logged). With `peers` (which must
  // outlive this), callers asserted by forwarding peers are taken, and this node asserts
  // its callers to the peers it forwards to.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const AuthSources& sources,
                                                               PeerAuth* peers = nullptr);
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromTokenFile(const std::string& path,
                                                                      absl::Duration refresh) {
    AuthSources sources;
    sources.tokens = path;
    sources.refresh = refresh;
    return Create(sources);
  }
  ~Authenticator() = default;
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  bool open() const { return tokens_path_.empty() && certs_path_.empty() && unix_path_.empty(); }
  // "open", or those of "bearer tokens", "client certificates" and "unix socket uids" it
  // takes.
  std::string Describe() const;
  // The caller of `context` if it may do `access` in `method`: UNAUTHENTICATED without a
  // valid bearer token (when the daemon has a token file), PERMISSION_DENIED when its role
  // forbids it. Refusals and administrators' changes are written as JSON audit lines.
  absl::StatusOr<Caller> Check(const grpc::ServerContextBase* context, Access access,
                               absl::string_view method) const;

  // For a call that lasts (a stream, a long wait): OK while the credentials `context`
  // carries still make it `caller`; UNAUTHENTICATED once they do not (its token removed or
  // changed, its certificate no longer mapped), re-read files and all. A call forwarded
  // by a peer is its first node's to end.
  absl::Status StillValid(const grpc::ServerContextBase* context, const Caller& caller) const;

  // For a call that lasts without a thread of its own (a callback reactor, a call relayed
  // to another node): runs `revoked` once the credentials `context` carries no longer make
  // it the caller they make it now, checked each time a credentials file is re-read, on
  // the thread that re-reads it (it must not block or call back in). Returns an id for
  // Unwatch; 0 when nothing can revoke the call (an open daemon, a call a peer forwarded
  // here).
  uint64_t WatchRevocation(const grpc::ServerContextBase* context,
                           std::function<void()> revoked) const;
  // Once it returns, the callback of `id` neither runs nor is running.
  void Unwatch(uint64_t id) const;

  // Adds to a call forwarded to the node at `to_incarnation` what identifies its caller
  // there: the bearer token, and (with peers) the caller identified here, stamped.
  void Forward(const grpc::ServerContextBase& from, uint64_t to_incarnation,
               grpc::ClientContext* to) const;

 private:
  Authenticator() = default;
  // Who the caller is (no role check): UNAUTHENTICATED with the reason for the audit line.
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& context, std::string* why) const;

  // The caller of a unix socket connection known by uid, if the file names it.
  std::optional<Caller> UnixCaller(const grpc::ServerContextBase& context, std::string* uid) const;

  // Runs the callbacks of the watched calls whose credentials went (after a file changed).
  void SweepRevoked() const;

  std::string tokens_path_, certs_path_, unix_path_;
  PeerAuth* peers_ = nullptr;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Caller> tokens_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Caller> certs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Caller> unix_users_ ABSL_GUARDED_BY(mu_);
  struct Watched {
    const grpc::ServerContextBase* context;
    Caller caller;
    std::function<void()> revoked;
  };
  // Taken before mu_, never after it.
  mutable absl::Mutex watches_mu_;
  mutable absl::flat_hash_map<uint64_t, Watched> watches_ ABSL_GUARDED_BY(watches_mu_);
  mutable uint64_t next_watch_ ABSL_GUARDED_BY(watches_mu_) = 1;
  // Last: they stop before the maps go.
  std::unique_ptr<WatchedFiles> tokens_watcher_, certs_watcher_, unix_watcher_;
};

// In an RPC handler: `caller` is the Caller of `context` for `access`, or the handler
// returns Check's refusal.
// StillValid at most every `period` (default 1 s, the files' re-read period), for loops
// that serve a stream: a revoked caller's stream ends within about two periods.
class CredentialsWatch {
 public:
  CredentialsWatch(const Authenticator& auth, const grpc::ServerContextBase* context,
                   const Caller& caller, absl::Duration period = absl::Seconds(1))
      : auth_(auth), context_(context), caller_(caller), period_(period) {}
  absl::Status Check() {
    const absl::Time now = absl::Now();
    if (now < next_) return absl::OkStatus();
    next_ = now + period_;
    return auth_.StillValid(context_, caller_);
  }

 private:
  const Authenticator& auth_;
  const grpc::ServerContextBase* const context_;
  const Caller caller_;
  const absl::Duration period_;
  absl::Time next_ = absl::InfinitePast();
};

#define GPUMOVE_CHECK_CALLER(caller, auth, context, access, method)           \
  auto caller##_checked = (auth).Check((context), (access), (method));        \
  if (!caller##_checked.ok()) return ToGrpcStatus(caller##_checked.status()); \
  [[maybe_unused]] const Caller& caller = *caller##_checked

// Returns INVALID_ARGUMENT from the handler when a string of `request` is past its limit
// (field_limits.h): checked once the caller is known, before anything reads it.
#define GPUMOVE_CHECK_FIELDS(request)                                                 \
  if (absl::Status fields_checked = CheckStringFields(request); !fields_checked.ok()) \
  return ToGrpcStatus(fields_checked)

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_AUTH_H_
