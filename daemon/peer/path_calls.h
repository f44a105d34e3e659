// The paths' own peer calls, by path and method name: each path registers its handlers
// at start-up (from the composition root) and the peer handler serves them through one
// generic call (PeerService.PathCall), so that it names no path.
#ifndef GPUMOVE_DAEMON_PEER_PATH_CALLS_H_
#define GPUMOVE_DAEMON_PEER_PATH_CALLS_H_

#include <functional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gpumove {

// Who makes a path call: a peer this node met, at that incarnation (checked before any
// handler runs).
struct PathCaller {
  std::string node;
  uint64_t incarnation = 0;
};

// Reads `body` (the path's own request, serialized; hostile until checked) and returns
// the path's response, serialized, or an error with the code the caller is to see.
using PathCallHandler =
    std::function<absl::StatusOr<std::string>(const PathCaller& caller, absl::string_view body)>;

class PathCalls {
 public:
  // Longest path or method name, and largest body, a call may carry.
  static constexpr size_t kMaxName = 64;
  static constexpr size_t kMaxBody = size_t{4} << 20;

  struct Entry {
    // The handler never blocks (no copy, no wait), so a thread that must not wait may run
    // it (the UCX channel's progress thread).
    bool at_once = false;
    PathCallHandler handler;
  };

  // Adds `path`'s `method`. INVALID_ARGUMENT for an empty or too long name, ALREADY_EXISTS
  // when registered already. Every registration comes before the calls are served.
  absl::Status Register(const std::string& path, const std::string& method, bool at_once,
                        PathCallHandler handler);
  // The entry for `path`'s `method`; null when none is registered.
  const Entry* Find(absl::string_view path, absl::string_view method) const;

 private:
  absl::flat_hash_map<std::pair<std::string, std::string>, Entry> entries_;
};

// Registers a handler of a path's own message types: the body is parsed as `Request`
// (INVALID_ARGUMENT when it does not parse) and the `Response` serialized.
template <class Request, class Response>
absl::Status RegisterPathCall(
    PathCalls* calls, const std::string& path, const std::string& method, bool at_once,
    std::function<absl::Status(const PathCaller&, const Request&, Response*)> serve) {
  return calls->Register(
      path, method, at_once,
      [serve = std::move(serve), path, method](
          const PathCaller& caller, absl::string_view body) -> absl::StatusOr<std::string> {
        Request request;
        if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "malformed ", Request::descriptor()->name(), " in path call ", path, ".", method));
        }
        Response response;
        if (absl::Status st = serve(caller, request, &response); !st.ok()) return st;
        return response.SerializeAsString();
      });
}

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_PATH_CALLS_H_
