#include "daemon/server/auth.h"

#include <pwd.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/server/listeners.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// A JSON string of `s` (quotes and control characters escaped), bounded.
std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s.substr(0, 256)) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrCat("\\u00", absl::string_view("0123456789abcdef" + ((c >> 4) & 0xf), 1),
                          absl::string_view("0123456789abcdef" + (c & 0xf), 1));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void Audit(absl::string_view method, absl::string_view principal, absl::string_view tenant,
           absl::string_view outcome, absl::string_view peer) {
  LOG(WARNING) << "audit {\"method\":" << JsonString(method)
               << ",\"principal\":" << JsonString(principal) << ",\"tenant\":" << JsonString(tenant)
               << ",\"outcome\":" << JsonString(outcome) << ",\"peer\":" << JsonString(peer) << "}";
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kUser:
      return "user";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

std::string Caller::owner() const { return role == Role::kAdmin ? kAnyOwner : tenant; }

absl::StatusOr<absl::flat_hash_map<std::string, Caller>> ParseTokenFile(absl::string_view text,
                                                                        absl::string_view key) {
  absl::flat_hash_map<std::string, Caller> out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    if (fields.size() != 4 && fields.size() != 5) {
      return absl::InvalidArgumentError(absl::StrCat("line ", number, ": ", fields.size(),
                                                     " fields, not 4 or 5 (", key,
                                                     ",principal,tenant,role[,highest class])"));
    }
    for (absl::string_view& f : fields) f = absl::StripAsciiWhitespace(f);
    const absl::string_view token = fields[0], role = fields[3];
    Caller c{std::string(fields[1]), std::string(fields[2]), Role::kUser};
    if (token.empty() || c.principal.empty() || c.tenant.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", number, ": an empty field"));
    }
    if (c.tenant == kAnyOwner) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": no tenant may be named \"", kAnyOwner, "\""));
    }
    if (role == "admin") {
      c.role = Role::kAdmin;
    } else if (role == "reader") {
      c.role = Role::kReader;
    } else if (role != "user") {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": role ", Quoted(role), " is not admin, user or reader"));
    }
    if (fields.size() == 5) {
      std::optional<Priority> cap = ParsePriority(fields[4]);
      if (!cap.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", number, ": class ", Quoted(fields[4]), " is not latency, normal or bulk"));
      }
      c.max_priority = *cap;
    }
    if (!out.emplace(std::string(token), std::move(c)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": the same ", key, " as an earlier line"));
    }
  }
  return out;
}

std::unique_ptr<Authenticator> Authenticator::Open() {
  return std::unique_ptr<Authenticator>(new Authenticator());
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const AuthSources& sources,
                                                                     PeerAuth* peers) {
  std::unique_ptr<Authenticator> a(new Authenticator());
  a->tokens_path_ = sources.tokens;
  a->certs_path_ = sources.certificates;
  a->unix_path_ = sources.unix_users;
  a->peers_ = peers;
  Authenticator* self = a.get();
  // Each file fills its map; what does not parse is refused.
  auto watch = [&](const std::string& path, const char* what, const char* key,
                   absl::flat_hash_map<std::string, Caller> Authenticator::*map)
      -> absl::StatusOr<std::unique_ptr<WatchedFiles>> {
    return WatchedFiles::Start(
        {path}, sources.refresh, what,
        [self, path, key, map](const std::vector<std::string>& contents) {
          auto parsed = ParseTokenFile(contents[0], key);
          if (!parsed.ok()) {
            return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
          }
          {
            absl::MutexLock lock(&self->mu_);
            self->*map = *std::move(parsed);
          }
          self->SweepRevoked();
          return absl::OkStatus();
        });
  };
  if (!sources.tokens.empty()) {
    auto w = watch(sources.tokens, "token file", "token", &Authenticator::tokens_);
    if (!w.ok()) return w.status();
    a->tokens_watcher_ = *std::move(w);
  }
  if (!sources.certificates.empty()) {
    auto w =
        watch(sources.certificates, "certificate principals", "identity", &Authenticator::certs_);
    if (!w.ok()) return w.status();
    a->certs_watcher_ = *std::move(w);
  }
  if (!sources.unix_users.empty()) {
    auto w =
        watch(sources.unix_users, "unix socket principals", "user", &Authenticator::unix_users_);
    if (!w.ok()) return w.status();
    a->unix_watcher_ = *std::move(w);
  }
  return a;
}

