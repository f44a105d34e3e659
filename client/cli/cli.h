// What gpumovectl's command files share: the command table, argument helpers, output
// (one JSON document with --json, aligned text otherwise) and errors.
#ifndef GPUMOVE_CLIENT_CLI_CLI_H_
#define GPUMOVE_CLIENT_CLI_CLI_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/gpumove_client.h"
#include "google/protobuf/message.h"

namespace gpumove::cli {

using Args = std::vector<std::string>;  // The command's name, then its arguments.

// A mistake in how gpumovectl was called: exits 2 with the message and where to look.
struct UsageError {
  std::string message;
};

struct Command {
  const char* name;
  const char* args;     // Positional arguments, e.g. "SRC DST".
  const char* summary;  // One line.
  std::vector<const char*> flags;  // Flags it reads (besides the global ones).
  const char* example;
  int (*run)(Client& client, const Args& args);
};

// Every command, in the order help lists them (defined in *_commands.cc).
std::vector<Command> NodeCommands();
std::vector<Command> BufferCommands();
std::vector<Command> TransferCommands();
const std::vector<Command>& AllCommands();
const Command* FindCommand(const std::string& name);

// Help: the overview of all commands, and one command's usage, flags and example.
std::string Overview();
std::string CommandHelp(const Command& command);
// Flags every command takes (--addr, --json, ...).
extern const std::vector<const char*> kGlobalFlags;

// Checks flags before absl parses them, so that a mistake exits 2 with a clear word: an
// unknown flag (and the nearest known one), a value that does not parse (a duration
// without a unit), a negative number where a flag was meant. Throws UsageError.
void CheckFlags(const std::vector<std::string>& argv);

// Prints "error: CODE: message" (and a hint where one helps, e.g. how to give a token) on
// stderr; returns 1.
int Fail(const absl::Status& status);

// Argument helpers; each throws UsageError on a bad value.
void Need(const Args& args, size_t n);  // Exactly n arguments after the command.
uint64_t SizeArg(const std::string& text, const char* what);
v1::BufferRef RefArg(const std::string& text);
void SetLease(google::protobuf::Duration* ttl);  // --lease, when given.
v1::BlockList BlocksArg();                       // --blocks FILE and --block_size.
absl::Status LocalFileError(const std::string& path, int err);

// Output.
bool JsonOutput();
// One JSON document: every field, empty lists and zeros included.
void PrintJson(const google::protobuf::Message& m);
std::string CompactJson(const google::protobuf::Message& m);  // One line (streams).
std::string Kind(v1::MemoryKind kind, int device);
std::string HumanDuration(absl::Duration d);  // "719 ms", "1.88 s": 3 significant digits.
std::string HumanRate(uint64_t bytes, absl::Duration d);  // "3.40 GiB/s", "-" when unknown.
// Rows of columns, padded to line up, the first row a header.
void PrintTable(const std::vector<std::vector<std::string>>& rows);
std::vector<std::string> TransferRow(const v1::Transfer& t);
extern const std::vector<std::string> kTransferHeader;
void PrintTransfer(const v1::Transfer& t);  // One transfer, as a header and a row.

// Draws "[#####     ] 52%  1.2 GiB / 2 GiB  3.40 GiB/s" on stderr.
class ProgressBar {
 public:
  void Draw(const v1::Transfer& t);
  void End();

 private:
  absl::Time start_ = absl::Now();
  bool drawn_ = false;
};

}  // namespace gpumove::cli

#endif  // GPUMOVE_CLIENT_CLI_CLI_H_
