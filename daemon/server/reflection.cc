#include "daemon/server/reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <algorithm>
#include <atomic>
#include <deque>

#include "absl/strings/str_cat.h"
#include "daemon/common/quote.h"

namespace gpumove {
namespace {

namespace v1 = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

constexpr char kV1[] = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
constexpr char kV1Alpha[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

void NotFound(const std::string& what, v1::ServerReflectionResponse& response) {
  response.mutable_error_response()->set_error_code(grpc::StatusCode::NOT_FOUND);
  response.mutable_error_response()->set_error_message(absl::StrCat(what, " not found"));
}

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace

// One reflection stream: read a request, check the caller on the first, answer, read the
// next; one operation outstanding at a time.
class Reflection::Stream : public grpc::ServerGenericBidiReactor {
 public:
  Stream(const Reflection& reflection, grpc::CallbackServerContext* ctx)
      : reflection_(reflection), ctx_(ctx) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return FinishOnce(grpc::Status::OK);  // The client is done asking.
    if (!checked_) {
      checked_ = true;
      if (reflection_.check_ != nullptr) {
        if (grpc::Status st = reflection_.check_(ctx_); !st.ok()) return FinishOnce(st);
      }
    }
    v1::ServerReflectionRequest request;
    if (!request.ParseFromString(ToString(in_))) {
      return FinishOnce(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not a ServerReflectionRequest"));
    }
    const std::string bytes = reflection_.Answer(request, sent_).SerializeAsString();
    grpc::Slice slice(bytes);
    out_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away"));
    StartRead(&in_);
  }
  void OnCancel() override { FinishOnce(grpc::Status::CANCELLED); }
  void OnDone() override { delete this; }

 private:
  void FinishOnce(grpc::Status status) {
    if (!finished_.exchange(true)) Finish(std::move(status));
  }

  const Reflection& reflection_;
  grpc::CallbackServerContext* const ctx_;
  bool checked_ = false;
  std::atomic<bool> finished_{false};
  absl::flat_hash_set<std::string> sent_;
  grpc::ByteBuffer in_, out_;
};

absl::StatusOr<std::unique_ptr<Reflection>> Reflection::Make(std::vector<std::string> services,
                                                             Check check) {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  absl::flat_hash_set<std::string> files;
  std::deque<const FileDescriptor*> next;
  for (const std::string& name : services) {
    const auto* service = pool->FindServiceByName(name);
    if (service == nullptr) {
      return absl::InternalError(absl::StrCat("reflection: no service ", Quoted(name)));
    }
    next.push_back(service->file());
  }
  while (!next.empty()) {
    const FileDescriptor* file = next.front();
    next.pop_front();
    if (!files.insert(file->name()).second) continue;
    for (int i = 0; i < file->dependency_count(); ++i) next.push_back(file->dependency(i));
  }
  std::sort(services.begin(), services.end());
  return std::unique_ptr<Reflection>(
      new Reflection(std::move(services), std::move(files), std::move(check)));
}

grpc::ServerGenericBidiReactor* Reflection::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  if (ctx->method() == kV1 || ctx->method() == kV1Alpha) return new Stream(*this, ctx);
  // Every other method this server does not have comes here too.
  class Unimplemented : public grpc::ServerGenericBidiReactor {
   public:
    explicit Unimplemented(const std::string& method) {
      Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          absl::StrCat("no method ", Quoted(method.substr(0, 256)))));
    }
    void OnDone() override { delete this; }
  };
  return new Unimplemented(ctx->method());
}

v1::ServerReflectionResponse Reflection::Answer(const v1::ServerReflectionRequest& request,
                                                absl::flat_hash_set<std::string>& sent) const {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  v1::ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  switch (request.message_request_case()) {
    case v1::ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case v1::ServerReflectionRequest::kFileByFilename:
      Describe(pool->FindFileByName(request.file_by_filename()),
               absl::StrCat("file ", Quoted(request.file_by_filename())), sent, response);
      break;
    case v1::ServerReflectionRequest::kFileContainingSymbol:
      Describe(pool->FindFileContainingSymbol(request.file_containing_symbol()),
               absl::StrCat("symbol ", Quoted(request.file_containing_symbol())), sent, response);
      break;
    case v1::ServerReflectionRequest::kFileContainingExtension: {
      const auto& ask = request.file_containing_extension();
      const auto* type = pool->FindMessageTypeByName(ask.containing_type());
      const auto* extension =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ask.extension_number());
      Describe(
          extension == nullptr ? nullptr : extension->file(),
          absl::StrCat("extension ", ask.extension_number(), " of ", Quoted(ask.containing_type())),
          sent, response);
      break;
    }
    case v1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr || !files_.contains(type->file()->name())) {
        NotFound(absl::StrCat("type ", Quoted(request.all_extension_numbers_of_type())), response);
        break;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const auto* e : extensions) {
        if (files_.contains(e->file()->name())) numbers->add_extension_number(e->number());
      }
      break;
    }
    default:
      response.mutable_error_response()->set_error_code(grpc::StatusCode::UNIMPLEMENTED);
      response.mutable_error_response()->set_error_message("an empty or unknown request");
  }
  return response;
}

void Reflection::Describe(const FileDescriptor* file, const std::string& what,
                          absl::flat_hash_set<std::string>& sent,
                          v1::ServerReflectionResponse& response) const {
  if (file == nullptr || !files_.contains(file->name())) return NotFound(what, response);
  auto* out = response.mutable_file_descriptor_response();
  // The file first, then its imports depth first; each once per stream.
  std::vector<const FileDescriptor*> next = {file};
  while (!next.empty()) {
    const FileDescriptor* f = next.back();
    next.pop_back();
    if (f != file && sent.contains(f->name())) continue;
    sent.insert(f->name());
    google::protobuf::FileDescriptorProto proto;
    f->CopyTo(&proto);
    proto.SerializeToString(out->add_file_descriptor_proto());
    for (int i = f->dependency_count() - 1; i >= 0; --i) next.push_back(f->dependency(i));
  }
}

}  // namespace gpumove
