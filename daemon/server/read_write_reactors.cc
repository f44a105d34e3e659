#include "daemon/server/read_write_reactors.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "daemon/common/grpc_status.h"
#include "daemon/server/field_limits.h"
#include "daemon/server/forward.h"
#include "daemon/server/lasting_reactor.h"
#include "daemon/server/stream_reactor.h"

namespace gpumove {
namespace {

constexpr uint32_t kDefaultReadChunk = 1 << 20;
constexpr uint32_t kMaxReadChunk = 4 << 20;

int CopyDevice(const BufferUse& use) {
  return use.kind() == MemoryKind::kDevice ? use.device() : kHostDevice;
}

}  // namespace

class ReadReactor final : public StreamReactor<v1::ReadResponse> {
 public:
  ReadReactor(BufferServiceImpl* service, grpc::CallbackServerContext* context,
              const v1::ReadRequest* request)
      : StreamReactor("client went away"), s_(service), context_(context), request_(request) {}

  grpc::Status Start() override {
    GPUMOVE_CHECK_CALLER(caller, *s_->auth_, context_, Access::kRead, "Read");
    GPUMOVE_CHECK_FIELDS(*request_);
    if (absl::Status st = EnterLongCall(s_->long_calls_, true, caller.principal); !st.ok()) {
      return ToGrpcStatus(st);
    }
    const std::string& node = request_->source().node();
    auto remote = s_->RemoteStub(*context_, node);
    if (!remote.ok()) return ToGrpcStatus(remote.status());
    if (*remote != nullptr) {
      auto call = std::make_unique<ForwardedCall>(*context_, s_->auth_, *s_->cluster_, node,
                                                  absl::InfiniteDuration());
      std::shared_ptr<v1::BufferService::Stub> stub = *std::move(remote);
      Relay(std::move(call),
            [stub, request = *request_](grpc::ClientContext* c,
                                        grpc::ClientReadReactor<v1::ReadResponse>* r) mutable {
              stub->async()->Read(c, &request, r);
            });
      return grpc::Status::OK;
    }
    if (request_->chunk_size() > kMaxReadChunk) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("chunk_size ", request_->chunk_size(), " exceeds ", kMaxReadChunk));
    }
    chunk_ = request_->chunk_size() == 0 ? kDefaultReadChunk : request_->chunk_size();
    auto use = s_->registry_->Acquire(caller.owner(), request_->source().buffer_id(),
                                      request_->source().offset(), request_->source().length());
    if (!use.ok()) return ToGrpcStatus(use.status());
    use_ = *std::move(use);
    credentials_.emplace(*s_->auth_, context_, caller);
    EndWhenRevoked(s_->auth_, context_, caller);
    absl::MutexLock lock(&mu_);
    SendNextLocked();
    return grpc::Status::OK;
  }

 private:
  void WrittenLocked(bool ok) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    SendNextLocked();
  }
  void FinishingLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { use_.Reset(); }

  // The next chunk, copied out of the buffer and written; the end once all went.
  void SendNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (sent_ >= use_.length()) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    if (context_->IsCancelled()) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    if (absl::Status st = credentials_->Check(); !st.ok()) {
      FinishLocked(ToGrpcStatus(st));
      return;
    }
    const uint64_t n = std::min<uint64_t>(chunk_, use_.length() - sent_);
    message_.set_offset(use_.offset() + sent_);
    std::string* data = message_.mutable_data();
    data->resize(n);
    absl::Status st = s_->gpu_->Copy(data->data(), kHostDevice, use_.data() + sent_,
                                     CopyDevice(use_), n, n, nullptr);
    if (!st.ok()) {
      FinishLocked(ToGrpcStatus(st));
      return;
    }
    sent_ += n;
    WriteLocked(&message_);
  }

  BufferServiceImpl* const s_;
  grpc::CallbackServerContext* const context_;
  const v1::ReadRequest* const request_;
  uint32_t chunk_ = kDefaultReadChunk;
  BufferUse use_;
  std::optional<CredentialsWatch> credentials_;
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  v1::ReadResponse message_ ABSL_GUARDED_BY(mu_);
};

class WriteReactor final : public LastingReactor<grpc::ServerReadReactor<v1::WriteRequest>> {
 public:
  WriteReactor(BufferServiceImpl* service, grpc::CallbackServerContext* context,
               v1::WriteResponse* response)
      : s_(service), context_(context), response_(response) {}

  grpc::Status Start() override {
    GPUMOVE_CHECK_CALLER(caller, *s_->auth_, context_, Access::kChange, "Write");
    if (absl::Status st = EnterLongCall(s_->long_calls_, true, caller.principal); !st.ok()) {
      return ToGrpcStatus(st);
    }
    caller_ = caller;
    absl::MutexLock lock(&mu_);
    StartRead(&message_);
    return grpc::Status::OK;
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!LiveLocked()) return;
    if (first_) {
      first_ = false;
      grpc::Status st = FirstLocked(ok);
      if (!st.ok()) FinishLocked(st);
      return;
    }
    if (upstream_ != nullptr) {
      if (ok) {
        upstream_->StartWrite(&message_);
      } else {
        upstream_->StartWritesDone();
      }
      return;
    }
    if (ok) {
      ConsumeLocked();
    } else {
      EndLocked();
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (upstream_ != nullptr) upstream_->call->context()->TryCancel();
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
  }

