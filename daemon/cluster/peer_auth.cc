#include "daemon/cluster/peer_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {
namespace {

constexpr char kCallContext[] = "gpumove-peer-call-v1";
constexpr char kReplyContext[] = "gpumove-peer-reply-v1";
constexpr size_t kMacBytes = 32;

void Append(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 8);
}

// What a call's mac covers, each field of fixed size or preceded by its length.
std::string CallData(uint32_t method, const peer::v1::CallStamp& s, absl::string_view body) {
  std::string d(kCallContext, sizeof(kCallContext));
  d.reserve(d.size() + 56 + s.node().size() + body.size());
  Append(&d, method);
  Append(&d, s.incarnation());
  Append(&d, s.to_incarnation());
  Append(&d, s.seq());
  Append(&d, static_cast<uint64_t>(s.unix_ms()));
  Append(&d, s.node().size());
  d.append(s.node());
  d.append(body.data(), body.size());
  return d;
}

}  // namespace

absl::StatusOr<std::string> ReadClusterSecret(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the cluster secret ", Quoted(path), ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseClusterSecret(text.str(), path);
}

absl::StatusOr<std::string> ParseClusterSecret(std::string secret, const std::string& path,
                                               bool may_be_empty) {
  absl::StripTrailingAsciiWhitespace(&secret);
  if (secret.empty() && may_be_empty) return secret;
  if (secret.size() < kMinClusterSecret) {
    return absl::InvalidArgumentError(absl::StrCat("the cluster secret in ", Quoted(path), " has ",
                                                   secret.size(), " bytes; at least ",
                                                   kMinClusterSecret,
                                                   " (e.g. openssl rand "
                                                   "-hex 32)"));
  }
  return secret;
}

PeerAuth::PeerAuth(std::string secret, std::string node, uint64_t incarnation,
                   absl::Duration max_skew, uint64_t window)
    : node_(std::move(node)),
      incarnation_(incarnation),
      max_skew_(max_skew),
      window_(std::max<uint64_t>(64, (window + 63) / 64 * 64)) {
  SetSecrets(std::move(secret), "");
}

void PeerAuth::SetSecrets(std::string signing, std::string accepted) {
  auto s = std::make_shared<const Secrets>(Secrets{std::move(signing), std::move(accepted)});
  absl::MutexLock lock(&secrets_mu_);
  secrets_ = std::move(s);
}

std::shared_ptr<const PeerAuth::Secrets> PeerAuth::secrets() const {
  absl::MutexLock lock(&secrets_mu_);
  return secrets_;
}