std::string Authenticator::Describe() const {
  if (open()) return "open";
  std::vector<absl::string_view> ways;
  if (!tokens_path_.empty()) ways.push_back("bearer tokens");
  if (!certs_path_.empty()) ways.push_back("client certificates");
  if (!unix_path_.empty()) ways.push_back("unix socket uids");
  return absl::StrJoin(ways, ", ");
}

std::optional<Caller> Authenticator::UnixCaller(const grpc::ServerContextBase& context,
                                                std::string* uid) const {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return std::nullopt;
  const std::vector<grpc::string_ref> values = auth->FindPropertyValues(kUnixUidProperty);
  if (values.empty()) return std::nullopt;
  uid->assign(values.front().data(), values.front().size());
  std::string name;
  if (uid_t n = 0; absl::SimpleAtoi(*uid, &n)) {
    passwd pw{}, *found = nullptr;
    char buf[4096];
    if (getpwuid_r(n, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) {
      name = found->pw_name;
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = unix_users_.find(*uid);
  if (it == unix_users_.end() && !name.empty()) it = unix_users_.find(name);
  if (it == unix_users_.end()) return std::nullopt;
  return it->second;
}

namespace {

// What a forwarded caller's stamp covers: the caller's fields (the stamp's number makes it
// good for one call).
std::string ForwardedBody(const peer::v1::ForwardedCaller& c) {
  return absl::StrCat(c.principal(), absl::string_view("\0", 1), c.tenant(),
                      absl::string_view("\0", 1), c.role());
}

absl::string_view Metadata(const grpc::ServerContextBase& context, absl::string_view key) {
  auto it = context.client_metadata().find(std::string(key));
  if (it == context.client_metadata().end()) return {};
  return absl::string_view(it->second.data(), it->second.size());
}

}  // namespace

absl::Status Authenticator::StillValid(const grpc::ServerContextBase* context,
                                       const Caller& caller) const {
  if (open() || !Metadata(*context, kForwardedCallerKey).empty()) return absl::OkStatus();
  std::string why;
  auto now = Identify(*context, &why);
  if (!now.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat("credentials revoked while the call ran: ", now.status().message()));
  }
  if (now->principal != caller.principal || now->tenant != caller.tenant ||
      now->role != caller.role) {
    return absl::UnauthenticatedError(
        "the caller's credentials changed while the call ran (principal, tenant or role)");
  }
  return absl::OkStatus();
}

uint64_t Authenticator::WatchRevocation(const grpc::ServerContextBase* context,
                                        std::function<void()> revoked) const {
  if (open() || !Metadata(*context, kForwardedCallerKey).empty()) return 0;
  std::string why;
  auto caller = Identify(*context, &why);
  if (!caller.ok()) {  // Gone already (the call was checked a moment ago).
    revoked();
    return 0;
  }
  absl::MutexLock lock(&watches_mu_);
  const uint64_t id = next_watch_++;
  watches_.emplace(id, Watched{context, *std::move(caller), std::move(revoked)});
  return id;
}

void Authenticator::Unwatch(uint64_t id) const {
  if (id == 0) return;
  absl::MutexLock lock(&watches_mu_);
  watches_.erase(id);
}

void Authenticator::SweepRevoked() const {
  // Under the lock, so that Unwatch returns only once no callback of its call runs.
  absl::MutexLock lock(&watches_mu_);
  for (auto it = watches_.begin(); it != watches_.end();) {
    if (StillValid(it->second.context, it->second.caller).ok()) {
      ++it;
      continue;
    }
    it->second.revoked();
    watches_.erase(it++);
  }
}

absl::StatusOr<Caller> Authenticator::Identify(const grpc::ServerContextBase& context,
                                               std::string* why) const {
  // A caller asserted by the peer that forwarded the call.
  if (absl::string_view asserted = Metadata(context, kForwardedCallerKey); !asserted.empty()) {
    peer::v1::ForwardedCaller c;
    if (peers_ == nullptr) {
      *why = "UNAUTHENTICATED: a forwarded caller this node cannot check";
      return absl::UnauthenticatedError(
          "a forwarded caller, but this node has no cluster secret to check it with");
    }
    if (!c.ParseFromArray(asserted.data(), static_cast<int>(asserted.size()))) {
      *why = "UNAUTHENTICATED: a malformed forwarded caller";
      return absl::UnauthenticatedError(
          absl::StrCat("the forwarded caller (", kForwardedCallerKey,
                       ") does not parse as a ForwardedCaller: not sent by a gpumove node"));
    }
    auto from = peers_->Check(kForwardedCallerMethod, ForwardedBody(c), c.stamp());
    if (!from.ok()) {
      *why = "UNAUTHENTICATED: a forwarded caller without the cluster's stamp";
      return from.status();
    }
    Caller caller{c.principal(), c.tenant(), Role::kUser};
    if (c.role() == "admin") caller.role = Role::kAdmin;
    if (c.role() == "reader") caller.role = Role::kReader;
    return caller;
  }
  absl::string_view header = Metadata(context, "authorization");
  if (!tokens_path_.empty() && absl::StartsWith(header, kBearer)) {
    const std::string token(absl::StripAsciiWhitespace(header.substr(kBearer.size())));
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) {
      *why = "UNAUTHENTICATED: unknown token";
      return absl::UnauthenticatedError("the bearer token is not valid here");
    }
    return it->second;
  }
  if (!certs_path_.empty()) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    std::vector<std::string> names;
    if (auth != nullptr) {
      for (const char* property : {"x509_subject_alternative_name", "x509_common_name"}) {
        for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
          names.emplace_back(v.data(), v.size());
        }
      }
    }
    if (!names.empty()) {
      absl::MutexLock lock(&mu_);
      for (const std::string& n : names) {
        auto it = certs_.find(n);
        if (it != certs_.end()) return it->second;
      }
      *why =
          absl::StrCat("UNAUTHENTICATED: client certificate ", names.back(), " has no principal");
      return absl::UnauthenticatedError(absl::StrCat(
          "the client certificate (", Quoted(names.back()), ") names no principal here"));
    }
  }
  if (!unix_path_.empty()) {
    std::string uid;
    if (std::optional<Caller> c = UnixCaller(context, &uid)) return *std::move(c);
    if (!uid.empty()) {
      *why = absl::StrCat("UNAUTHENTICATED: unix socket uid ", uid, " has no principal");
      return absl::UnauthenticatedError(
          absl::StrCat("uid ", uid, " names no principal here (--unix_socket_principals)"));
    }
  }
  *why = "UNAUTHENTICATED: no credentials";
  std::vector<absl::string_view> ways;
  if (!tokens_path_.empty()) ways.push_back("a bearer token (authorization: Bearer ...)");
  if (!certs_path_.empty()) ways.push_back("a client certificate it knows");
  if (!unix_path_.empty()) ways.push_back("a unix socket connection from a uid it knows");
  return absl::UnauthenticatedError(
      absl::StrCat("this daemon needs ", absl::StrJoin(ways, " or ")));
}

