#include "daemon/help.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gpumove {
namespace {

// Groups in the order shown, each with the flag names (or name prefixes ending in '_'
// or '*') that belong to it; the first match wins.
const std::vector<std::pair<const char*, std::vector<const char*>>>& Groups() {
  static const auto* groups = new std::vector<std::pair<const char*, std::vector<const char*>>>{
      {"serving (where and how clients reach it)",
       {"listen", "node", "port_file", "advertise", "drain_grace", "metrics_listen",
        "log_json", "v", "unix_socket_mode", "unix_socket_group", "grpc_*", "keepalive",
        "handshake_timeout", "max_connection_idle", "max_message_size", "introspection"}},
      {"pools (the memory it owns)",
       {"host_pool_size", "pinned_pool_size", "device_pool_size", "gpus", "default_lease",
        "exportable_bytes_per_gpu", "scrub_memory", "pool_spin"}},
      {"cluster (other daemons)",
       {"peers", "heartbeat", "peer_timeout", "forward_timeout", "peer_call_*",
        "peer_clock_skew"}},
      {"security (callers and peers)",
       {"tls_*", "peer_tls_*", "cluster_secret_*", "auth_tokens", "client_cert_principals",
        "unix_socket_principals", "allow_insecure", "quotas"}},
      {"limits (what one caller may ask)",
       {"max_blocks_per_move", "max_prepared_*", "notification_log", "max_active",
        "max_open_calls*", "tenant_weights", "qos_*"}},
      {"paths (how bytes move: LOCAL, CUDA_IPC, UCX, MPI, FILE_IO)",
       {"ucx*", "*_copy_threads", "copy_threads", "cuda_ipc_*", "stage_*", "mpi*",
        "keep_cpu_binding", "inline_move_max", "max_move_rate", "file_*"}},
  };
  return *groups;
}

bool Matches(const std::string& name, const std::string& pattern) {
  if (absl::StartsWith(pattern, "*")) return absl::EndsWith(name, pattern.substr(1));
  if (absl::EndsWith(pattern, "*")) {
    return absl::StartsWith(name, pattern.substr(0, pattern.size() - 1));
  }
  return name == pattern;
}

std::string GroupOf(const std::string& name) {
  for (const auto& [group, patterns] : Groups()) {
    for (const char* p : patterns) {
      if (Matches(name, p)) return group;
    }
  }
  return "other";
}

// The help text's first sentence: one line per flag in --help.
std::string FirstSentence(const std::string& help) {
  // A sentence ends at ". " before a capital ("e.g. 1GiB" goes on).
  size_t end = std::string::npos;
  for (size_t i = help.find(". "); i != std::string::npos; i = help.find(". ", i + 1)) {
    if (i + 2 < help.size() && absl::ascii_isupper(help[i + 2])) {
      end = i;
      break;
    }
  }
  std::string first = end == std::string::npos ? help : help.substr(0, end + 1);
  if (first.size() > 100) first = first.substr(0, 97) + "...";
  return first;
}

}  // namespace

int HelpAsked(int argc, char** argv) {
  int asked = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--helpfull" || a == "-helpfull") return 2;
    if (a == "--help" || a == "-h" || a == "-help" || a == "--helpshort") asked = 1;
  }
  return asked;
}

std::string DaemonHelp(const std::string& defined_in, bool full) {
  std::map<std::string, std::vector<const absl::CommandLineFlag*>> by_group;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), defined_in)) {
      by_group[GroupOf(std::string(name))].push_back(flag);
    }
  }
  std::string out =
      "gpumoved: owns this node's GPU and host buffer pools and moves bytes to other daemons.\n\n"
      "Usage: gpumoved [--listen=127.0.0.1:7470] [--node=NAME] [FLAGS]\n";
  std::vector<std::string> order;
  for (const auto& g : Groups()) order.push_back(g.first);
  order.push_back("other");
  for (const std::string& group : order) {
    auto it = by_group.find(group);
    if (it == by_group.end()) continue;
    auto& flags = it->second;
    std::sort(flags.begin(), flags.end(),
              [](auto* a, auto* b) { return a->Name() < b->Name(); });
    absl::StrAppend(&out, "\n", group, ":\n");
    for (const absl::CommandLineFlag* f : flags) {
      if (full) {
        absl::StrAppend(&out, absl::StrFormat("  --%s (default %s)\n      %s\n", f->Name(),
                                              f->DefaultValue().empty() ? "\"\"" : f->DefaultValue(),
                                              f->Help()));
      } else {
        absl::StrAppend(&out, absl::StrFormat("  --%-30s %s\n", f->Name(), FirstSentence(f->Help())));
      }
    }
  }
  absl::StrAppend(&out, full ? "" : "\n--helpfull shows each flag's whole text and default; "
                                    "docs/operations.md explains them.\n");
  return out;
}

}  // namespace gpumove
