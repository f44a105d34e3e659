// Fuzzes what a node does with a call message on its UCX call channel before anything is
// answered: the caller key it names, the framing, and the cluster stamp (CheckUcxCall and
// ParsePeerKey, as UcxPeerCalls::OnCall runs them). No input may crash or read past its
// bytes; no input the fuzzer can make without the secret may pass the stamp check; and a
// key that parses must name back exactly what it holds.
//
// Input: one byte of method, one byte of key length, the key, then the framed body (a
// 4-byte little-endian stamp length, the stamp, the body).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "daemon/cluster/peer_auth.h"
#include "daemon/path/ucx/ucx_peer_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gpumove::PeerAuth;
  static PeerAuth* auth = new PeerAuth("fuzz-cluster-secret-0123456789", "fuzz-self", 1);
  if (size < 2) return 0;
  const uint32_t method = data[0];
  const size_t key_length = std::min<size_t>(data[1], size - 2);
  const std::string key(reinterpret_cast<const char*>(data) + 2, key_length);
  const std::string framed(reinterpret_cast<const char*>(data) + 2 + key_length,
                           size - 2 - key_length);
  if (auto id = gpumove::ParsePeerKey(key); id.has_value()) {
    // A key that parses names what it holds (leading zeros aside).
    if (id->Key() != key && key.find("#0") == std::string::npos) std::abort();
  }
  auto open = gpumove::CheckUcxCall(nullptr, key, method, framed);
  auto stamped = gpumove::CheckUcxCall(auth, key, method, framed);
  // Without the secret's mac nothing passes (the fuzzer cannot forge HMAC-SHA256).
  if (stamped.ok()) std::abort();
  if (open.ok() && open->body.size() > framed.size()) std::abort();
  return 0;
}
