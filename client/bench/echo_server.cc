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

}  // namespace

pid_t StartEchoServer(const std::string& listen, std::string* address) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    EchoService service;
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
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
