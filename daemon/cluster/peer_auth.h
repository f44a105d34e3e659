// Peer authentication with a secret every node of the cluster holds (--cluster_secret_file):
// each daemon-to-daemon call, over gRPC or UCX active messages, carries a CallStamp with
// an HMAC-SHA256 over the call, and each answer an HMAC over the call's mac and the
// response. A call is refused (UNAUTHENTICATED) when its mac is wrong, when its clock is
// further than max_skew from ours, when it was meant for an earlier incarnation of this
// node, or when its number was seen before from the same caller incarnation (a replay).
//
// Holding the secret is what makes a process a member: every member can speak as any
// node. The data plane (UCX RMA, CUDA IPC, MPI) is not covered; docs/security.md says
// what the cluster network must therefore protect.
#ifndef GPUMOVE_DAEMON_CLUSTER_PEER_AUTH_H_
#define GPUMOVE_DAEMON_CLUSTER_PEER_AUTH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"

namespace gpumove {

// The metadata keys of the stamp and of the answer's mac on gRPC calls.
inline constexpr char kPeerStampKey[] = "x-gpumove-peer-stamp-bin";
inline constexpr char kPeerReplyKey[] = "x-gpumove-peer-reply-bin";
// The method number Hello is signed as (the moving side's calls are numbered from 1).
inline constexpr uint32_t kHelloMethod = 0;
// The method number a forwarded public call's caller is signed as.
inline constexpr uint32_t kForwardedCallerMethod = 1000;
// Call numbers at or past this are refused: a caller counts its calls from 1 and never
// gets near it, and a number that high would make the caller's later calls look old.
inline constexpr uint64_t kMaxCallNumber = uint64_t{1} << 62;
// Secrets shorter than this are refused.
inline constexpr size_t kMinClusterSecret = 16;

// The secret in `path`, trailing whitespace removed: NOT_FOUND / PERMISSION_DENIED when it
// cannot be read, INVALID_ARGUMENT when shorter than kMinClusterSecret bytes.
absl::StatusOr<std::string> ReadClusterSecret(const std::string& path);
// The secret in `text` (a secret file's contents), as ReadClusterSecret; `path` for
// messages. With `may_be_empty`, a file of only whitespace is no secret ("").
absl::StatusOr<std::string> ParseClusterSecret(std::string text, const std::string& path,
                                               bool may_be_empty = false);

class PeerAuth {
 public:
  // Calls are stamped as `node` at `incarnation`; replays are caught among calls up to
  // `window` numbers apart from the same caller (more than any number of calls in flight).
  PeerAuth(std::string secret, std::string node, uint64_t incarnation,
           absl::Duration max_skew = absl::Minutes(2), uint64_t window = uint64_t{1} << 18);
  PeerAuth(const PeerAuth&) = delete;
  PeerAuth& operator=(const PeerAuth&) = delete;

  struct Stamped {
    std::string stamp;  // Serialized CallStamp.
    std::string mac;    // Its mac, which the answer's is made with.
  };
  // The stamp of a call of `method` with `body` to a node at `to_incarnation` (0: not
  // known yet), made at `at` (another time than now only in tests).
  // From now on: calls and answers are signed with `signing`, and those signed with it or
  // with `accepted` (empty: none) are taken. Rotating a secret without a restart is
  // three steps on every node: the new one accepted, then signing (the old accepted),
  // then the old one dropped.
  void SetSecrets(std::string signing, std::string accepted);

  // `seq`: the call's number (0: the next; another only in tests).
  Stamped Stamp(uint32_t method, absl::string_view body, uint64_t to_incarnation,
                absl::Time at = absl::Now(), uint64_t seq = 0);

  struct Caller {
    std::string node;
    uint64_t incarnation = 0;
    std::string mac;  // The call's mac, to sign the answer with.
  };
  // The caller of a call of `method` with `body` stamped `stamp`; UNAUTHENTICATED saying
  // why not.
  absl::StatusOr<Caller> Check(uint32_t method, absl::string_view body, absl::string_view stamp);

  // The mac of the answer `reply` to the call whose mac is `call_mac`, and its check.
  std::string SignReply(absl::string_view call_mac, absl::string_view reply) const;
  bool CheckReply(absl::string_view call_mac, absl::string_view reply, absl::string_view mac) const;

  // Calls refused since start.
  uint64_t refused() const { return refused_; }

 private:
  // The numbers seen from one caller incarnation: the highest, and which of the `window`
  // below it.
  struct Seen {
    uint64_t highest = 0;
    std::vector<uint64_t> bits;
    absl::Time last = absl::InfinitePast();
  };
  struct Secrets {
    std::string signing, accepted;
  };
  std::shared_ptr<const Secrets> secrets() const ABSL_LOCKS_EXCLUDED(secrets_mu_);
  // The mac of `data` with the signing secret, and whether `mac` is that of `data` with
  // the signing or the accepted secret.
  std::string Mac(absl::string_view data) const;
  bool MacMatches(absl::string_view data, absl::string_view mac) const;
  absl::Status Refuse(std::string why);
  enum class Sight { kFirst, kSeen, kTooOld };
  // kSeen when `seq` was seen from that caller, kTooOld when it is too far below the
  // highest seen to tell.
  Sight FirstSight(const std::string& node, uint64_t incarnation, uint64_t seq)
      ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex secrets_mu_;
  std::shared_ptr<const Secrets> secrets_ ABSL_GUARDED_BY(secrets_mu_);
  const std::string node_;
  const uint64_t incarnation_;
  const absl::Duration max_skew_;
  const uint64_t window_;
  std::atomic<uint64_t> next_seq_{1};
  std::atomic<uint64_t> refused_{0};
  absl::Mutex mu_;
  absl::flat_hash_map<std::pair<std::string, uint64_t>, Seen> seen_ ABSL_GUARDED_BY(mu_);
  absl::Time pruned_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

// A gRPC peer call's stamp, added to `context` (nothing without `auth`); returns the
// call's mac for AnswerSigned.
std::string StampGrpcCall(PeerAuth* auth, uint32_t method, const google::protobuf::Message& request,
                          uint64_t to_incarnation, grpc::ClientContext* context);
// Whether the answer of a call made with StampGrpcCall carries the cluster's mac (always,
// without `auth`).
bool AnswerSigned(const PeerAuth* auth, absl::string_view call_mac,
                  const google::protobuf::Message& response, const grpc::ClientContext& context);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CLUSTER_PEER_AUTH_H_
