#include "daemon/server/auth.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/core/buffer_registry.h"

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

absl::StatusOr<absl::flat_hash_map<std::string, Caller>> ParseTokenFile(absl::string_view text) {
  absl::flat_hash_map<std::string, Caller> out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    if (fields.size() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", number, ": ", fields.size(), " fields, not 4 (token,principal,tenant,role)"));
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
    if (!out.emplace(std::string(token), std::move(c)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": the same token as an earlier line"));
    }
  }
  return out;
}

std::unique_ptr<Authenticator> Authenticator::Open() {
  return std::unique_ptr<Authenticator>(new Authenticator());
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromTokenFile(
    const std::string& path, absl::Duration refresh) {
  std::unique_ptr<Authenticator> a(new Authenticator());
  a->path_ = path;
  Authenticator* self = a.get();
  auto watcher = WatchedFiles::Start(
      {path}, refresh, "token file", [self, path](const std::vector<std::string>& contents) {
        auto tokens = ParseTokenFile(contents[0]);
        if (!tokens.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": ", tokens.status().message()));
        }
        absl::MutexLock lock(&self->mu_);
        self->tokens_ = *std::move(tokens);
        return absl::OkStatus();
      });
  if (!watcher.ok()) return watcher.status();
  a->watcher_ = *std::move(watcher);
  return a;
}

absl::StatusOr<Caller> Authenticator::Check(const grpc::ServerContext* context, Access access,
                                            absl::string_view method) const {
  if (open()) return Caller{kAnonymous, kAnonymous, Role::kUser};
  const std::string peer = context != nullptr ? context->peer() : "";
  absl::string_view header;
  if (context != nullptr) {
    auto it = context->client_metadata().find("authorization");
    if (it != context->client_metadata().end()) {
      header = absl::string_view(it->second.data(), it->second.size());
    }
  }
  if (!absl::StartsWith(header, kBearer)) {
    Audit(method, "", "", "UNAUTHENTICATED: no bearer token", peer);
    return absl::UnauthenticatedError(
        "this daemon needs a bearer token (authorization: Bearer ...)");
  }
  const std::string token(absl::StripAsciiWhitespace(header.substr(kBearer.size())));
  Caller caller;
  {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) {
      Audit(method, "", "", "UNAUTHENTICATED: unknown token", peer);
      return absl::UnauthenticatedError("the bearer token is not valid here");
    }
    caller = it->second;
  }
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

void CopyCredentials(const grpc::ServerContext& from, grpc::ClientContext* to) {
  auto it = from.client_metadata().find("authorization");
  if (it != from.client_metadata().end()) {
    to->AddMetadata("authorization", std::string(it->second.data(), it->second.size()));
  }
}

}  // namespace gpumove
