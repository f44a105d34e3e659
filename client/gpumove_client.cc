#include "client/gpumove_client.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"

namespace gpumove {
namespace {

// How Health's message names a daemon that is still starting.
constexpr char kStartingMessage[] = "gpumoved is starting";


constexpr size_t kWriteChunk = 1 << 20;

void SetDuration(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t ns = absl::ToInt64Nanoseconds(d);
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

v1::BufferRef Ref(absl::string_view buffer_id, uint64_t offset, uint64_t length) {
  v1::BufferRef ref;
  ref.set_buffer_id(std::string(buffer_id));
  ref.set_offset(offset);
  ref.set_length(length);
  return ref;
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const ConnectOptions& options) {
  if (options.tls_ca.empty()) {
    if (!options.tls_cert.empty() || !options.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls_cert/--tls_key need --tls_ca");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  grpc::SslCredentialsOptions ssl;
  auto ca = ReadPem(options.tls_ca, "--tls_ca");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (!options.tls_cert.empty()) {
    auto cert = ReadPem(options.tls_cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(options.tls_key, "--tls_key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address,
                                                        absl::Duration timeout) {
  ConnectOptions options;
  options.timeout = timeout;
  return Connect(address, options);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address,
                                                        const ConnectOptions& options) {
  auto credentials = ClientCredentials(options);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  auto channel = grpc::CreateCustomChannel(address, *credentials, args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach gpumoved at ", address, " within ", absl::FormatDuration(options.timeout),
        options.tls_ca.empty() ? "" : " over TLS (is its certificate signed by --tls_ca?)"));
  }
  auto client = std::make_unique<Client>(std::move(channel));
  client->set_token(options.token);
  // A daemon that is still starting answers NOT_SERVING, naming its step: wait for it
  // (bounded by the timeout), so that a call right after the daemon's launch works.
  const absl::Time deadline = absl::Now() + options.timeout;
  std::string starting;  // The last answer that said the daemon is starting.
  for (int i = 0; options.wait_while_starting; ++i) {
    absl::Status health =
        client->Health("", std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    const bool still = absl::StrContains(health.message(), kStartingMessage);
    if (still) starting = std::string(health.message());
    // Past the timeout (or a health call cut short by it) while it said it was starting.
    if (!starting.empty() && (absl::Now() >= deadline ||
                              health.code() == absl::StatusCode::kDeadlineExceeded)) {
      return absl::UnavailableError(absl::StrCat("gpumoved at ", address,
                                                 " is still starting after ",
                                                 absl::FormatDuration(options.timeout), ": ",
                                                 starting));
    }
    if (!still) break;
    absl::SleepFor(std::min(absl::Milliseconds(10) * (i + 1), absl::Milliseconds(100)));
  }
  return client;
}

void Client::Authorize(grpc::ClientContext& context) const {
  if (!token_.empty()) context.AddMetadata("authorization", "Bearer " + token_);
}

Client::Client(std::shared_ptr<grpc::Channel> channel)
    : channel_(std::move(channel)),
      buffers_(v1::BufferService::NewStub(channel_)),
      transfers_(v1::TransferService::NewStub(channel_)),
      node_(v1::NodeService::NewStub(channel_)) {}

absl::StatusOr<v1::Buffer> Client::Allocate(uint64_t size, v1::MemoryKind kind, int device,
                                            absl::Duration lease, const std::string& label,
                                            const std::string& node) {
  v1::AllocateRequest request;
  request.set_node(node);
  request.set_size(size);
  request.set_kind(kind);
  request.set_device(device);
  if (lease > absl::ZeroDuration()) SetDuration(lease, request.mutable_lease_ttl());
  request.set_label(label);
  return Allocate(request);
}

absl::StatusOr<v1::Buffer> Client::Allocate(const v1::AllocateRequest& request) {
  grpc::ClientContext context;
  Authorize(context);
  v1::Buffer response;
  auto st = FromGrpcStatus(buffers_->Allocate(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::Status Client::Release(const std::string& buffer_id, const std::string& node) {
  v1::ReleaseRequest request;
  request.set_node(node);
  request.set_buffer_id(buffer_id);
  grpc::ClientContext context;
  Authorize(context);
  v1::ReleaseResponse response;
  return FromGrpcStatus(buffers_->Release(&context, request, &response));
}

absl::StatusOr<v1::Buffer> Client::GetBuffer(const std::string& buffer_id,
                                             const std::string& node) {
  v1::GetBufferRequest request;
  request.set_node(node);
  request.set_buffer_id(buffer_id);
  grpc::ClientContext context;
  Authorize(context);
  v1::Buffer response;
  auto st = FromGrpcStatus(buffers_->Get(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<v1::Buffer> Client::Import(const v1::ImportRequest& request) {
  grpc::ClientContext context;
  Authorize(context);
  v1::Buffer response;
  auto st = FromGrpcStatus(buffers_->Import(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<v1::Buffer> Client::RegisterFile(const v1::RegisterFileRequest& request) {
  grpc::ClientContext context;
  Authorize(context);
  v1::Buffer response;
  auto st = FromGrpcStatus(buffers_->RegisterFile(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<v1::ExportResponse> Client::Export(const std::string& buffer_id,
                                                  const std::string& node) {
  v1::ExportRequest request;
  request.set_buffer_id(buffer_id);
  request.set_node(node);
  grpc::ClientContext context;
  Authorize(context);
  v1::ExportResponse response;
  auto st = FromGrpcStatus(buffers_->Export(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

namespace {

// Every entry of a paged listing, page after page (at most kMaxListPages), up to `want`
// (0: all): `fetch(context, request, response)` asks for one page (authorizing the
// context), `entries(response)` are its entries.
template <class Entry, class Request, class Response, class Fetch, class Entries>
absl::StatusOr<std::vector<Entry>> AllPages(Request request, size_t want, Fetch fetch,
                                            Entries entries) {
  std::vector<Entry> out;
  for (int page = 0; page < kMaxListPages && (want == 0 || out.size() < want); ++page) {
    if (want != 0) {
      request.set_page_size(static_cast<uint32_t>(std::min<size_t>(want - out.size(), 1000)));
    }
    grpc::ClientContext context;
    Response response;
    auto st = FromGrpcStatus(fetch(&context, request, &response));
    if (!st.ok()) return st;
    out.insert(out.end(), entries(response).begin(), entries(response).end());
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<v1::Buffer>> Client::ListBuffers(const std::string& node) {
  v1::ListBuffersRequest request;
  request.set_node(node);
  return AllPages<v1::Buffer, v1::ListBuffersRequest, v1::ListBuffersResponse>(
      request, 0,
      [this](grpc::ClientContext* c, const auto& q, auto* r) {
        Authorize(*c);
        return buffers_->List(c, q, r);
      },
      [](const v1::ListBuffersResponse& r) -> const auto& { return r.buffers(); });
}

absl::StatusOr<v1::Buffer> Client::RenewLease(const std::string& buffer_id, absl::Duration ttl,
                                              const std::string& node) {
  v1::RenewLeaseRequest request;
  request.set_node(node);
  request.set_buffer_id(buffer_id);
  if (ttl > absl::ZeroDuration()) SetDuration(ttl, request.mutable_lease_ttl());
  grpc::ClientContext context;
  Authorize(context);
  v1::Buffer response;
  auto st = FromGrpcStatus(buffers_->RenewLease(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<v1::WriteResponse> Client::Write(v1::BufferRef target, absl::string_view data) {
  size_t pos = 0;
  return WriteFrom(std::move(target), data.size(), [&](char* out, size_t n) {
    n = std::min(n, data.size() - pos);
    std::memcpy(out, data.data() + pos, n);
    pos += n;
    return n;
  });
}

absl::StatusOr<v1::WriteResponse> Client::WriteFrom(
    v1::BufferRef target, uint64_t length, const std::function<size_t(char*, size_t)>& next) {
  target.set_length(length);
  grpc::ClientContext context;
  Authorize(context);
  v1::WriteResponse response;
  auto writer = buffers_->Write(&context, &response);
  v1::WriteRequest message;
  *message.mutable_target() = target;
  uint64_t sent = 0;
  bool first = true;
  while (first || sent < length) {
    std::string* data = message.mutable_data();
    data->resize(std::min<uint64_t>(kWriteChunk, length - sent));
    const size_t n = data->empty() ? 0 : next(data->data(), data->size());
    data->resize(n);
    if (!first && n == 0) break;  // The source ran dry; the daemon reports the shortfall.
    sent += n;
    if (!writer->Write(message)) break;  // The daemon ended the stream; Finish says why.
    message.clear_target();
    first = false;
  }
  writer->WritesDone();
  auto st = FromGrpcStatus(writer->Finish());
  if (!st.ok()) return st;
  return response;
}

absl::Status Client::ReadTo(const v1::BufferRef& source,
                            const std::function<absl::Status(absl::string_view)>& sink) {
  v1::ReadRequest request;
  *request.mutable_source() = source;
  grpc::ClientContext context;
  Authorize(context);
  auto reader = buffers_->Read(&context, request);
  v1::ReadResponse message;
  while (reader->Read(&message)) {
    if (auto st = sink(message.data()); !st.ok()) {
      context.TryCancel();
      reader->Finish();
      return st;
    }
  }
  return FromGrpcStatus(reader->Finish());
}

absl::StatusOr<std::string> Client::Read(const v1::BufferRef& source) {
  std::string out;
  auto st = ReadTo(source, [&](absl::string_view data) {
    out.append(data.data(), data.size());
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<v1::SubmitResponse> Client::Submit(const v1::SubmitRequest& request) {
  grpc::ClientContext context;
  Authorize(context);
  v1::SubmitResponse response;
  auto st = FromGrpcStatus(transfers_->Submit(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

void CompactBlockIndices(v1::BlockList* blocks) {
  auto compact = [](google::protobuf::RepeatedField<uint64_t>* wide,
                    google::protobuf::RepeatedField<uint32_t>* narrow) {
    if (wide->empty() || !narrow->empty()) return;
    for (uint64_t v : *wide) {
      if (v > UINT32_MAX) return;
    }
    narrow->Resize(wide->size(), 0);
    std::copy(wide->begin(), wide->end(), narrow->begin());
    wide->Clear();
  };
  compact(blocks->mutable_source_blocks(), blocks->mutable_source_blocks32());
  compact(blocks->mutable_destination_blocks(), blocks->mutable_destination_blocks32());
}

absl::StatusOr<v1::Transfer> Client::Move(const v1::BufferRef& source,
                                          const v1::BufferRef& destination,
                                          const MoveOptions& options) {
  v1::SubmitRequest request;
  v1::TransferSpec* spec = request.add_transfers();
  *spec->mutable_source() = source;
  *spec->mutable_destination() = destination;
  spec->set_path(options.path);
  spec->set_priority(options.priority);
  spec->set_require_transport(options.require_transport);
  spec->set_checksum(options.checksum);
  spec->set_durable(options.durable);
  spec->set_label(options.label);
  for (const v1::Segment& g : options.segments) *spec->add_segments() = g;
  if (options.blocks.block_size() != 0) {
    *spec->mutable_blocks() = options.blocks;
    CompactBlockIndices(spec->mutable_blocks());
  }
  spec->set_prepared_pieces(options.prepared_pieces);
  if (options.notify.has_value()) spec->set_notify(*options.notify);
  request.set_idempotency_key(options.idempotency_key);
  request.set_wait(options.wait);
  auto response = Submit(request);
  if (!response.ok()) return response.status();
  return response->transfers(0);
}

absl::StatusOr<v1::Transfer> Client::GetTransfer(const std::string& id) {
  v1::GetTransferRequest request;
  request.set_id(id);
  grpc::ClientContext context;
  Authorize(context);
  v1::Transfer response;
  auto st = FromGrpcStatus(transfers_->Get(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<std::vector<v1::Transfer>> Client::ListTransfers(
    const std::vector<v1::TransferState>& states, uint32_t limit) {
  v1::ListTransfersRequest request;
  for (auto s : states) request.add_states(s);
  return AllPages<v1::Transfer, v1::ListTransfersRequest, v1::ListTransfersResponse>(
      request, limit == 0 ? 1000 : limit,
      [this](grpc::ClientContext* c, const auto& q, auto* r) {
        Authorize(*c);
        return transfers_->List(c, q, r);
      },
      [](const v1::ListTransfersResponse& r) -> const auto& { return r.transfers(); });
}

absl::StatusOr<v1::Transfer> Client::Wait(const std::string& id, absl::Duration timeout) {
  v1::WaitRequest request;
  request.set_id(id);
  grpc::ClientContext context;
  Authorize(context);
  if (timeout != absl::InfiniteDuration()) {
    SetDuration(timeout, request.mutable_timeout());
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
  }
  v1::Transfer response;
  auto st = FromGrpcStatus(transfers_->Wait(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<v1::Transfer> Client::Watch(const std::string& id,
                                           const std::function<void(const v1::Transfer&)>& on_event,
                                           absl::Duration progress_interval) {
  v1::WatchRequest request;
  request.set_id(id);
  SetDuration(progress_interval, request.mutable_progress_interval());
  grpc::ClientContext context;
  Authorize(context);
  auto reader = transfers_->Watch(&context, request);
  v1::TransferEvent event;
  v1::Transfer last;
  bool any = false;
  while (reader->Read(&event)) {
    last = event.transfer();
    any = true;
    if (on_event) on_event(last);
  }
  auto st = FromGrpcStatus(reader->Finish());
  if (!st.ok()) return st;
  if (!any) return absl::InternalError("Watch ended without an event");
  return last;
}

absl::StatusOr<v1::Transfer> Client::Cancel(const std::string& id, bool wait,
                                            absl::Duration timeout) {
  v1::CancelRequest request;
  request.set_id(id);
  request.set_wait(wait);
  if (wait && timeout != absl::InfiniteDuration()) {
    SetDuration(timeout, request.mutable_wait_timeout());
  }
  grpc::ClientContext context;
  Authorize(context);
  v1::Transfer response;
  auto st = FromGrpcStatus(transfers_->Cancel(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<v1::PreparedPieces> Client::PreparePieces(const std::vector<v1::Segment>& segments,
                                                         v1::BlockList blocks,
                                                         const std::string& node,
                                                         const std::string& label) {
  v1::PreparePiecesRequest request;
  request.set_node(node);
  request.set_label(label);
  for (const v1::Segment& g : segments) *request.add_segments() = g;
  if (blocks.block_size() != 0) {
    CompactBlockIndices(&blocks);
    *request.mutable_blocks() = std::move(blocks);
  }
  grpc::ClientContext context;
  Authorize(context);
  v1::PreparedPieces response;
  auto st = FromGrpcStatus(transfers_->PreparePieces(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::Status Client::ReleasePieces(const std::string& id) {
  v1::ReleasePiecesRequest request;
  request.set_id(id);
  grpc::ClientContext context;
  Authorize(context);
  v1::ReleasePiecesResponse response;
  return FromGrpcStatus(transfers_->ReleasePieces(&context, request, &response));
}

absl::StatusOr<std::vector<v1::PreparedPieces>> Client::ListPreparedPieces(
    const std::string& node) {
  v1::ListPreparedPiecesRequest request;
  request.set_node(node);
  return AllPages<v1::PreparedPieces, v1::ListPreparedPiecesRequest,
                  v1::ListPreparedPiecesResponse>(
      request, 0,
      [this](grpc::ClientContext* c, const auto& q, auto* r) {
        Authorize(*c);
        return transfers_->ListPreparedPieces(c, q, r);
      },
      [](const v1::ListPreparedPiecesResponse& r) -> const auto& { return r.lists(); });
}

absl::Status NotificationStream::Finish() { return FromGrpcStatus(reader_->Finish()); }

absl::StatusOr<std::unique_ptr<NotificationStream>> Client::Subscribe(
    const v1::NotificationsRequest& request, absl::Duration timeout) {
  std::unique_ptr<NotificationStream> stream(new NotificationStream());
  Authorize(stream->context_);
  if (timeout != absl::InfiniteDuration()) {
    stream->context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  stream->reader_ = transfers_->Notifications(&stream->context_, request);
  // The daemon sends its headers once the subscription starts (or ends the call).
  stream->reader_->WaitForInitialMetadata();
  return stream;
}

absl::StatusOr<v1::NodeInfo> Client::GetInfo() {
  grpc::ClientContext context;
  Authorize(context);
  v1::NodeInfo response;
  auto st = FromGrpcStatus(node_->GetInfo(&context, v1::GetInfoRequest(), &response));
  if (!st.ok()) return st;
  return response;
}

absl::Status Client::Health(const std::string& service, absl::Duration timeout) {
  if (service.size() > 1024) return absl::InvalidArgumentError("health: service name too long");
  // HealthCheckRequest {string service = 1;}, encoded by hand: the gRPC packages ship no
  // compiled health.proto, and the message is one field.
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back('\x0a');
    size_t n = service.size();
    do {
      request_bytes.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
      n >>= 7;
    } while (n > 0);
    request_bytes += service;
  }
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  // A daemon still starting says what it is doing (gpumoved's kStartingKey).
  std::string starting;
  for (const auto& [key, value] : context.GetServerTrailingMetadata()) {
    if (key == "gpumove-starting") starting.assign(value.data(), value.size());
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("health: unreadable response");
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse {ServingStatus status = 1;}: 0 UNKNOWN, 1 SERVING, 2 NOT_SERVING,
  // 3 SERVICE_UNKNOWN; absent means 0.
  int value = 0;
  if (bytes.size() >= 2 && bytes[0] == '\x08') value = static_cast<unsigned char>(bytes[1]);
  static const char* const kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  if (value == 1) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("health: ", value < 4 ? kNames[value] : "status " + std::to_string(value),
                   starting.empty() ? "" : absl::StrCat(" (", kStartingMessage, ": ", starting,
                                                        ")")));
}

absl::StatusOr<std::vector<v1::PeerInfo>> Client::ListPeers() {
  grpc::ClientContext context;
  Authorize(context);
  v1::ListPeersResponse response;
  auto st = FromGrpcStatus(node_->ListPeers(&context, v1::ListPeersRequest(), &response));
  if (!st.ok()) return st;
  return std::vector<v1::PeerInfo>(response.peers().begin(), response.peers().end());
}

}  // namespace gpumove
