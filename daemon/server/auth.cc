#include "daemon/server/auth.h"

#include <fstream>
#include <sstream>
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
  if (absl::Status st = a->Reload(/*first=*/true); !st.ok()) return st;
  Authenticator* self = a.get();
  a->thread_ = std::thread([self, refresh] { self->Loop(refresh); });
  return a;
}

Authenticator::~Authenticator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status Authenticator::Reload(bool first) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the token file ", path_));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str() == seen_) return absl::OkStatus();
  seen_ = text.str();
  auto tokens = ParseTokenFile(seen_);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", tokens.status().message()));
  }
  absl::MutexLock lock(&mu_);
  tokens_ = *std::move(tokens);
  if (!first) ++reloads_;
  return absl::OkStatus();
}

void Authenticator::Loop(absl::Duration refresh) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), refresh)) return;
    }
    const int before = reloads();
    if (absl::Status st = Reload(/*first=*/false); !st.ok()) {
      {
        absl::MutexLock lock(&mu_);
        ++refused_;
      }
      LOG(ERROR) << "token file refused, the tokens before it kept: " << st.message();
    } else if (reloads() != before) {
      LOG(INFO) << "token file reloaded: " << path_;
    }
  }
}

int Authenticator::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}

int Authenticator::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
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
