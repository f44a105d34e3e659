// gpumovectl's move commands: move, transfers, transfer, wait, cancel, notifications,
// prepare, prepared, release-pieces.
#include <unistd.h>

#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cli/flags.h"
#include "daemon/common/bytes.h"
#include "google/protobuf/struct.pb.h"

namespace gpumove::cli {
namespace {

// A transfer as a table in text, its record with --json; exit 1 when it must have
// succeeded and did not.
int ShowTransfer(const v1::Transfer& t, bool must_succeed) {
  if (JsonOutput()) {
    PrintJson(t);
  } else {
    PrintTransfer(t);
  }
  return must_succeed && t.state() != v1::SUCCEEDED ? 1 : 0;
}

v1::Path PathArg() {
  v1::Path path;
  std::string p = absl::AsciiStrToUpper(absl::GetFlag(FLAGS_path));
  if (p == "AUTO") p = "PATH_AUTO";
  if (!v1::Path_Parse(p, &path)) {
    throw UsageError{absl::StrCat("--path must be auto, local, cuda_ipc, ucx or mpi, not ",
                                  absl::GetFlag(FLAGS_path))};
  }
  return path;
}

v1::Priority PriorityArg() {
  v1::Priority priority;
  const std::string p = absl::AsciiStrToUpper(absl::GetFlag(FLAGS_priority));
  if (p == "PRIORITY_UNSPECIFIED" || !v1::Priority_Parse(p, &priority)) {
    throw UsageError{absl::StrCat("--priority must be latency, normal or bulk, not ",
                                  absl::GetFlag(FLAGS_priority))};
  }
  return priority;
}

int Move(Client& c, const Args& args) {
  Need(args, 2);
  v1::SubmitRequest request;
  v1::TransferSpec* spec = request.add_transfers();
  *spec->mutable_source() = RefArg(args[1]);
  *spec->mutable_destination() = RefArg(args[2]);
  spec->mutable_source()->set_length(SizeArg(absl::GetFlag(FLAGS_length), "--length"));
  spec->set_checksum(absl::GetFlag(FLAGS_checksum));
  spec->set_label(absl::GetFlag(FLAGS_label));
  spec->set_require_transport(absl::GetFlag(FLAGS_require));
  if (auto notify = absl::GetFlag(FLAGS_notify)) spec->set_notify(*notify);
  if (!absl::GetFlag(FLAGS_prepared).empty()) {
    if (!absl::GetFlag(FLAGS_blocks).empty()) throw UsageError{"--prepared or --blocks, not both"};
    spec->set_prepared_pieces(absl::GetFlag(FLAGS_prepared));
  }
  if (!absl::GetFlag(FLAGS_blocks).empty()) *spec->mutable_blocks() = BlocksArg();
  spec->set_path(PathArg());
  spec->set_priority(PriorityArg());
  request.set_idempotency_key(absl::GetFlag(FLAGS_idempotency_key));
  auto submitted = c.Submit(request);
  if (!submitted.ok()) return Fail(submitted.status());
  const v1::Transfer& t = submitted->transfers(0);
  if (!absl::GetFlag(FLAGS_wait)) {
    if (JsonOutput()) return PrintJson(t), 0;
    std::cout << t.id() << "\n";
    return 0;
  }
  const bool tty = isatty(STDERR_FILENO) && !JsonOutput();
  ProgressBar bar;
  auto end = c.Watch(t.id(), [&](const v1::Transfer& e) {
    if (tty) bar.Draw(e);
  });
  bar.End();
  if (!end.ok()) return Fail(end.status());
  return ShowTransfer(*end, true);
}

int Transfers(Client& c, const Args& args) {
  Need(args, 0);
  std::vector<v1::TransferState> states;
  if (!absl::GetFlag(FLAGS_state).empty()) {
    v1::TransferState s;
    if (!v1::TransferState_Parse(absl::AsciiStrToUpper(absl::GetFlag(FLAGS_state)), &s)) {
      throw UsageError{absl::StrCat("--state must be queued, running, succeeded, failed or "
                                    "cancelled, not ",
                                    absl::GetFlag(FLAGS_state))};
    }
    states.push_back(s);
  }
  auto list = c.ListTransfers(states);
  if (!list.ok()) return Fail(list.status());
  if (JsonOutput()) {
    v1::ListTransfersResponse r;
    for (auto& t : *list) *r.add_transfers() = t;
    return PrintJson(r), 0;
  }
  if (list->empty()) {
    std::cout << "no transfers\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {kTransferHeader};
  for (const auto& t : *list) rows.push_back(TransferRow(t));
  PrintTable(rows);
  return 0;
}

int OneTransfer(Client& c, const Args& args) {
  Need(args, 1);
  const std::string& cmd = args[0];
  auto t = cmd == "transfer" ? c.GetTransfer(args[1])
           : cmd == "wait"   ? c.Wait(args[1])
                             : c.Cancel(args[1], absl::GetFlag(FLAGS_wait));
  if (!t.ok()) return Fail(t.status());
  return ShowTransfer(*t, cmd == "wait");
}

int Notifications(Client& c, const Args& args) {
  Need(args, 0);
  v1::NotificationsRequest request;
  request.set_node(absl::GetFlag(FLAGS_node));
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_buffers), ',', absl::SkipEmpty())) {
    request.add_buffers(std::string(b));
  }
  if (auto after = absl::GetFlag(FLAGS_after)) request.set_after_sequence(*after);
  auto stream = c.Subscribe(request);
  if (!stream.ok()) return Fail(stream.status());
  const int count = absl::GetFlag(FLAGS_count);
  if (count < 0) throw UsageError{"--count must be 0 (no end) or more"};
  v1::Notification n;
  for (int seen = 0; (count == 0 || seen < count) && (*stream)->Next(&n); ++seen) {
    if (JsonOutput()) {  // A stream: one document a line.
      std::cout << CompactJson(n) << std::flush;
      continue;
    }
    if (n.missed() > 0) std::cout << "(" << n.missed() << " missed)\n";
    if (n.transfer_id().empty()) continue;  // A loss reported on its own.
    std::cout << n.sequence() << "  " << n.transfer_id() << "  " << n.source_node() << " -> "
              << n.destination_buffer() << "  " << absl::CHexEscape(n.notify()) << "\n"
              << std::flush;
  }
  if (count > 0) {
    (*stream)->Cancel();
    return 0;
  }
  absl::Status st = (*stream)->Finish();
  return st.ok() ? 0 : Fail(st);
}

