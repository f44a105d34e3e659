// One gpumoved of a test cluster: its process and a client of it, started with fast
// heartbeats, and a wait for it to see its peers.
#ifndef GPUMOVE_TESTS_UTIL_TEST_NODE_H_
#define GPUMOVE_TESTS_UTIL_TEST_NODE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/gpumove_client.h"
#include "tests/util/daemon_process.h"

namespace gpumove {

struct TestNode {
  std::string name;
  std::unique_ptr<DaemonProcess> process;
  std::unique_ptr<Client> client;
};

// Starts node `name` with `flags` (after --node, --heartbeat=100ms and
// --peer_timeout=1500ms, which they may override), joining through `join` (an address;
// empty for the first node). A node that did not start has no process or client, and
// the test has failed.
TestNode LaunchNode(const std::string& name, const std::string& join,
                    std::vector<std::string> flags);

// Waits up to 20 s until `n` sees `want` peers up (at least `want` unless `exactly`);
// DEADLINE_EXCEEDED saying how many it saw.
absl::Status AwaitPeersUp(const TestNode& n, size_t want, bool exactly = false);

// A verified push of 1 MiB of random bytes (from `seed`) from a's host memory into b's,
// both buffers released after; failures are the test's.
void PushVerified(TestNode& a, TestNode& b, uint64_t seed);

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_TEST_NODE_H_
