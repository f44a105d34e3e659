// gRPC server reflection for the public API, both grpc.reflection.v1 (what grpcurl and buf
// ask first) and v1alpha (the same messages under another package name), as a generic
// callback service: Debian's gRPC 1.51 serves only v1alpha, lists every service of the
// server (the peer protocol too, which no client can call) and checks no credentials.
// Only the files that the listed services need are described; anything else is NOT_FOUND.
// A stream holds no thread: each request is answered on gRPC's callback threads.
#ifndef GPUMOVE_DAEMON_SERVER_REFLECTION_H_
#define GPUMOVE_DAEMON_SERVER_REFLECTION_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "proto/grpc/reflection/v1/reflection.pb.h"

namespace gpumove {

class Reflection : public grpc::CallbackGenericService {
 public:
  // Who may ask: OK, or the status the stream ends with (UNAUTHENTICATED, ...).
  using Check = std::function<grpc::Status(grpc::CallbackServerContext*)>;

  // `services`: the full names listed and described (each must be in the generated pool).
  // `check`: asked once per stream before anything is answered; null: anyone.
  static absl::StatusOr<std::unique_ptr<Reflection>> Make(std::vector<std::string> services,
                                                          Check check);

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

  // The answer to one request (exposed for tests); `sent`: the files this stream has sent,
  // which are not sent again.
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request,
      absl::flat_hash_set<std::string>& sent) const;

 private:
  class Stream;
  Reflection(std::vector<std::string> services, absl::flat_hash_set<std::string> files, Check check)
      : services_(std::move(services)), files_(std::move(files)), check_(std::move(check)) {}
  // The file named (or declaring what is asked for) with the dependencies not yet sent;
  // NOT_FOUND for a file outside files_.
  void Describe(const google::protobuf::FileDescriptor* file, const std::string& what,
                absl::flat_hash_set<std::string>& sent,
                grpc::reflection::v1::ServerReflectionResponse& response) const;

  const std::vector<std::string> services_;
  const absl::flat_hash_set<std::string> files_;  // The services' files and their imports.
  const Check check_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_REFLECTION_H_
