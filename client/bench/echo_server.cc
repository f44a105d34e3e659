#include "client/bench/echo_server.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "client/bench/echo.grpc.pb.h"

namespace gpumove {
namespace {

class EchoService final : public bench::Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const bench::EchoMessage* in,
                    bench::EchoMessage* out) override {
    *out = *in;
    return grpc::Status::OK;
  }
};

// The same echo on gRPC's callback API: the handler runs on the thread that read the
// request, with no hand-off to a synchronous-server worker.
class CallbackEchoService final : public bench::Echo::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                 const bench::EchoMessage* in, bench::EchoMessage* out) override {
    *out = *in;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

}  // namespace

pid_t StartEchoServer(const std::string& listen, std::string* address, bool callback) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    EchoService sync_service;
    CallbackEchoService callback_service;
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
    if (callback) {
      builder.RegisterService(&callback_service);
    } else {
      builder.RegisterService(&sync_service);
    }
    auto server = builder.BuildAndStart();
    const std::string bound =
        listen.rfind("unix:", 0) == 0 ? listen : absl::StrCat("127.0.0.1:", port);
    (void)!write(fds[1], bound.data(), bound.size());
    close(fds[1]);
    server->Wait();
    _exit(0);
  }
  close(fds[1]);
  char buf[256] = {};
  const ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  *address = std::string(buf, n > 0 ? n : 0);
  return pid;
}

void StopEchoServer(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

}  // namespace gpumove
