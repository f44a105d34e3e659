// A peer call as a channel carries it (a method number and the request's bytes), parsed
// once into the handler's run over it. Channel-neutral: the UCX call channel
// (daemon/path/ucx/ucx_peer_calls.h) frames, stamps and carries the bytes.
#ifndef GPUMOVE_DAEMON_PEER_CALL_PARSE_H_
#define GPUMOVE_DAEMON_PEER_CALL_PARSE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/core/engine.h"
#include "daemon/peer/peer_handler.h"

namespace gpumove {

// Answers a call: its status, and the serialized response when OK.
using PeerReply = std::function<void(const absl::Status&, std::string)>;

// The node and incarnation a peer key ("node#incarnation") names; nullopt for none.
std::optional<PeerId> ParsePeerKey(absl::string_view key);

// A peer call's request, parsed once: whether it can be served without blocking (on the
// transport's progress thread, saving the hand-off to a serving thread and back), and
// the handler's run over it, which answers through the reply.
struct ParsedPeerCall {
  bool at_once = false;
  std::function<void(const PeerReply&)> run;
};
// INVALID_ARGUMENT for a body that does not parse as `method`'s request, UNIMPLEMENTED for
// a method number that is not a peer call.
absl::StatusOr<ParsedPeerCall> ParsePeerCall(PeerHandler* handler, uint32_t method,
                                             const std::string& body);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_CALL_PARSE_H_
