// Reflection on an in-process server: v1 and v1alpha, only the public services, files
// described once per stream, the peer protocol not found, the caller checked first.
#include "daemon/server/reflection.h"

#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/generic/generic_stub.h>

#include "gtest/gtest.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"  // In the pool, so refusing it means something.
#include "proto/grpc/reflection/v1/reflection.grpc.pb.h"

namespace gpumove {
namespace {

namespace v1 = grpc::reflection::v1;

const std::vector<std::string> kPublic = {"gpumove.v1.TransferService", "gpumove.v1.BufferService",
                                          "gpumove.v1.NodeService",
                                          "grpc.reflection.v1.ServerReflection"};

class ReflectionTest : public ::testing::Test {
 protected:
  void Serve(Reflection::Check check = nullptr) {
    // Linked in (a generated file's descriptors are registered only where it is used).
    ASSERT_NE(gpumove::peer::v1::PeerService::service_full_name(), nullptr);
    ASSERT_NE(gpumove::v1::Transfer::descriptor(), nullptr);
    ASSERT_NE(v1::ServerReflectionRequest::descriptor(), nullptr);
    ASSERT_NE(gpumove::peer::v1::NodeDescriptor::descriptor(), nullptr);
    auto reflection = Reflection::Make(kPublic, std::move(check));
    ASSERT_TRUE(reflection.ok()) << reflection.status();
    reflection_ = *std::move(reflection);
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(reflection_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = server_->InProcessChannel(grpc::ChannelArguments());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  // Asks each request in turn on one v1 stream.
  std::vector<v1::ServerReflectionResponse> Ask(
      const std::vector<v1::ServerReflectionRequest>& asks, grpc::Status* status = nullptr) {
    auto stub = v1::ServerReflection::NewStub(channel_);
    grpc::ClientContext context;
    auto stream = stub->ServerReflectionInfo(&context);
    std::vector<v1::ServerReflectionResponse> out;
    for (const auto& ask : asks) {
      v1::ServerReflectionResponse r;
      if (!stream->Write(ask) || !stream->Read(&r)) break;
      out.push_back(r);
    }
    stream->WritesDone();
    grpc::Status st = stream->Finish();
    if (status != nullptr) *status = st;
    return out;
  }

  std::unique_ptr<Reflection> reflection_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

v1::ServerReflectionRequest ListServices() {
  v1::ServerReflectionRequest r;
  r.set_list_services("");
  return r;
}

v1::ServerReflectionRequest Symbol(const std::string& symbol) {
  v1::ServerReflectionRequest r;
  r.set_file_containing_symbol(symbol);
  return r;
}

std::vector<std::string> FileNames(const v1::ServerReflectionResponse& r) {
  std::vector<std::string> names;
  for (const std::string& bytes : r.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto file;
    EXPECT_TRUE(file.ParseFromString(bytes));
    names.push_back(file.name());
  }
  return names;
}

TEST_F(ReflectionTest, ListsOnlyThePublicServices) {
  Serve();
  auto answers = Ask({ListServices()});
  ASSERT_EQ(answers.size(), 1u);
  std::vector<std::string> listed;
  for (const auto& s : answers[0].list_services_response().service()) listed.push_back(s.name());
  EXPECT_EQ(listed, (std::vector<std::string>{"gpumove.v1.BufferService", "gpumove.v1.NodeService",
                                              "gpumove.v1.TransferService",
                                              "grpc.reflection.v1.ServerReflection"}));
}

TEST_F(ReflectionTest, DescribesAServiceWithItsImportsOncePerStream) {
  Serve();
  auto answers = Ask({Symbol("gpumove.v1.TransferService"), Symbol("gpumove.v1.Transfer"),
                      Symbol("gpumove.v1.TransferService.Submit")});
  ASSERT_EQ(answers.size(), 3u);
  std::vector<std::string> first = FileNames(answers[0]);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first[0], "proto/gpumove/v1/gpumove.proto");
  EXPECT_GT(first.size(), 1u);  // Its imports (google/protobuf/...).
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(answers[0].file_descriptor_response().file_descriptor_proto(0)));
  bool has_transfer_service = false;
  for (const auto& s : file.service()) has_transfer_service |= s.name() == "TransferService";
  EXPECT_TRUE(has_transfer_service);
  // Asked again in the same stream: the file itself, its imports not again.
  EXPECT_EQ(FileNames(answers[1]), std::vector<std::string>{"proto/gpumove/v1/gpumove.proto"});
  EXPECT_EQ(FileNames(answers[2]), std::vector<std::string>{"proto/gpumove/v1/gpumove.proto"});
}

TEST_F(ReflectionTest, ThePeerProtocolAndUnknownNamesAreNotFound) {
  Serve();
  v1::ServerReflectionRequest by_file;
  by_file.set_file_by_filename("proto/gpumove/peer/v1/peer.proto");
  v1::ServerReflectionRequest extension;
  extension.mutable_file_containing_extension()->set_containing_type("gpumove.v1.Transfer");
  extension.mutable_file_containing_extension()->set_extension_number(1000);
  v1::ServerReflectionRequest empty;
  auto answers = Ask({Symbol("gpumove.peer.v1.PeerService"), by_file, Symbol("no.Such"), extension,
                      empty, Symbol("gpumove.v1.NodeService")});
  ASSERT_EQ(answers.size(), 6u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(answers[i].error_response().error_code(), grpc::StatusCode::NOT_FOUND) << i;
    EXPECT_FALSE(answers[i].has_file_descriptor_response()) << i;
  }
  EXPECT_EQ(answers[0].error_response().error_message(),
            "symbol \"gpumove.peer.v1.PeerService\" not found");
  EXPECT_EQ(answers[4].error_response().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_FALSE(FileNames(answers[5]).empty());  // The stream goes on after errors.
}

TEST_F(ReflectionTest, V1AlphaGetsTheSameAnswers) {
  Serve();
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(nullptr);
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice ask(ListServices().SerializeAsString());
  call->Write(grpc::ByteBuffer(&ask, 1), nullptr);
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer answer;
  call->Read(&answer, nullptr);
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(answer.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  v1::ServerReflectionResponse response;
  ASSERT_TRUE(response.ParseFromString(bytes));
  EXPECT_EQ(response.list_services_response().service_size(), 4);
  call->WritesDone(nullptr);
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, nullptr);
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(ReflectionTest, TheCallerIsCheckedBeforeAnything) {
  int checks = 0;
  Serve([&](grpc::CallbackServerContext*) {
    ++checks;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no credentials");
  });
  grpc::Status status;
  auto answers = Ask({ListServices()}, &status);
  EXPECT_TRUE(answers.empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(checks, 1);
}

TEST_F(ReflectionTest, GarbageAndOtherMethodsAreRefused) {
  Serve();
  grpc::GenericStub stub(channel_);
  for (const std::string method :
       {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "/no.Such/Method"}) {
    grpc::ClientContext context;
    grpc::CompletionQueue cq;
    auto call = stub.PrepareCall(&context, method, &cq);
    void* tag;
    bool ok;
    call->StartCall(nullptr);
    cq.Next(&tag, &ok);
    grpc::Slice junk(std::string("\xff\xff\xff", 3));
    call->WriteLast(grpc::ByteBuffer(&junk, 1), grpc::WriteOptions(), nullptr);
    cq.Next(&tag, &ok);
    grpc::Status status;
    call->Finish(&status, nullptr);
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(status.error_code(), method.find("no.Such") == std::string::npos
                                       ? grpc::StatusCode::INVALID_ARGUMENT
                                       : grpc::StatusCode::UNIMPLEMENTED)
        << method << ": " << status.error_message();
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
}

}  // namespace
}  // namespace gpumove
