// gpumovectl: the command line for gpumoved.
//
//   gpumovectl [--addr ADDR] [--json] COMMAND ARGS...
//
// Exit status: 0 done (and for help), 1 an error from the daemon or a move that did not
// succeed, 2 a usage error (unknown command or flag, bad value).
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "client/cli/flags.h"

namespace gpumove::cli {
namespace {

// absl flags use underscores; people type --no-wait and --idempotency-key.
std::vector<std::string> NormalizeFlags(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (std::string& a : out) {
    if (a == "--") break;
    if (a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    for (size_t i = 2; i < std::min(eq, a.size()); ++i) {
      if (a[i] == '-') a[i] = '_';
    }
    if (a.rfind("--no_", 0) == 0) a = "--no" + a.substr(5);
  }
  return out;
}

enum class Help { kNone, kShort, kFull };

// Takes the help flags out of `argv` and says which was there.
Help TakeHelpFlags(std::vector<std::string>& argv) {
  Help help = Help::kNone;
  std::vector<std::string> rest;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h" || a == "-help" || a == "--helpshort") {
      if (help == Help::kNone) help = Help::kShort;
    } else if (a == "--helpfull" || a == "-helpfull") {
      help = Help::kFull;
    } else {
      rest.push_back(a);
    }
  }
  argv = std::move(rest);
  return help;
}

std::string FullHelp() {
  std::string out = Overview();
  absl::StrAppend(&out, "\nEvery command:\n");
  for (const Command& c : AllCommands()) absl::StrAppend(&out, "\n", CommandHelp(c));
  return out;
}

absl::StatusOr<ConnectOptions> Connection() {
  ConnectOptions connect;
  connect.timeout = absl::GetFlag(FLAGS_timeout);
  connect.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  if (const char* env = std::getenv("GPUMOVE_TLS_CA"); connect.tls_ca.empty() && env != nullptr) {
    connect.tls_ca = env;
  }
  connect.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  connect.tls_key = absl::GetFlag(FLAGS_tls_key);
  connect.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    std::ifstream in(file);
    if (!in) throw UsageError{absl::StrCat("cannot read --token_file ", file)};
    std::getline(in, connect.token);
    connect.token = std::string(absl::StripAsciiWhitespace(connect.token));
  } else if (const char* env = std::getenv("GPUMOVE_TOKEN"); env != nullptr) {
    connect.token = env;
  }
  return connect;
}

int Main(int argc, char** argv) {
  std::vector<std::string> normalized = NormalizeFlags(argc, argv);
  const Help help = TakeHelpFlags(normalized);
  CheckFlags(normalized);
  std::vector<char*> raw;
  for (std::string& a : normalized) raw.push_back(a.data());
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(raw.size()), raw.data());
  Args args(positional.begin() + 1, positional.end());
  if (help == Help::kFull) return std::cout << FullHelp(), 0;
  if (!args.empty() && args[0] == "help") {
    if (args.size() > 2) throw UsageError{"usage: gpumovectl help [COMMAND]"};
    args.erase(args.begin());
    if (args.empty()) return std::cout << Overview(), 0;
  } else if (help == Help::kNone && args.empty()) {
    std::cerr << Overview();
    return 2;
  }
  const Command* command = args.empty() ? nullptr : FindCommand(args[0]);
  if (help != Help::kNone || (positional.size() > 1 && std::string(positional[1]) == "help")) {
    if (args.empty()) return std::cout << Overview(), 0;
    if (command == nullptr) throw UsageError{absl::StrCat("no command \"", args[0], "\"")};
    return std::cout << CommandHelp(*command), 0;
  }
  if (command == nullptr) throw UsageError{absl::StrCat("no command \"", args[0], "\"")};
  std::string addr = absl::GetFlag(FLAGS_addr);
  if (addr.empty()) {
    const char* env = std::getenv("GPUMOVE_ADDR");
    addr = env != nullptr && *env != '\0' ? env : "127.0.0.1:7470";
  }
  ConnectOptions connect = *Connection();
  // A probe wants the daemon's state now: NOT_SERVING while it starts.
  connect.wait_while_starting = args[0] != "health";
  auto client = Client::Connect(addr, connect);
  if (!client.ok()) return Fail(client.status());
  return command->run(**client, args);
}

}  // namespace
}  // namespace gpumove::cli

int main(int argc, char** argv) {
  try {
    return gpumove::cli::Main(argc, argv);
  } catch (const gpumove::cli::UsageError& e) {
    std::cerr << "error: " << e.message << "\n(gpumovectl --help lists the commands; "
                 "gpumovectl help COMMAND shows one)\n";
    return 2;
  }
}
