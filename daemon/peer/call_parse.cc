#include "daemon/peer/call_parse.h"

#include <algorithm>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/quote.h"

namespace gpumove {
namespace {

// Whether a request can be served without blocking (on the transport's progress thread):
// holds and acknowledgements that wait for nothing, and path calls registered so (taking
// stage slots takes them or says there is no room). GPU copies and MPI halves may wait.
bool AtOnce(const PeerHandler& handler, const peer::v1::PathCallRequest& r) {
  return handler.AnswersAtOnce(r);
}
template <class Batch>
bool EveryItemAtOnce(const PeerHandler& handler, const Batch& batch) {
  for (const auto& item : batch.items()) {
    if (!handler.AnswersAtOnce(item)) return false;
  }
  return true;
}
bool AtOnce(const PeerHandler& handler, const peer::v1::PrepareRemoteBatchRequest& r) {
  return EveryItemAtOnce(handler, r);
}
bool AtOnce(const PeerHandler& handler, const peer::v1::CompleteRemoteBatchRequest& r) {
  return EveryItemAtOnce(handler, r);
}

// Parses the request (once): the call runs the handler on it and serializes the response.
template <class Request, class Response>
absl::StatusOr<ParsedPeerCall> Parse(PeerHandler* handler,
                                     absl::Status (PeerHandler::*method)(const Request&, Response*),
                                     const std::string& body) {
  auto request = std::make_shared<Request>();
  if (!request->ParseFromString(body)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", Request::descriptor()->name(), " in a peer call"));
  }
  ParsedPeerCall call;
  call.at_once = AtOnce(*handler, *request);
  call.run = [handler, method, request](const PeerReply& reply) {
    Response response;
    const absl::Status st = (handler->*method)(*request, &response);
    if (!st.ok()) {
      reply(absl::Status(st.code(), Bounded(st.message())), {});
      return;
    }
    reply(absl::OkStatus(), response.SerializeAsString());
  };
  return call;
}

}  // namespace

absl::StatusOr<ParsedPeerCall> ParsePeerCall(PeerHandler* s, uint32_t method,
                                             const std::string& body) {
  switch (static_cast<PeerMethod>(method)) {
    case PeerMethod::kPrepareRemoteBatch:
      return Parse(s, &PeerHandler::PrepareRemoteBatch, body);
    case PeerMethod::kCompleteRemoteBatch:
      return Parse(s, &PeerHandler::CompleteRemoteBatch, body);
    case PeerMethod::kPathCall:
      return Parse(s, &PeerHandler::PathCall, body);
  }
  return absl::UnimplementedError(absl::StrCat("no peer call number ", method));
}

std::optional<PeerId> ParsePeerKey(absl::string_view key) {
  const size_t hash = key.rfind('#');
  if (hash == absl::string_view::npos || hash == 0) return std::nullopt;
  const absl::string_view digits = key.substr(hash + 1);
  PeerId id;
  if (digits.empty() || digits.size() > 20 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &id.incarnation)) {
    return std::nullopt;
  }
  id.node = std::string(key.substr(0, hash));
  return id;
}

}  // namespace gpumove