absl::StatusOr<Caller> Authenticator::Check(const grpc::ServerContextBase* context, Access access,
                                            absl::string_view method) const {
  if (open()) return Caller{kAnonymous, kAnonymous, Role::kUser};
  if (context == nullptr) return absl::UnauthenticatedError("no call to check");
  const std::string peer = context->peer();
  std::string why;
  auto identified = Identify(*context, &why);
  if (!identified.ok()) {
    Audit(method, "", "", why, peer);
    return identified.status();
  }
  const Caller& caller = *identified;
  if (access == Access::kChange && caller.role == Role::kReader) {
    Audit(method, caller.principal, caller.tenant, "PERMISSION_DENIED: reader", peer);
    return absl::PermissionDeniedError(
        absl::StrCat(Quoted(caller.principal), " is a reader: ", method, " changes things"));
  }
  if (access == Access::kChange && caller.role == Role::kAdmin) {
    Audit(method, caller.principal, caller.tenant, "admin", peer);
  }
  return caller;
}

void Authenticator::Forward(const grpc::ServerContextBase& from, uint64_t to_incarnation,
                            grpc::ClientContext* to) const {
  absl::string_view header = Metadata(from, "authorization");
  if (!header.empty()) to->AddMetadata("authorization", std::string(header));
  if (peers_ == nullptr || open()) return;
  std::string why;
  auto caller = Identify(from, &why);
  if (!caller.ok()) return;  // The node the call goes to refuses it.
  peer::v1::ForwardedCaller c;
  c.set_principal(caller->principal);
  c.set_tenant(caller->tenant);
  c.set_role(RoleName(caller->role));
  c.set_stamp(peers_->Stamp(kForwardedCallerMethod, ForwardedBody(c), to_incarnation).stamp);
  to->AddMetadata(kForwardedCallerKey, c.SerializeAsString());
}

}  // namespace gpumove
