// C++ client for gpumoved: a small, status-returning layer over the gpumove.v1 stubs.
// examples/cpp/hello_move.cc is a whole program (built and run by the tests); docs/cpp.md.
//
//   auto client = gpumove::Client::Connect("127.0.0.1:7470");
//   auto a = (*client)->Allocate(64 << 20);
//   auto b = (*client)->Allocate(64 << 20, gpumove::v1::PINNED_HOST);
//   (*client)->Write(gpumove::Ref(a->id()), std::string(64 << 20, 'x'));
//   auto t = (*client)->Move(gpumove::Ref(a->id()), gpumove::Ref(b->id()),
//                            {.checksum = true});  // Waits; t->state() says how it ended.
#ifndef GPUMOVE_CLIENT_GPUMOVE_CLIENT_H_
#define GPUMOVE_CLIENT_GPUMOVE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"

namespace gpumove {

// The most pages a listing call follows (of up to 1000 entries each).
inline constexpr int kMaxListPages = 10000;

absl::Status FromGrpcStatus(const grpc::Status& status);

// A BufferRef for (buffer_id, offset, length) on the node the client talks to.
v1::BufferRef Ref(absl::string_view buffer_id, uint64_t offset = 0, uint64_t length = 0);

struct MoveOptions {
  bool checksum = false;
  // Into a FILE buffer: on stable storage (fdatasync) before SUCCEEDED.
  bool durable = false;
  v1::Path path = v1::PATH_AUTO;
  // Its class (v1::Priority): ready moves start latency first, then normal, then bulk.
  v1::Priority priority = v1::PRIORITY_UNSPECIFIED;
  // The transport class ("rdma", "tcp") a move between hosts must run over; empty: any.
  std::string require_transport;
  bool wait = true;  // Return the final state (one round trip).
  std::string idempotency_key;
  std::string label;
  // A vectored move: these pieces, or these blocks (set block_size), instead of the whole
  // range; see v1::TransferSpec.
  std::vector<v1::Segment> segments;
  v1::BlockList blocks;
  // Or the id of a list kept by Client::PreparePieces (on the node that runs the move).
  std::string prepared_pieces;
  // Set: the destination's node publishes these bytes once the move's bytes are there
  // (Client::Subscribe).
  std::optional<std::string> notify;
};

// Moves each side's block indices into the 32-bit form (BlockList.*_blocks32) when all of
// them fit: the daemon parses those as one copy, the varint form several times slower
// (docs/vectored.md). Client::Move does this; callers of Submit may.
void CompactBlockIndices(v1::BlockList* blocks);

// An open TransferService.Notifications stream. Next blocks for the next notification;
// Cancel (from any thread) ends the stream.
class NotificationStream {
 public:
  // False once the stream has ended (Finish then says why).
  bool Next(v1::Notification* notification) { return reader_->Read(notification); }
  void Cancel() { context_.TryCancel(); }
  // Why the stream ended (after Next returned false); CANCELLED after Cancel.
  absl::Status Finish();

 private:
  friend class Client;
  NotificationStream() = default;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::Notification>> reader_;
};

// How a client reaches its daemon: plaintext, or TLS when `tls_ca` is given.
struct ConnectOptions {
  absl::Duration timeout = absl::Seconds(5);  // For the connection.
  // PEM file of the CAs the daemon's certificate is checked against; set: TLS.
  std::string tls_ca;
  // PEM files of this client's certificate and key, for a daemon that requires one (mTLS).
  std::string tls_cert;
  std::string tls_key;
  // The name the daemon's certificate must carry, when not the address's host.
  std::string tls_server_name;
  // A bearer token, sent with every call (for a daemon with --auth_tokens).
  std::string token;
  // Whether Connect waits (within `timeout`) while the daemon answers that it is starting;
  // a health probe does not.
  bool wait_while_starting = true;
};

// Channel credentials for `options` (INVALID_ARGUMENT for files that cannot be read or
// options that do not go together).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const ConnectOptions& options);

class Client {
 public:
  // address: "host:port" or "unix:/path". Waits up to `timeout` for the connection.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                         absl::Duration timeout = absl::Seconds(5));
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                         const ConnectOptions& options);
  explicit Client(std::shared_ptr<grpc::Channel> channel);
  // The bearer token sent with every call from now on (empty: none).
  void set_token(std::string token) { token_ = std::move(token); }

