// gpumovectl's node commands: info, health, peers.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "daemon/common/bytes.h"
#include "google/protobuf/struct.pb.h"

namespace gpumove::cli {
namespace {

int Info(Client& c, const Args& args) {
  Need(args, 0);
  auto info = c.GetInfo();
  if (!info.ok()) return Fail(info.status());
  if (JsonOutput()) return PrintJson(*info), 0;
  std::cout << "node      " << info->node() << " (host " << info->host() << ", gpumoved "
            << info->version() << ")\n";
  std::cout << "listen    " << absl::StrJoin(info->listen(), ", ") << "\n";
  std::cout << "callers   " << info->authentication()
            << (info->tls() ? (info->tls_client_certificates() ? ", TLS with client certificates"
                                                               : ", TLS")
                            : ", plaintext")
            << "\n";
  std::cout << "peers     " << info->peer_authentication() << "\n";
  std::cout << "cpus      " << info->cpus() << " (" << info->workers() << " transfer workers)\n";
  std::cout << "gpus      " << info->gpu_status()
            << (info->cuda_compiled() ? "" : " [built without CUDA]") << "\n";
  for (const auto& g : info->gpus()) {
    std::cout << absl::StrFormat("  gpu%d  %s  %s  %s  peers [%s]\n", g.index(), g.name(),
                                 g.uuid(), FormatBytes(g.total_memory()),
                                 absl::StrJoin(g.peer_access(), ","));
  }
  for (const std::string& line : info->gpu_nic_topology()) {
    std::cout << "gpu-nic   " << line << "\n";
  }
  std::cout << "pools\n";
  std::vector<std::vector<std::string>> pools = {
      {"  KIND", "CAPACITY", "FREE", "LARGEST FREE", "BUFFERS", ""}};
  for (const auto& p : info->pools()) {
    pools.push_back({"  " + Kind(p.kind(), p.device()), FormatBytes(p.capacity()),
                     FormatBytes(p.free()), FormatBytes(p.largest_free()),
                     absl::StrCat(p.buffers()),
                     p.kind() == v1::PINNED_HOST && !p.locked() ? "(not locked)" : ""});
  }
  PrintTable(pools);
  std::cout << "paths\n";
  for (const auto& p : info->paths()) {
    std::cout << absl::StrFormat("  %-8s %-3s %s\n",
                                 p.path() == v1::PATH_AUTO ? "AUTO" : v1::Path_Name(p.path()),
                                 p.available() ? "yes" : "no", p.reason());
  }
  std::cout << "active    " << info->active_transfers() << " transfer(s)\n";
  if (!info->metrics_address().empty()) {
    std::cout << "metrics   http://" << info->metrics_address() << "/metrics\n";
  }
  return 0;
}

// For container health checks and scripts: exit 0 only when SERVING.
int Health(Client& c, const Args& args) {
  if (args.size() > 2) Need(args, 1);
  const std::string service = args.size() == 2 ? args[1] : "";
  const absl::Status st = c.Health(service);
  if (!st.ok()) return Fail(st);
  if (JsonOutput()) {
    google::protobuf::Struct s;
    (*s.mutable_fields())["service"].set_string_value(service);
    (*s.mutable_fields())["status"].set_string_value("SERVING");
    return PrintJson(s), 0;
  }
  std::cout << "SERVING\n";
  return 0;
}

int Peers(Client& c, const Args& args) {
  Need(args, 0);
  auto peers = c.ListPeers();
  if (!peers.ok()) return Fail(peers.status());
  if (JsonOutput()) {
    v1::ListPeersResponse r;
    for (const auto& p : *peers) *r.add_peers() = p;
    return PrintJson(r), 0;
  }
  if (peers->empty()) {
    std::cout << "no peers\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"NODE", "ADDRESS", "STATE"}};
  for (const auto& p : *peers) rows.push_back({p.node(), p.address(), p.up() ? "up" : "DOWN"});
  PrintTable(rows);
  return 0;
}

}  // namespace

std::vector<Command> NodeCommands() {
  return {
      {"info", "", "node, GPUs, pools and paths", {}, "gpumovectl info", Info},
      {"health", "[SERVICE]", "gRPC health check: exit 0 when SERVING", {},
       "gpumovectl health gpumove.v1.TransferService", Health},
      {"peers", "", "the nodes this one knows, and whether they are up", {},
       "gpumovectl --json peers", Peers},
  };
}

}  // namespace gpumove::cli