namespace {

std::string HmacSha256(const std::string& key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

}  // namespace

std::string PeerAuth::Mac(absl::string_view data) const {
  return HmacSha256(secrets()->signing, data);
}

bool PeerAuth::MacMatches(absl::string_view data, absl::string_view mac) const {
  if (mac.size() != kMacBytes) return false;
  const std::shared_ptr<const Secrets> s = secrets();
  for (const std::string* key : {&s->signing, &s->accepted}) {
    if (key->empty()) continue;
    const std::string want = HmacSha256(*key, data);
    if (CRYPTO_memcmp(want.data(), mac.data(), kMacBytes) == 0) return true;
  }
  return false;
}

PeerAuth::Stamped PeerAuth::Stamp(uint32_t method, absl::string_view body, uint64_t to_incarnation,
                                  absl::Time at, uint64_t seq) {
  peer::v1::CallStamp s;
  s.set_node(node_);
  s.set_incarnation(incarnation_);
  s.set_to_incarnation(to_incarnation);
  s.set_seq(seq != 0 ? seq : next_seq_.fetch_add(1, std::memory_order_relaxed));
  s.set_unix_ms(absl::ToUnixMillis(at));
  std::string mac = Mac(CallData(method, s, body));
  s.set_mac(mac);
  return {s.SerializeAsString(), std::move(mac)};
}

absl::Status PeerAuth::Refuse(std::string why) {
  const uint64_t n = ++refused_;
  // Refusals are logged, but not every one of a flood.
  if (n <= 10 || n % 1000 == 0) {
    LOG(WARNING) << "peer call refused (" << n << " so far): " << why;
  }
  return absl::UnauthenticatedError(std::move(why));
}

absl::StatusOr<PeerAuth::Caller> PeerAuth::Check(uint32_t method, absl::string_view body,
                                                 absl::string_view stamp) {
  if (stamp.empty()) {
    return Refuse(
        "a peer call without the cluster's credentials (this node has "
        "--cluster_secret_file; its peers need the same secret)");
  }
  peer::v1::CallStamp s;
  if (!s.ParseFromArray(stamp.data(), static_cast<int>(stamp.size())) ||
      s.mac().size() != kMacBytes) {
    return Refuse("a peer call with a malformed stamp");
  }
  if (!MacMatches(CallData(method, s, body), s.mac())) {
    return Refuse(absl::StrCat("a peer call claiming node ", Quoted(s.node()),
                               " whose mac does not match (another cluster secret?)"));
  }
  const absl::Duration skew = absl::AbsDuration(absl::Now() - absl::FromUnixMillis(s.unix_ms()));
  if (skew > max_skew_) {
    return Refuse(absl::StrCat("a peer call from node ", Quoted(s.node()), " stamped ",
                               absl::FormatDuration(skew), " away from this node's clock (at most ",
                               absl::FormatDuration(max_skew_), ")"));
  }
  if (s.to_incarnation() != incarnation_ && (s.to_incarnation() != 0 || method != kHelloMethod)) {
    return Refuse(absl::StrCat("a peer call from node ", Quoted(s.node()),
                               " meant for another incarnation of this node"));
  }
  if (s.seq() == 0 || s.seq() >= kMaxCallNumber) {
    // A caller numbers its calls from 1, one at a time: no caller gets here. Taken, such a
    // number would make that caller's every later call look too old.
    return Refuse(absl::StrCat("a peer call from node ", Quoted(s.node()),
                               " numbered ", s.seq(), ", which no caller reaches"));
  }
  switch (FirstSight(s.node(), s.incarnation(), s.seq())) {
    case Sight::kFirst:
      break;
    case Sight::kSeen:
      return Refuse(absl::StrCat("a peer call from node ", Quoted(s.node()), " replayed (number ",
                                 s.seq(), " seen before)"));
    case Sight::kTooOld:
      return Refuse(absl::StrCat("a peer call from node ", Quoted(s.node()), " numbered ", s.seq(),
                                 ", more than ", window_,
                                 " calls behind its latest: too old to tell from a replay"));
  }
  return Caller{s.node(), s.incarnation(), s.mac()};
}

PeerAuth::Sight PeerAuth::FirstSight(const std::string& node, uint64_t incarnation,
                                     uint64_t seq) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  // Callers not heard from for longer than any stamp stays valid are forgotten: a replay
  // of their calls is refused by its clock.
  if (now - pruned_ > max_skew_) {
    for (auto it = seen_.begin(); it != seen_.end();) {
      if (now - it->second.last > 2 * max_skew_) {
        seen_.erase(it++);
      } else {
        ++it;
      }
    }
    pruned_ = now;
  }
  Seen& w = seen_[{node, incarnation}];
  w.last = now;
  if (w.bits.empty()) w.bits.assign(window_ / 64, 0);
  auto bit = [&](uint64_t n) -> uint64_t& { return w.bits[(n % window_) / 64]; };
  const uint64_t mask_of = 1;
  if (seq > w.highest) {
    // Numbers between the old highest and this one become unseen slots.
    if (seq - w.highest >= window_) {
      std::fill(w.bits.begin(), w.bits.end(), 0);
    } else {
      for (uint64_t n = w.highest + 1; n < seq; ++n) bit(n) &= ~(mask_of << (n % 64));
    }
    w.highest = seq;
    bit(seq) |= mask_of << (seq % 64);
    return Sight::kFirst;
  }
  if (w.highest - seq >= window_) return Sight::kTooOld;
  uint64_t& word = bit(seq);
  if (word & (mask_of << (seq % 64))) return Sight::kSeen;
  word |= mask_of << (seq % 64);
  return Sight::kFirst;
}

namespace {

std::string ReplyData(absl::string_view call_mac, absl::string_view reply) {
  std::string d(kReplyContext, sizeof(kReplyContext));
  d.append(call_mac.data(), call_mac.size());
  d.append(reply.data(), reply.size());
  return d;
}

}  // namespace

std::string PeerAuth::SignReply(absl::string_view call_mac, absl::string_view reply) const {
  return Mac(ReplyData(call_mac, reply));
}

bool PeerAuth::CheckReply(absl::string_view call_mac, absl::string_view reply,
                          absl::string_view mac) const {
  return MacMatches(ReplyData(call_mac, reply), mac);
}

std::string StampGrpcCall(PeerAuth* auth, uint32_t method, const google::protobuf::Message& request,
                          uint64_t to_incarnation, grpc::ClientContext* context) {
  if (auth == nullptr) return "";
  PeerAuth::Stamped s = auth->Stamp(method, request.SerializeAsString(), to_incarnation);
  context->AddMetadata(kPeerStampKey, s.stamp);
  return std::move(s.mac);
}

bool AnswerSigned(const PeerAuth* auth, absl::string_view call_mac,
                  const google::protobuf::Message& response, const grpc::ClientContext& context) {
  if (auth == nullptr) return true;
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kPeerReplyKey);
  if (it == trailers.end()) return false;
  return auth->CheckReply(call_mac, response.SerializeAsString(),
                          absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace gpumove