int Prepare(Client& c, const Args& args) {
  Need(args, 0);
  if (absl::GetFlag(FLAGS_blocks).empty()) throw UsageError{"prepare needs --blocks FILE"};
  auto list =
      c.PreparePieces({}, BlocksArg(), absl::GetFlag(FLAGS_node), absl::GetFlag(FLAGS_label));
  if (!list.ok()) return Fail(list.status());
  if (JsonOutput()) return PrintJson(*list), 0;
  std::cout << list->id() << "\n";
  return 0;
}

int Prepared(Client& c, const Args& args) {
  Need(args, 0);
  auto lists = c.ListPreparedPieces(absl::GetFlag(FLAGS_node));
  if (!lists.ok()) return Fail(lists.status());
  if (JsonOutput()) {
    v1::ListPreparedPiecesResponse r;
    for (auto& l : *lists) *r.add_lists() = l;
    return PrintJson(r), 0;
  }
  if (lists->empty()) {
    std::cout << "no prepared piece lists\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "PIECES", "BYTES", "SOURCE EXTENT", "DESTINATION EXTENT", "LABEL"}};
  for (const auto& l : *lists) {
    rows.push_back({l.id(), absl::StrCat(l.pieces()), FormatBytes(l.bytes()),
                    FormatBytes(l.source_extent()), FormatBytes(l.destination_extent()),
                    l.label().empty() ? "-" : l.label()});
  }
  PrintTable(rows);
  return 0;
}

int ReleasePieces(Client& c, const Args& args) {
  Need(args, 1);
  absl::Status st = c.ReleasePieces(args[1]);
  if (!st.ok()) return Fail(st);
  if (JsonOutput()) {
    google::protobuf::Struct s;
    (*s.mutable_fields())["released"].set_string_value(args[1]);
    PrintJson(s);
  }
  return 0;
}

}  // namespace

std::vector<Command> TransferCommands() {
  return {
      {"move", "SRC DST", "copy SRC to DST (refs are [node/]buffer_id[@offset]); waits",
       {"length", "checksum", "wait", "path", "priority", "label", "notify", "idempotency_key", "blocks",
        "block_size", "source_stride", "destination_stride", "prepared"},
       "gpumovectl move node-a/b-1f3a9c0d2e4b5a67 node-b/b-77aa01c2d3e4f506 --checksum", Move},
      {"transfers", "", "list transfers, newest first", {"state"},
       "gpumovectl transfers --state failed", Transfers},
      {"transfer", "ID", "show one transfer", {}, "gpumovectl transfer t-5e2a9b1c0d3f4e67",
       OneTransfer},
      {"wait", "ID", "wait for a transfer to end (exit 1 unless it succeeded)", {},
       "gpumovectl wait t-5e2a9b1c0d3f4e67", OneTransfer},
      {"cancel", "ID", "cancel a transfer; waits for it to stop unless --nowait", {"wait"},
       "gpumovectl cancel t-5e2a9b1c0d3f4e67 --nowait", OneTransfer},
      {"notifications", "", "stream notifications of moves into this node's (or --node's) buffers",
       {"node", "buffers", "after", "count"},
       "gpumovectl notifications --buffers b-77aa01c2d3e4f506 --count 1", Notifications},
      {"prepare", "", "keep a block list on --node for moves to name (move --prepared ID)",
       {"blocks", "block_size", "source_stride", "destination_stride", "node", "label"},
       "gpumovectl prepare --blocks pairs.txt --block_size 4KiB --node node-b", Prepare},
      {"prepared", "", "list the prepared piece lists", {"node"}, "gpumovectl prepared",
       Prepared},
      {"release-pieces", "ID", "let a prepared list go", {},
       "gpumovectl release-pieces p-0c1d2e3f4a5b6c7d", ReleasePieces},
  };
}

}  // namespace gpumove::cli
