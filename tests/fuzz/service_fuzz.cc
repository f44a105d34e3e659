// Fuzzes a real daemon through its services: every unary RPC of gpumove.v1 and of the peer
// protocol (Hello with mutated node descriptors, holds, path calls: staging, MPI steps;
// any path and method through the generic call), and the Write
// and Read streams, with requests parsed from the input, sent over an in-process channel to
// a daemon running in this process (host pools, staging forced, UCX on shared memory
// only, no peers). The first byte picks the call. No input may crash the daemon or hang a
// call past its deadline. To reach real objects, a one-byte buffer_id (or transfer id)
// names one of the buffers (or transfers) made so far, owner "" of a peer call is the
// fuzzer's principal, and every address a Hello gives is replaced by a closed local port,
// so that nothing the daemon learns makes it dial out.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/app/daemon.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"

namespace gpumove {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

struct Env {
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<v1::BufferService::Stub> buffers;
  std::unique_ptr<v1::TransferService::Stub> transfers;
  std::unique_ptr<v1::NodeService::Stub> node;
  std::unique_ptr<peer::v1::PeerService::Stub> peer;
  std::vector<std::string> buffer_ids;    // Made at start, never released by the fuzzer's
  std::vector<std::string> transfer_ids;  // own cleanup; transfers of the last Submits.
  uint64_t runs = 0;
};

Env* TheEnv() {
  static Env* env = [] {
    // Shared memory only: an address a descriptor gives is never dialed over TCP.
    setenv("UCX_TLS", "self,sm", 1);
    DaemonOptions o;
    o.node = "fuzz-node";
    o.serve.listen = {"127.0.0.1:0"};
    o.pools.host = 64 << 20;
    o.pools.pinned = 32 << 20;
    o.pools.device = 0;
    o.gpus = "none";
    o.mpi.mode = "off";
    o.ucx.force_staging = true;
    o.ucx.peer_calls = false;
    o.ucx.lanes = 1;
    o.cluster.heartbeat = absl::Milliseconds(50);
    o.cluster.peer_timeout = absl::Milliseconds(300);
    o.cluster.forward_timeout = absl::Milliseconds(300);
    o.scheduler.workers = 2;
    auto d = Daemon::Start(o);
    if (!d.ok()) {
      std::fprintf(stderr, "daemon did not start: %s\n", d.status().ToString().c_str());
      std::abort();
    }
    auto* e = new Env;
    e->daemon = *std::move(d);
    auto channel = e->daemon->InProcessChannel();
    e->buffers = v1::BufferService::NewStub(channel);
    e->transfers = v1::TransferService::NewStub(channel);
    e->node = v1::NodeService::NewStub(channel);
    e->peer = peer::v1::PeerService::NewStub(channel);
    for (v1::MemoryKind kind : {v1::HOST, v1::HOST, v1::PINNED_HOST, v1::HOST}) {
      grpc::ClientContext c;
      v1::AllocateRequest r;
      r.set_size(1 << 20);
      r.set_kind(kind);
      v1::Buffer b;
      if (e->buffers->Allocate(&c, r, &b).ok()) e->buffer_ids.push_back(b.id());
    }
    return e;
  }();
  return env;
}

// Points one-byte ids at real objects and every Hello address at a closed port.
void Aim(Message& m, const Env& env) {
  const auto* r = m.GetReflection();
  const auto* d = m.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(m, f); ++k) Aim(*r->MutableRepeatedMessage(&m, f, k), env);
      } else if (r->HasField(m, f)) {
        Aim(*r->MutableMessage(&m, f), env);
      }
      continue;
    }
    if (f->type() != FieldDescriptor::TYPE_STRING || f->is_repeated()) continue;
    const std::string v = r->GetString(m, f);
    const std::string& name = f->name();
    if (name == "buffer_id" && v.size() == 1 && !env.buffer_ids.empty()) {
      r->SetString(&m, f, env.buffer_ids[static_cast<uint8_t>(v[0]) % env.buffer_ids.size()]);
    } else if ((name == "id" || name == "transfer_id") && v.size() == 1 &&
               !env.transfer_ids.empty()) {
      r->SetString(&m, f, env.transfer_ids[static_cast<uint8_t>(v[0]) % env.transfer_ids.size()]);
    } else if (name == "owner" && v.empty()) {
      r->SetString(&m, f, "anonymous");
    } else if (name == "address" && d->name() == "NodeDescriptor") {
      r->SetString(&m, f, "127.0.0.1:1");
    }
  }
}

template <class Request>
bool Parse(const uint8_t* data, size_t size, Request& request, const Env& env) {
  if (!request.ParseFromArray(data, static_cast<int>(size))) return false;
  Aim(request, env);
  return true;
}

void Deadline(grpc::ClientContext& c) {
  c.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
}

// A path's own call (PeerService.PathCall) from node-b at incarnation 77 (the node the
// seeds' Hello introduces), its body `Request` parsed from the input.
template <class Request>
void PathCall(const Env& env, const char* path, const char* method, const uint8_t* data,
              size_t size) {
  Request request;
  if (!Parse(data, size, request, env)) return;
  peer::v1::PathCallRequest call;
  call.set_path(path);
  call.set_method(method);
  call.set_from_node("node-b");
  call.set_from_incarnation(77);
  call.set_body(request.SerializeAsString());
  grpc::ClientContext c;
  Deadline(c);
  peer::v1::PathCallResponse response;
  env.peer->PathCall(&c, call, &response);
}