  // Buffers.
  // `node` names another node of the cluster (empty: the one this client talks to).
  absl::StatusOr<v1::Buffer> Allocate(uint64_t size, v1::MemoryKind kind = v1::HOST, int device = 0,
                                      absl::Duration lease = absl::ZeroDuration(),
                                      const std::string& label = "", const std::string& node = "");
  // Any request, e.g. one with exportable set.
  absl::StatusOr<v1::Buffer> Allocate(const v1::AllocateRequest& request);
  absl::Status Release(const std::string& buffer_id, const std::string& node = "");
  absl::StatusOr<v1::Buffer> GetBuffer(const std::string& buffer_id, const std::string& node = "");
  // CUDA IPC on the daemon's host: lend part of our own GPU allocation to the daemon
  // (request: handle, offset, size, device UUID, ...), or map one of its device buffers.
  absl::StatusOr<v1::Buffer> Import(const v1::ImportRequest& request);
  absl::StatusOr<v1::ExportResponse> Export(const std::string& buffer_id,
                                            const std::string& node = "");
  // A region of a file under one of the node's --file_roots as a buffer of kind FILE
  // (request: root, path, offset, length, writable, create, ...).
  absl::StatusOr<v1::Buffer> RegisterFile(const v1::RegisterFileRequest& request);
  // Every buffer the caller sees, fetched page by page (at most kMaxListPages).
  absl::StatusOr<std::vector<v1::Buffer>> ListBuffers(const std::string& node = "");
  absl::StatusOr<v1::Buffer> RenewLease(const std::string& buffer_id,
                                        absl::Duration ttl = absl::ZeroDuration(),
                                        const std::string& node = "");
  // Writes `data` at target (target.length is set to data.size()).
  absl::StatusOr<v1::WriteResponse> Write(v1::BufferRef target, absl::string_view data);
  // Streams `length` bytes produced by `next` (which fills up to n bytes and returns how
  // many, 0 at the end) to target.
  absl::StatusOr<v1::WriteResponse> WriteFrom(v1::BufferRef target, uint64_t length,
                                              const std::function<size_t(char*, size_t)>& next);
  absl::StatusOr<std::string> Read(const v1::BufferRef& source);
  // Streams a range to `sink` chunk by chunk.
  absl::Status ReadTo(const v1::BufferRef& source,
                      const std::function<absl::Status(absl::string_view)>& sink);

  // Transfers.
  absl::StatusOr<v1::SubmitResponse> Submit(const v1::SubmitRequest& request);
  // One move; with options.wait the returned transfer is final.
  absl::StatusOr<v1::Transfer> Move(const v1::BufferRef& source, const v1::BufferRef& destination,
                                    const MoveOptions& options = {});
  absl::StatusOr<v1::Transfer> GetTransfer(const std::string& id);
  // The newest `limit` transfers (0: 1000), page by page.
  absl::StatusOr<std::vector<v1::Transfer>> ListTransfers(
      const std::vector<v1::TransferState>& states = {}, uint32_t limit = 0);
  absl::StatusOr<v1::Transfer> Wait(const std::string& id,
                                    absl::Duration timeout = absl::InfiniteDuration());
  // Calls on_event for every event until the transfer ends; returns the last state.
  absl::StatusOr<v1::Transfer> Watch(const std::string& id,
                                     const std::function<void(const v1::Transfer&)>& on_event,
                                     absl::Duration progress_interval = absl::Milliseconds(100));
  // Asks the move to stop; with `wait`, answers once it has ended (else at once, maybe
  // still RUNNING with cancel_requested).
  absl::StatusOr<v1::Transfer> Cancel(const std::string& id, bool wait = false,
                                      absl::Duration timeout = absl::InfiniteDuration());
  // Keeps a piece list on `node` (empty: this daemon) for moves to name by its id
  // (MoveOptions.prepared_pieces): `segments`, or `blocks` when its block_size is set.
  absl::StatusOr<v1::PreparedPieces> PreparePieces(const std::vector<v1::Segment>& segments,
                                                   v1::BlockList blocks,
                                                   const std::string& node = "",
                                                   const std::string& label = "");
  absl::Status ReleasePieces(const std::string& id);
  absl::StatusOr<std::vector<v1::PreparedPieces>> ListPreparedPieces(const std::string& node = "");
  // Subscribes to a node's notifications (request.node, empty: this daemon's), for moves
  // into request.buffers (empty: all the caller may see). Returns once the daemon has the
  // subscription: a move submitted after that is seen (with after_sequence unset too).
  // The stream ends with DEADLINE_EXCEEDED after `timeout`.
  absl::StatusOr<std::unique_ptr<NotificationStream>> Subscribe(
      const v1::NotificationsRequest& request, absl::Duration timeout = absl::InfiniteDuration());

  // Node.
  absl::StatusOr<v1::NodeInfo> GetInfo();
  absl::StatusOr<std::vector<v1::PeerInfo>> ListPeers();
  // grpc.health.v1.Health/Check of `service` ("": the server as a whole; "gpumove.v1.
  // TransferService" etc.): OK when SERVING, UNAVAILABLE with the status's name when not,
  // DEADLINE_EXCEEDED past `timeout`. Needs no credentials.
  absl::Status Health(const std::string& service = "", absl::Duration timeout = absl::Seconds(5));

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  // Adds this client's credentials to a call.
  void Authorize(grpc::ClientContext& context) const;

  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::BufferService::Stub> buffers_;
  std::unique_ptr<v1::TransferService::Stub> transfers_;
  std::unique_ptr<v1::NodeService::Stub> node_;
};

}  // namespace gpumove

#endif  // GPUMOVE_CLIENT_GPUMOVE_CLIENT_H_
