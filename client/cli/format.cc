// gpumovectl's output: JSON documents, human sizes, durations and rates, aligned tables,
// errors with hints.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/cli.h"
#include "client/cli/flags.h"
#include "client/ref.h"
#include "daemon/common/bytes.h"
#include "google/protobuf/util/json_util.h"

namespace gpumove::cli {
namespace {

std::string ToJson(const google::protobuf::Message& m, bool pretty) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.preserve_proto_field_names = true;
  // Empty lists as [], zeros as 0: a script finds every key whatever the values.
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  if (!pretty) out += "\n";
  return out;
}

// `value` to 3 significant digits, as "%.3g" would but never in exponent form.
std::string ThreeDigits(double value) {
  if (value >= 100) return absl::StrFormat("%.0f", value);
  if (value >= 10) return absl::StrFormat("%.1f", value);
  return absl::StrFormat("%.2f", value);
}

}  // namespace

bool JsonOutput() { return absl::GetFlag(FLAGS_json); }

void PrintJson(const google::protobuf::Message& m) { std::cout << ToJson(m, true); }

std::string CompactJson(const google::protobuf::Message& m) { return ToJson(m, false); }

int Fail(const absl::Status& status) {
  std::string message(status.message());
  // "CANCELLED: cancelled" says nothing twice.
  const std::string code = absl::StatusCodeToString(status.code());
  if (absl::AsciiStrToLower(message) == absl::AsciiStrToLower(code)) message.clear();
  std::cerr << "error: " << code << (message.empty() ? "" : ": ") << message << "\n";
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    std::cerr << "hint: this daemon needs a token: --token_file FILE, or the token itself in "
                 "GPUMOVE_TOKEN\n";
  } else if (status.code() == absl::StatusCode::kUnavailable &&
             absl::StrContains(message, "cannot reach")) {
    std::cerr << "hint: is gpumoved running there? --addr or GPUMOVE_ADDR names another\n";
  }
  return 1;
}

std::string Kind(v1::MemoryKind kind, int device) {
  switch (kind) {
    case v1::HOST:
      return "host";
    case v1::PINNED_HOST:
      return "pinned";
    case v1::DEVICE:
      return absl::StrCat("gpu", device);
    case v1::FILE:
      return "file";
    default:
      return "?";
  }
}

std::string HumanDuration(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  if (s < 0) return "-";
  if (s < 1e-3) return ThreeDigits(s * 1e6) + " us";
  if (s < 1) return ThreeDigits(s * 1e3) + " ms";
  if (s < 600) return ThreeDigits(s) + " s";
  return ThreeDigits(s / 60) + " min";
}

std::string HumanRate(uint64_t bytes, absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  if (s <= 0) return "-";
  // Sizes are printed in KiB/MiB/GiB, so rates are too.
  const double per_second = static_cast<double>(bytes) / s;
  if (per_second >= (1 << 30)) return ThreeDigits(per_second / (1 << 30)) + " GiB/s";
  if (per_second >= (1 << 20)) return ThreeDigits(per_second / (1 << 20)) + " MiB/s";
  return ThreeDigits(per_second / (1 << 10)) + " KiB/s";
}

void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      // The last column is not padded: no trailing blanks.
      line += i + 1 == row.size() ? row[i] : absl::StrFormat("%-*s  ", width[i], row[i]);
    }
    std::cout << line << "\n";
  }
}

namespace {

absl::Duration Elapsed(const v1::Transfer& t) {
  auto to_time = [](const google::protobuf::Timestamp& ts) {
    return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
  };
  if (!t.has_start_time() || !t.has_end_time()) return absl::ZeroDuration();
  return to_time(t.end_time()) - to_time(t.start_time());
}

}  // namespace

const std::vector<std::string> kTransferHeader = {"ID",   "STATE", "SOURCE", "DESTINATION",
                                                  "SIZE", "PATH",  "CLASS",  "TIME",
                                                  "RATE", "NOTE"};

std::vector<std::string> TransferRow(const v1::Transfer& t) {
  const bool done = t.state() == v1::SUCCEEDED;
  std::string path = v1::Path_Name(t.path());  // As the state: the API's own names.
  if (path == "PATH_AUTO") path = "AUTO";
  std::string note;
  if (t.pieces() > 0) note = absl::StrCat(t.pieces(), " pieces");
  if (t.state() == v1::QUEUED && t.waits_for() > 0) {
    absl::StrAppend(&note, note.empty() ? "" : "; ", "after ", t.waits_for(), " earlier move",
                    t.waits_for() == 1 ? "" : "s", " over the same bytes");
  }
  if (!t.transport().empty()) {
    absl::StrAppend(&note, note.empty() ? "" : "; ", "via ", t.transport());
  }
  if (t.error_code() != 0) {
    const auto code = static_cast<absl::StatusCode>(t.error_code());
    absl::StrAppend(&note, note.empty() ? "" : "; ", absl::StatusCodeToString(code));
    if (absl::AsciiStrToLower(t.error_message()) !=
        absl::AsciiStrToLower(absl::StatusCodeToString(code))) {
      absl::StrAppend(&note, ": ", t.error_message());
    }
  }
  if (t.cancel_requested() && t.state() != v1::CANCELLED) {
    absl::StrAppend(&note, note.empty() ? "" : "; ", "cancel under way (stops at its next chunk)");
  }
  return {t.id(),
          v1::TransferState_Name(t.state()),
          FormatBufferRef(t.source()),
          FormatBufferRef(t.destination()),
          FormatBytes(t.length()),
          path,
          t.priority() == v1::PRIORITY_UNSPECIFIED ? "-"
                                                   : absl::AsciiStrToLower(v1::Priority_Name(t.priority())),
          done ? HumanDuration(Elapsed(t)) : "-",
          done ? HumanRate(t.length(), Elapsed(t)) : "-",
          note.empty() ? "-" : note};
}

void PrintTransfer(const v1::Transfer& t) { PrintTable({kTransferHeader, TransferRow(t)}); }

void ProgressBar::Draw(const v1::Transfer& t) {
  const double frac = t.length() == 0 ? 1.0 : static_cast<double>(t.bytes_done()) / t.length();
  const int filled = static_cast<int>(frac * 30);
  std::cerr << absl::StrFormat("\r[%s%s] %3d%%  %s / %s  %s  %s   ", std::string(filled, '#'),
                               std::string(30 - filled, ' '), static_cast<int>(frac * 100),
                               FormatBytes(t.bytes_done()), FormatBytes(t.length()),
                               HumanRate(t.bytes_done(), absl::Now() - start_),
                               absl::AsciiStrToLower(v1::TransferState_Name(t.state())));
  drawn_ = true;
}

void ProgressBar::End() {
  if (drawn_) std::cerr << "\n";
}

}  // namespace gpumove::cli