// One unary call of `stub`: request parsed from the input, response dropped.
template <class Stub, class Request, class Response>
void Unary(Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
           const uint8_t* data, size_t size, Env& env, Response* out = nullptr) {
  Request request;
  if (!Parse(data, size, request, env)) return;
  grpc::ClientContext c;
  Deadline(c);
  Response response;
  (stub.*method)(&c, request, out != nullptr ? out : &response);
}

// Releases the buffers the fuzzer allocated and forgets old transfers, so that the pools
// do not stay full.
void Tidy(Env& env) {
  grpc::ClientContext c;
  Deadline(c);
  v1::ListBuffersRequest r;
  v1::ListBuffersResponse list;
  if (!env.buffers->List(&c, r, &list).ok()) return;
  for (const v1::Buffer& b : list.buffers()) {
    if (std::find(env.buffer_ids.begin(), env.buffer_ids.end(), b.id()) != env.buffer_ids.end()) {
      continue;
    }
    grpc::ClientContext rc;
    Deadline(rc);
    v1::ReleaseRequest rr;
    rr.set_buffer_id(b.id());
    v1::ReleaseResponse resp;
    env.buffers->Release(&rc, rr, &resp);
  }
  if (env.transfer_ids.size() > 64) env.transfer_ids.erase(env.transfer_ids.begin(), env.transfer_ids.end() - 64);
}

}  // namespace
}  // namespace gpumove

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpumove;
  Env& env = *TheEnv();
  if (++env.runs % 2000 == 0) Tidy(env);
  if (size == 0) return 0;
  const uint8_t op = data[0];
  ++data;
  --size;
  using BS = v1::BufferService::Stub;
  using TS = v1::TransferService::Stub;
  using PS = peer::v1::PeerService::Stub;
  switch (op % 24) {
    case 0: Unary(*env.buffers, &BS::Allocate, data, size, env); break;
    case 1: Unary(*env.buffers, &BS::Release, data, size, env); break;
    case 2: Unary(*env.buffers, &BS::Get, data, size, env); break;
    case 3: Unary(*env.buffers, &BS::List, data, size, env); break;
    case 4: Unary(*env.buffers, &BS::RenewLease, data, size, env); break;
    case 5: Unary(*env.buffers, &BS::Import, data, size, env); break;
    case 6: Unary(*env.buffers, &BS::Export, data, size, env); break;
    case 7: {
      v1::SubmitResponse response;
      Unary(*env.transfers, &TS::Submit, data, size, env, &response);
      for (const auto& t : response.transfers()) env.transfer_ids.push_back(t.id());
      break;
    }
    case 8: Unary(*env.transfers, &TS::Get, data, size, env); break;
    case 9: Unary(*env.transfers, &TS::List, data, size, env); break;
    case 10: Unary(*env.transfers, &TS::Wait, data, size, env); break;
    case 11: Unary(*env.transfers, &TS::Cancel, data, size, env); break;
    case 12: Unary(*env.node, &v1::NodeService::Stub::GetInfo, data, size, env); break;
    case 13: Unary(*env.node, &v1::NodeService::Stub::ListPeers, data, size, env); break;
    case 14: Unary(*env.peer, &PS::Hello, data, size, env); break;
    case 15: Unary(*env.peer, &PS::PathCall, data, size, env); break;
    case 16: Unary(*env.peer, &PS::PrepareRemoteBatch, data, size, env); break;
    case 18: Unary(*env.peer, &PS::CompleteRemoteBatch, data, size, env); break;
    case 19:
      PathCall<peer::v1::TakeStageSlotsRequest>(env, "ucx", "take_stage_slots", data, size);
      break;
    case 20: PathCall<peer::v1::StageChunkRequest>(env, "ucx", "stage_chunk", data, size); break;
    case 21:
      if (op & 0x80) {
        PathCall<peer::v1::StartMpiRequest>(env, "mpi", "start_mpi", data, size);
      } else {
        PathCall<peer::v1::StopMpiRequest>(env, "mpi", "stop_mpi", data, size);
      }
      break;
    case 22: {
      v1::WriteRequest first;
      if (!Parse(data, size, first, env)) break;
      grpc::ClientContext c;
      Deadline(c);
      v1::WriteResponse response;
      auto writer = env.buffers->Write(&c, &response);
      writer->Write(first);
      writer->WritesDone();
      writer->Finish().ok();
      break;
    }
    default: {
      v1::ReadRequest request;
      if (!Parse(data, size, request, env)) break;
      grpc::ClientContext c;
      Deadline(c);
      auto reader = env.buffers->Read(&c, request);
      v1::ReadResponse message;
      for (int i = 0; i < 4096 && reader->Read(&message); ++i) {
      }
      c.TryCancel();
      reader->Finish().ok();
      break;
    }
  }
  return 0;
}
