// What answers on the daemon's sockets while it starts (pools, paths, cluster): the
// sockets are bound first, so a second daemon on the same address fails at once and a
// client or probe learns that this one is coming. Health answers NOT_SERVING and every
// other call UNAVAILABLE "gpumoved is starting (<step>)", both with the step in the
// trailing metadata kStartingKey. When the daemon's server is built, the listeners move
// to it and Stop sends this server's connections GOAWAY: their clients reconnect there.
#ifndef GPUMOVE_DAEMON_SERVER_STARTING_SERVER_H_
#define GPUMOVE_DAEMON_SERVER_STARTING_SERVER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/server/listeners.h"

namespace gpumove {

// The trailing metadata key naming the step a starting daemon is in.
inline constexpr char kStartingKey[] = "gpumove-starting";

class StartingServer : private grpc::CallbackGenericService {
 public:
  // Serves `listeners` (bound, not accepting yet) with `tcp` credentials on TCP sockets.
  static absl::StatusOr<std::unique_ptr<StartingServer>> Start(
      Listeners& listeners, std::shared_ptr<grpc::ServerCredentials> tcp);
  ~StartingServer() override;
  StartingServer(const StartingServer&) = delete;
  StartingServer& operator=(const StartingServer&) = delete;

  // What the daemon is doing now, as answers say it ("setting up memory pools").
  void SetStep(absl::string_view step);
  // Ends the server's connections (GOAWAY) and, after a short grace, its open health
  // watches; idempotent. The listeners must have been paused or moved first.
  void Stop();

 private:
  class Call;
  StartingServer() = default;
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;
  std::string Step() const;

  mutable absl::Mutex mu_;
  std::string step_ ABSL_GUARDED_BY(mu_) = "starting";
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_STARTING_SERVER_H_
