// Who is calling, and what they may do: bearer tokens from a token file (principal, tenant,
// role), checked on every public RPC. Without a token file the daemon is open: every caller
// is "anonymous" of tenant "anonymous", as before there were credentials.
#ifndef GPUMOVE_DAEMON_SERVER_AUTH_H_
#define GPUMOVE_DAEMON_SERVER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/watched_files.h"

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
  // The owner the registry and scheduler see this caller as (kAnyOwner for an admin).
  std::string owner() const;
};

// What an RPC does, for the role check.
enum class Access { kRead, kChange };

// The lines of a token file, in the format of Kubernetes' static token file with a tenant
// and a role: `token,principal,tenant,role` (role admin, user or reader); blank lines and
// lines starting with '#' are skipped. INVALID_ARGUMENT naming the line for anything else
// (a missing field, an unknown role, a repeated token, a tenant named "*").
absl::StatusOr<absl::flat_hash_map<std::string, Caller>> ParseTokenFile(absl::string_view text);

class Authenticator {
 public:
  // No credentials: everyone is anonymous, of tenant anonymous, a user.
  static std::unique_ptr<Authenticator> Open();
  // Bearer tokens from `path`, re-read every `refresh` when it changed (a file that does
  // not parse is refused and the tokens before it kept, logged).
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromTokenFile(const std::string& path,
                                                                      absl::Duration refresh);
  ~Authenticator() = default;
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  bool open() const { return path_.empty(); }
  // The caller of `context` if it may do `access` in `method`: UNAUTHENTICATED without a
  // valid bearer token (when the daemon has a token file), PERMISSION_DENIED when its role
  // forbids it. Refusals and administrators' changes are written as JSON audit lines.
  absl::StatusOr<Caller> Check(const grpc::ServerContext* context, Access access,
                               absl::string_view method) const;

 private:
  Authenticator() = default;

  std::string path_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Caller> tokens_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<WatchedFiles> watcher_;  // Last: it stops before the tokens go.
};

// In an RPC handler: `caller` is the Caller of `context` for `access`, or the handler
// returns Check's refusal.
#define GPUMOVE_CHECK_CALLER(caller, auth, context, access, method)           \
  auto caller##_checked = (auth).Check((context), (access), (method));        \
  if (!caller##_checked.ok()) return ToGrpcStatus(caller##_checked.status()); \
  [[maybe_unused]] const Caller& caller = *caller##_checked

// Calls forwarded to another node carry the caller's credentials, which that node checks
// itself (every node reads the same token file).
void CopyCredentials(const grpc::ServerContext& from, grpc::ClientContext* to);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_AUTH_H_