 private:
  // The stream's first message names the target: checked, then relayed or held.
  grpc::Status FirstLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ok) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty Write stream");
    if (!message_.has_target()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "the first Write message must name the target");
    }
    const v1::BufferRef& target = message_.target();
    if (absl::Status st = CheckStringFields(target); !st.ok()) return ToGrpcStatus(st);
    auto remote = s_->RemoteStub(*context_, target.node());
    if (!remote.ok()) return ToGrpcStatus(remote.status());
    if (*remote != nullptr) {
      // Relay the stream to the owning node, message by message.
      auto up = std::make_unique<Upstream>();
      up->call = std::make_unique<ForwardedCall>(*context_, s_->auth_, *s_->cluster_, target.node(),
                                                 absl::InfiniteDuration());
      up->stub = *std::move(remote);
      up->server = std::static_pointer_cast<WriteReactor>(shared_from_this());
      up->stub->async()->Write(up->call->context(), &up->response, up.get());
      up->StartWrite(&message_);
      up->StartCall();
      upstream_ = std::move(up);
      return grpc::Status::OK;
    }
    // The whole range is checked, and held, before the first byte is written.
    auto use = s_->registry_->Acquire(caller_.owner(), target.buffer_id(), target.offset(),
                                      target.length());
    if (!use.ok()) return ToGrpcStatus(use.status());
    use_ = *std::move(use);
    hash_.reset(XXH3_createState());
    XXH3_64bits_reset(hash_.get());
    ConsumeLocked();
    return grpc::Status::OK;
  }

  // Copies a message's bytes into the range held, and reads the next.
  void ConsumeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string& data = message_.data();
    if (data.size() > use_.length() - written_) {
      FinishLocked(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       absl::StrCat("Write stream carries more than the ", use_.length(),
                                    " bytes of its target range; stopped after ", written_)));
      return;
    }
    if (!data.empty()) {
      absl::Status st = s_->gpu_->Copy(use_.data() + written_, CopyDevice(use_), data.data(),
                                       kHostDevice, data.size(), data.size(), nullptr);
      if (!st.ok()) {
        FinishLocked(ToGrpcStatus(st));
        return;
      }
      XXH3_64bits_update(hash_.get(), data.data(), data.size());
      written_ += data.size();
    }
    StartRead(&message_);
  }

  // The caller's stream ended: all of the range written, or INVALID_ARGUMENT.
  void EndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (context_->IsCancelled()) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    response_->set_bytes_written(written_);
    response_->set_xxh3(XXH3_64bits_digest(hash_.get()));
    if (written_ != use_.length()) {
      FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                absl::StrCat("Write stream ended after ", written_, " of the ",
                                             use_.length(), " bytes of its target range")));
      return;
    }
    FinishLocked(grpc::Status::OK);
  }

  // The relayed Write: each message the caller sends goes on once the last one went.
  struct Upstream : grpc::ClientWriteReactor<v1::WriteRequest> {
    std::unique_ptr<ForwardedCall> call;
    std::unique_ptr<v1::BufferService::Stub> stub;
    v1::WriteResponse response;
    std::shared_ptr<WriteReactor> server;  // Until this call ends.

    void OnWriteDone(bool ok) override {
      absl::MutexLock lock(&server->mu_);
      if (ok && server->LiveLocked()) {
        server->StartRead(&server->message_);
      } else {
        StartWritesDone();
      }
    }
    void OnDone(const grpc::Status& status) override {
      std::shared_ptr<WriteReactor> last = std::move(server);
      absl::MutexLock lock(&last->mu_);
      if (!last->LiveLocked()) return;
      if (status.ok()) *last->response_ = response;
      last->FinishLocked(call->Finish(status));
    }
  };

  void Closed() override {
    absl::MutexLock lock(&mu_);
    if (upstream_ != nullptr) upstream_->call->context()->TryCancel();
  }
  void FinishingLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { use_.Reset(); }

  BufferServiceImpl* const s_;
  grpc::CallbackServerContext* const context_;
  v1::WriteResponse* const response_;
  Caller caller_;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  v1::WriteRequest message_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Upstream> upstream_ ABSL_GUARDED_BY(mu_);
  BufferUse use_;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash_{nullptr, &XXH3_freeState};
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
};

grpc::ServerWriteReactor<v1::ReadResponse>* ServeRead(BufferServiceImpl* service,
                                                      grpc::CallbackServerContext* context,
                                                      const v1::ReadRequest* request) {
  return ReadReactor::Serve<ReadReactor>(service, context, request);
}

grpc::ServerReadReactor<v1::WriteRequest>* ServeWrite(BufferServiceImpl* service,
                                                      grpc::CallbackServerContext* context,
                                                      v1::WriteResponse* response) {
  return WriteReactor::Serve<WriteReactor>(service, context, response);
}

}  // namespace gpumove
