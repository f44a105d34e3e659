// The C++ client in one page: connect, allocate two buffers, write bytes into one, move
// them to the other with a checksum, read them back, release both.
//
//   bazel run //examples/cpp:hello_move -- 127.0.0.1:7470
//
// docs/cpp.md walks through it; examples/cpp/hello_move_test.sh runs it against a daemon.
#include <cstdlib>
#include <iostream>
#include <string>

#include "client/gpumove_client.h"

int main(int argc, char** argv) {
  const char* env = std::getenv("GPUMOVE_ADDR");
  const std::string addr = argc > 1 ? argv[1] : env != nullptr ? env : "127.0.0.1:7470";
  auto client = gpumove::Client::Connect(addr);  // ConnectOptions: token, TLS, timeout.
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }
  gpumove::Client& c = **client;

  auto src = c.Allocate(1 << 20);  // HOST memory; v1::PINNED_HOST or v1::DEVICE, GPU 0.
  auto dst = c.Allocate(1 << 20, gpumove::v1::PINNED_HOST, 0, absl::Minutes(5), "hello");
  if (!src.ok() || !dst.ok()) {
    std::cerr << (src.ok() ? dst.status() : src.status()) << "\n";
    return 1;
  }
  const std::string bytes(1 << 20, 'g');
  if (auto w = c.Write(gpumove::Ref(src->id()), bytes); !w.ok()) {
    std::cerr << w.status() << "\n";
    return 1;
  }
  // Waits for the end; the state says how it ended (an RPC error is the status).
  auto t = c.Move(gpumove::Ref(src->id()), gpumove::Ref(dst->id()), {.checksum = true});
  if (!t.ok() || t->state() != gpumove::v1::SUCCEEDED) {
    std::cerr << (t.ok() ? t->error_message() : t.status().ToString()) << "\n";
    return 1;
  }
  auto back = c.Read(gpumove::Ref(dst->id()));
  const bool same = back.ok() && *back == bytes;
  std::cout << "moved " << t->length() << " bytes " << src->id() << " -> " << dst->id()
            << " over " << gpumove::v1::Path_Name(t->path()) << ", read back "
            << (same ? "equal" : "DIFFERENT") << "\n";
  (void)c.Release(src->id());
  (void)c.Release(dst->id());
  return same ? 0 : 1;
}
