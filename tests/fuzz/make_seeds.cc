// Writes the fuzz targets' seed corpora under the folder given (tests/fuzz/corpus):
//   bazel run //tests/fuzz:make_seeds -- $PWD/tests/fuzz/corpus
// Real UCX objects come from a context and worker made here.
#include <ucp/api/ucp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/cluster/peer_auth.h"
#include "daemon/path/mpi/mpi_hello.pb.h"
#include "daemon/path/ucx/ucx_hello.pb.h"
#include "proto/gpumove/peer/v1/peer.pb.h"
#include "proto/gpumove/v1/gpumove.pb.h"

namespace {

std::string dir;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir + "/" + target);
  std::ofstream(dir + "/" + target + "/" + name, std::ios::binary) << bytes;
}

// A request of the service fuzzer: the byte that picks the call, then the request.
void Call(int op, const std::string& name, const google::protobuf::Message& m) {
  Write("service_fuzz", name, std::string(1, static_cast<char>(op)) + m.SerializeAsString());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  dir = argv[1];
  namespace v1 = gpumove::v1;
  namespace peer = gpumove::peer;
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h context;
  ucp_worker_h worker;
  if (ucp_init(&params, nullptr, &context) != UCS_OK) return 1;
  ucp_worker_params_t wp = {};
  if (ucp_worker_create(context, &wp, &worker) != UCS_OK) return 1;
  ucp_address_t* address;
  size_t length;
  if (ucp_worker_get_address(worker, &address, &length) != UCS_OK) return 1;
  const std::string worker_address(reinterpret_cast<const char*>(address), length);
  std::vector<char> memory(1 << 20);
  ucp_mem_map_params_t mp = {};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = memory.data();
  mp.length = memory.size();
  ucp_mem_h memh;
  if (ucp_mem_map(context, &mp, &memh) != UCS_OK) return 1;
  void* packed;
  size_t packed_size;
  if (ucp_rkey_pack(context, memh, &packed, &packed_size) != UCS_OK) return 1;
  const std::string rkey(static_cast<const char*>(packed), packed_size);

  Write("ucx_wire_fuzz", "address", worker_address);
  Write("ucx_wire_fuzz", "rkey", rkey);
  Write("ucx_wire_fuzz", "address_cut", worker_address.substr(0, worker_address.size() / 2));

  Write("ref_fuzz", "id", "b-5edec04929322d30");
  Write("ref_fuzz", "node_id_offset", "node-b/b-1@4KiB");
  Write("ref_fuzz", "offset", "b-2@1048576");

  peer::v1::NodeDescriptor d;
  d.set_node("node-b");
  d.set_address("127.0.0.1:7471");
  d.set_host_id("vm/4f1c");
  d.set_incarnation(77);
  d.set_version("0.1");
  // Each path's blob: UCX's details, and MPI's for a rank of a job.
  peer::v1::UcxDetails ucx;
  ucx.set_worker_address(worker_address);
  ucx.set_peer_calls(true);
  peer::v1::RegisteredPool* pool = ucx.add_pools();
  pool->set_kind(v1::HOST);
  pool->set_device(-1);
  pool->set_base(0x7f0000000000);
  pool->set_size(1 << 30);
  pool->set_rkey(rkey);
  peer::v1::UcxLane* lane = ucx.add_lanes();
  lane->set_worker_address(worker_address);
  lane->add_rkeys(rkey);
  peer::v1::PathDetails* ucx_blob = d.add_paths();
  ucx_blob->set_path("ucx");
  ucx_blob->set_details(ucx.SerializeAsString());
  Write("descriptor_fuzz", "node", d.SerializeAsString());
  peer::v1::MpiDetails mpi;
  mpi.set_rank(1);
  mpi.set_world(0x5eed);
  peer::v1::PathDetails* mpi_blob = d.add_paths();
  mpi_blob->set_path("mpi");
  mpi_blob->set_details(mpi.SerializeAsString());
  Write("descriptor_fuzz", "rank", d.SerializeAsString());

  const std::string first(1, '\0'), second(1, '\1');
  {
    v1::AllocateRequest r;
    r.set_size(4096);
    r.set_kind(v1::PINNED_HOST);
    Call(0, "allocate", r);
  }
  {
    v1::ReleaseRequest r;
    r.set_buffer_id(first);
    Call(1, "release", r);
  }
  {
    v1::GetBufferRequest r;
    r.set_buffer_id(second);
    Call(2, "get_buffer", r);
  }
  Call(3, "list_buffers", v1::ListBuffersRequest());
  {
    v1::SubmitRequest r;
    v1::TransferSpec* t = r.add_transfers();
    t->mutable_source()->set_buffer_id(first);
    t->mutable_source()->set_length(65536);
    t->mutable_destination()->set_buffer_id(second);
    t->mutable_destination()->set_offset(4096);
    t->set_checksum(true);
    r.set_wait(true);
    Call(7, "submit", r);
    v1::TransferSpec* u = r.add_transfers();
    *u = *t;
    u->mutable_destination()->set_node("node-x");
    r.set_idempotency_key("k");
    Call(7, "submit_batch", r);
  }
  {
    v1::WaitRequest r;
    r.set_id(first);
    Call(10, "wait", r);
    v1::CancelRequest c;
    c.set_id(first);
    Call(11, "cancel", c);
  }
  Call(12, "info", v1::GetInfoRequest());
  {
    peer::v1::HelloRequest r;
    *r.mutable_from() = d;
    Call(14, "hello", r);
  }
  {
    peer::v1::PrepareRemoteRequest r;
    r.set_transfer_id("t");
    r.set_from_node("node-b");
    r.set_from_incarnation(77);
    r.mutable_range()->set_buffer_id(first);
    r.mutable_range()->set_length(8192);
    r.set_write(true);
    peer::v1::PrepareRemoteBatchRequest b;
    *b.add_items() = r;
    r.set_transfer_id("u");
    *b.add_items() = r;
    Call(16, "prepare_batch", b);
  }
  {
    peer::v1::CompleteRemoteRequest r;
    r.set_transfer_id("t");
    r.set_from_node("node-b");
    r.set_checksum(true);
    peer::v1::CompleteRemoteBatchRequest b;
    *b.add_items() = r;
    Call(18, "complete_batch", b);
  }
  {
    peer::v1::TakeStageSlotsRequest r;
    r.set_transfer_id("t");
    Call(19, "take_slots", r);
    peer::v1::PathCallRequest p;
    p.set_path("ucx");
    p.set_method("take_stage_slots");
    p.set_from_node("node-b");
    p.set_from_incarnation(77);
    p.set_body(r.SerializeAsString());
    Call(15, "path_call", p);
    peer::v1::StageChunkRequest s;
    s.set_transfer_id("t");
    s.set_slot(1);
    s.set_offset(4096);
    s.set_length(4096);
    s.set_to_range(true);
    Call(20, "stage_chunk", s);
  }
  {
    v1::WriteRequest r;
    r.mutable_target()->set_buffer_id(first);
    r.mutable_target()->set_length(5);
    r.set_data("hello");
    Call(22, "write", r);
    v1::ReadRequest q;
    q.mutable_source()->set_buffer_id(second);
    q.mutable_source()->set_length(4096);
    q.set_chunk_size(1024);
    Call(23, "read", q);
  }
  {
    // The UCX call channel: a key, then framed bodies with no stamp, a member's stamp (of
    // another secret than the fuzzer's), and one for another key.
    gpumove::PeerAuth member("seed-cluster-secret-0123456789", "node-a", 5);
    peer::v1::TakeStageSlotsRequest take;
    take.set_transfer_id("t");
    peer::v1::PathCallRequest call;
    call.set_path("ucx");
    call.set_method("take_stage_slots");
    call.set_from_node("node-a");
    call.set_from_incarnation(5);
    call.set_body(take.SerializeAsString());
    const std::string body = call.SerializeAsString();
    auto seed = [](uint8_t method, const std::string& key, const std::string& stamp,
                   const std::string& body) {
      std::string out{static_cast<char>(method), static_cast<char>(key.size())};
      out += key;
      for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(stamp.size() >> (8 * i)));
      return out + stamp + body;
    };
    Write("ucx_call_fuzz", "unstamped", seed(3, "node-a#5", "", body));
    Write("ucx_call_fuzz", "stamped", seed(3, "node-a#5", member.Stamp(3, body, 1).stamp, body));
    Write("ucx_call_fuzz", "other_key", seed(1, "node-b#6", member.Stamp(1, body, 1).stamp, body));
  }
  std::printf("seeds written under %s\n", dir.c_str());
  return 0;
}
