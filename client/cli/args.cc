// gpumovectl's arguments: the command table, help, flags checked before absl parses them,
// and the helpers that turn arguments into request fields.
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cli/flags.h"
#include "client/ref.h"
#include "daemon/common/bytes.h"

namespace gpumove::cli {

const std::vector<const char*> kGlobalFlags = {
    "addr", "json", "timeout", "token_file", "tls_ca", "tls_cert", "tls_key", "tls_server_name"};

const std::vector<Command>& AllCommands() {
  static const std::vector<Command>* all = [] {
    auto* v = new std::vector<Command>();
    for (auto group : {NodeCommands, BufferCommands, TransferCommands}) {
      for (Command& c : group()) v->push_back(std::move(c));
    }
    return v;
  }();
  return *all;
}

const Command* FindCommand(const std::string& name) {
  for (const Command& c : AllCommands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

std::string Overview() {
  std::string out =
      "gpumovectl: drive a gpumoved daemon.\n\n"
      "Usage: gpumovectl [--addr ADDR] [--json] COMMAND [ARGS] [FLAGS]\n\nCommands:\n";
  for (const Command& c : AllCommands()) {
    const std::string call = absl::StrCat(c.name, *c.args != '\0' ? " " : "", c.args);
    absl::StrAppend(&out, absl::StrFormat("  %-30s %s\n", call, c.summary));
  }
  absl::StrAppend(
      &out,
      "\nBUF is [node/]buffer_id[@offset]: any node answers for buffers of every node.\n"
      "Sizes take suffixes: 4KiB, 64MiB, 1GiB; durations take units: 500ms, 30s, 5m.\n"
      "--json prints one JSON document (notifications: one per line).\n\n"
      "gpumovectl help COMMAND (or COMMAND --help) shows a command's flags and an example;\n"
      "--helpfull lists every flag. The daemon is $GPUMOVE_ADDR or 127.0.0.1:7470 unless\n"
      "--addr names it; a token comes from --token_file or $GPUMOVE_TOKEN.\n");
  return out;
}

namespace {

std::string FlagLine(const char* name) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  if (f == nullptr) return "";
  std::string def = f->DefaultValue();
  if (f->IsOfType<std::string>()) def = def.empty() ? "" : absl::StrCat("\"", def, "\"");
  std::string help = f->Help();
  // "alloc/move: a label" reads, under one command, as "a label".
  if (size_t colon = help.find(": "); colon != std::string::npos && colon < 24 &&
                                      help.substr(0, colon).find(' ') == std::string::npos) {
    help = help.substr(colon + 2);
  }
  return absl::StrFormat("  --%-20s %s%s\n", name, help,
                         def.empty() ? "" : absl::StrCat(" (default ", def, ")"));
}

}  // namespace

std::string CommandHelp(const Command& c) {
  std::string out = absl::StrCat("Usage: gpumovectl [global flags] ", c.name,
                                 *c.args != '\0' ? " " : "", c.args, "\n\n", c.summary, "\n");
  if (!c.flags.empty()) {
    absl::StrAppend(&out, "\nFlags:\n");
    for (const char* f : c.flags) absl::StrAppend(&out, FlagLine(f));
  }
  absl::StrAppend(&out, "\nGlobal flags:\n");
  for (const char* f : kGlobalFlags) absl::StrAppend(&out, FlagLine(f));
  absl::StrAppend(&out, "\nExample:\n  ", c.example, "\n");
  return out;
}

namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// Our flags (absl registers its own too; those are not suggested).
std::vector<std::string> OurFlags() {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "client/cli/flags.cc")) names.emplace_back(name);
  }
  return names;
}

std::string Nearest(const std::string& name) {
  std::string best;
  size_t best_distance = 3;  // Two edits at most: beyond that a guess misleads.
  for (const std::string& known : OurFlags()) {
    const size_t d = EditDistance(name, known);
    if (d < best_distance) best_distance = d, best = known;
  }
  return best;
}

std::string ValueHint(const absl::CommandLineFlag& f) {
  if (f.IsOfType<absl::Duration>()) return "a duration with its unit, e.g. 500ms, 30s, 5m";
  if (f.IsOfType<int>() || f.IsOfType<std::optional<uint64_t>>()) return "a whole number";
  if (f.IsOfType<bool>()) return "true or false";
  return "a value";
}

}  // namespace

