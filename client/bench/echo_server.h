// A bare gRPC unary echo server in a child process: the benchmarks' baseline for what one
// round trip costs (the daemon pays the same process boundary).
#ifndef GPUMOVE_CLIENT_BENCH_ECHO_SERVER_H_
#define GPUMOVE_CLIENT_BENCH_ECHO_SERVER_H_

#include <sys/types.h>

#include <string>

namespace gpumove {

// Forks a child serving gpumove.bench.Echo on `listen` (host:0 or unix:/path); `address`
// gets the bound address; `callback`: on gRPC's callback API rather than the synchronous
// server. Call before this process creates any gRPC state. -1 on error.
pid_t StartEchoServer(const std::string& listen, std::string* address, bool callback = false);

// Kills the echo server `pid` and reaps it.
void StopEchoServer(pid_t pid);

}  // namespace gpumove

#endif  // GPUMOVE_CLIENT_BENCH_ECHO_SERVER_H_
