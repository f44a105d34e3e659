// Who is calling. Until tokens and mTLS land every caller is "anonymous"; the data model
// already records owners, so authorization changes only this function.
#ifndef GPUMOVE_DAEMON_SERVER_AUTH_H_
#define GPUMOVE_DAEMON_SERVER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <string>

namespace gpumove {

inline constexpr char kAnonymous[] = "anonymous";

inline std::string Principal(const grpc::ServerContext* /*context*/) { return kAnonymous; }

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_AUTH_H_