void CheckFlags(const std::vector<std::string>& argv) {
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") return;  // Everything after is positional.
    if (a.size() < 2 || a[0] != '-') continue;
    if (absl::ascii_isdigit(a[1])) {
      throw UsageError{absl::StrCat(a, " is not a flag, and sizes, offsets and counts are not "
                                       "negative")};
    }
    const std::string body = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name = body.substr(0, eq);
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (f == nullptr && absl::StartsWith(name, "no")) {
      f = absl::FindCommandLineFlag(name.substr(2));
      negated = f != nullptr && f->IsOfType<bool>();
      if (!negated) f = nullptr;
    }
    if (f == nullptr) {
      const std::string near = Nearest(name);
      throw UsageError{absl::StrCat("unknown flag --", name,
                                    near.empty() ? "" : absl::StrCat("; did you mean --", near, "?"))};
    }
    if (negated) continue;
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else if (f->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argv.size()) {
      value = argv[++i];  // "--flag value".
    } else {
      throw UsageError{absl::StrCat("--", name, " needs ", ValueHint(*f))};
    }
    // A scratch copy of the flag's value is not to be had: parse into the flag itself (absl
    // parses the same text again right after, so nothing is lost).
    std::string error;
    if (!absl::FindCommandLineFlag(name)->ParseFrom(value, &error)) {
      throw UsageError{absl::StrCat("--", name, " ", value, ": not ", ValueHint(*f))};
    }
  }
}

void Need(const Args& args, size_t n) {
  if (args.size() == n + 1) return;
  const Command* c = FindCommand(args[0]);
  throw UsageError{absl::StrCat(args.size() < n + 1 ? "too few" : "too many",
                                " arguments; usage: gpumovectl ", args[0],
                                c != nullptr && *c->args != '\0' ? " " : "",
                                c != nullptr ? c->args : "")};
}

uint64_t SizeArg(const std::string& text, const char* what) {
  auto v = ParseBytes(text);
  if (!v.ok()) {
    throw UsageError{absl::StrCat(what, " ", text, ": not a size (bytes, or with a unit: 4KiB, "
                                  "64MiB, 1GiB)")};
  }
  return *v;
}

v1::BufferRef RefArg(const std::string& text) {
  auto r = ParseBufferRef(text);
  if (!r.ok()) throw UsageError{std::string(r.status().message())};
  return *r;
}

void SetLease(google::protobuf::Duration* ttl) {
  const absl::Duration lease = absl::GetFlag(FLAGS_lease);
  if (lease <= absl::ZeroDuration()) return;
  const int64_t ns = absl::ToInt64Nanoseconds(lease);
  ttl->set_seconds(ns / 1000000000);
  ttl->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

// A local file that could not be opened, in the code its errno means: a missing file or
// folder is NOT_FOUND, a refusal PERMISSION_DENIED.
absl::Status LocalFileError(const std::string& path, int err) {
  const std::string what = absl::StrCat(path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(what);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(what);
    case EISDIR:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(what);
    default:
      return absl::UnavailableError(what);
  }
}

// The block list of --blocks FILE (one "SRC_INDEX DST_INDEX" pair a line) with
// --block_size and the strides.
v1::BlockList BlocksArg() {
  v1::BlockList b;
  b.set_block_size(SizeArg(absl::GetFlag(FLAGS_block_size), "--block_size"));
  b.set_source_stride(SizeArg(absl::GetFlag(FLAGS_source_stride), "--source_stride"));
  b.set_destination_stride(
      SizeArg(absl::GetFlag(FLAGS_destination_stride), "--destination_stride"));
  if (b.block_size() == 0) throw UsageError{"--blocks needs --block_size"};
  std::ifstream in(absl::GetFlag(FLAGS_blocks));
  if (!in) throw UsageError{absl::StrCat("cannot read ", absl::GetFlag(FLAGS_blocks))};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    line = std::string(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
    if (line.empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t,"), absl::SkipEmpty());
    uint64_t si = 0, di = 0;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &si) || !absl::SimpleAtoi(f[1], &di)) {
      throw UsageError{absl::StrCat(absl::GetFlag(FLAGS_blocks), " line ", number,
                                    ": not \"SRC_INDEX DST_INDEX\"")};
    }
    b.add_source_blocks(si);
    b.add_destination_blocks(di);
  }
  CompactBlockIndices(&b);
  return b;
}

}  // namespace gpumove::cli
