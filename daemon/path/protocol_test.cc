// Each path's part of the hold handshake: what the holder writes is what the runner reads,
// and a path's offer is made only from its own part of the answer.
#include <gtest/gtest.h>

#include "daemon/peer/kinds.h"
#include "daemon/path/cuda_ipc/cuda_ipc_protocol.h"
#include "daemon/path/mpi/mpi_protocol.h"
#include "daemon/path/mpi/mpi_hello.h"
#include "daemon/path/ucx/ucx_hello.h"
#include "daemon/path/ucx/ucx_protocol.h"

namespace gpumove {
namespace {

// The holder's UCX details, as it packs them.
peer::v1::UcxDetails HolderUcx() {
  peer::v1::UcxDetails d;
  d.set_worker_address("worker-0");
  for (auto [kind, device, rkey] :
       {std::tuple{v1::HOST, -1, "rkey-host"}, std::tuple{v1::PINNED_HOST, -1, "rkey-pinned"},
        std::tuple{v1::DEVICE, 0, "rkey-gpu0"}}) {
    peer::v1::RegisteredPool* p = d.add_pools();
    p->set_kind(kind);
    p->set_device(device);
    p->set_rkey(rkey);
  }
  peer::v1::UcxLane* lane = d.add_lanes();
  lane->set_worker_address("worker-1");
  for (const char* k : {"l1-host", "l1-pinned", "l1-gpu0"}) lane->add_rkeys(k);
  return d;
}

// The holder as the runner's cluster keeps it: its UCX details read (and checked, with no
// address shape: made-up addresses) from its Hello blob.
PeerView Holder() {
  PeerView v;
  v.node = "holder";
  v.descriptor.set_node("holder");
  const UcxHello reader(peer::v1::UcxDetails(), nullptr);
  auto view = reader.Read(HolderUcx().SerializeAsString());
  EXPECT_TRUE(view.ok()) << view.status();
  if (view.ok()) v.paths.emplace_back(kUcxHelloPath, *view);
  return v;
}

// A node that is rank `rank` of MPI job `world`, as the runner's cluster keeps it.
PeerView Rank(int rank, uint64_t world) {
  PeerView v;
  auto view = MpiHello(0, 1).Read(MpiHello(rank, world).Pack());
  EXPECT_TRUE(view.ok()) << view.status();
  if (view.ok()) v.paths.emplace_back(kMpiHelloPath, *view);
  return v;
}

TEST(UcxProtocol, TheRunnerReadsThePoolTheHolderOffered) {
  const PeerView holder = Holder();
  peer::v1::PrepareRemoteResponse response;
  OfferUcx(HolderUcx(), MemoryKind::kDevice, 0, &response);
  RemoteHold hold;
  UcxCodec().DecodeOffer(holder, RemoteAsk{}, response, &hold);
  const UcxOffer* offer = hold.offer<UcxOffer>();
  ASSERT_NE(offer, nullptr);
  EXPECT_EQ(offer->worker_address, "worker-0");
  EXPECT_EQ(offer->rkey, "rkey-gpu0");
  ASSERT_EQ(offer->lanes.size(), 1u);
  EXPECT_EQ(offer->lanes[0].worker_address, "worker-1");
  EXPECT_EQ(offer->lanes[0].rkey, "l1-gpu0");
  EXPECT_FALSE(offer->stage.has_value());
  EXPECT_EQ(hold.offer<CudaIpcOffer>(), nullptr);
}

TEST(UcxProtocol, AnUnregisteredPoolIsOfferedWithoutAKey) {
  const PeerView holder = Holder();
  peer::v1::PrepareRemoteResponse response;
  OfferUcx(HolderUcx(), MemoryKind::kDevice, 3, &response);  // No pool of GPU 3.
  EXPECT_FALSE(response.has_ucx());
  RemoteHold hold;
  UcxCodec().DecodeOffer(holder, RemoteAsk{}, response, &hold);
  ASSERT_NE(hold.offer<UcxOffer>(), nullptr);
  EXPECT_TRUE(hold.offer<UcxOffer>()->rkey.empty());
  EXPECT_TRUE(hold.offer<UcxOffer>()->lanes.empty());
  // A holder without UCX (no UCX details in its Hello) offers nothing.
  PeerView bare;
  RemoteHold none;
  UcxCodec().DecodeOffer(bare, RemoteAsk{}, response, &none);
  EXPECT_TRUE(none.offers.empty());
  // Nor does an offer for a pool past the holder's list.
  response.mutable_ucx()->set_pool_index(3);
  RemoteHold past;
  UcxCodec().DecodeOffer(holder, RemoteAsk{}, response, &past);
  ASSERT_NE(past.offer<UcxOffer>(), nullptr);
  EXPECT_TRUE(past.offer<UcxOffer>()->rkey.empty());
}

TEST(UcxProtocol, BounceSlotsNowOrLater) {
  const PeerView holder = Holder();
  char a[8], b[8];
  peer::v1::PrepareRemoteResponse now, later;
  OfferStage(HolderUcx(), {a, b}, 8, false, &now);
  OfferStage(HolderUcx(), {}, 8, true, &later);
  RemoteHold h1, h2;
  UcxCodec().DecodeOffer(holder, RemoteAsk{}, now, &h1);
  UcxCodec().DecodeOffer(holder, RemoteAsk{}, later, &h2);
  const auto& s1 = h1.offer<UcxOffer>()->stage;
  ASSERT_TRUE(s1.has_value());
  EXPECT_EQ(s1->slots,
            (std::vector<uint64_t>{reinterpret_cast<uint64_t>(a), reinterpret_cast<uint64_t>(b)}));
  EXPECT_EQ(s1->slot_size, 8u);
  EXPECT_EQ(s1->rkey, "rkey-pinned");
  EXPECT_FALSE(s1->later);
  const auto& s2 = h2.offer<UcxOffer>()->stage;
  ASSERT_TRUE(s2.has_value());
  EXPECT_TRUE(s2->slots.empty());
  EXPECT_TRUE(s2->later);
  EXPECT_EQ(s2->slot_size, 8u);
}

TEST(CudaIpcProtocol, TheHandleTravelsWithTheHold) {
  peer::v1::PrepareRemoteResponse response;
  RemoteHold none;
  CudaIpcCodec().DecodeOffer(PeerView{}, RemoteAsk{}, response, &none);
  EXPECT_EQ(none.offer<CudaIpcOffer>(), nullptr);
  OfferCudaIpc(std::string(64, 'h'), 4096, "GPU-uuid", &response);
  RemoteHold hold;
  CudaIpcCodec().DecodeOffer(PeerView{}, RemoteAsk{}, response, &hold);
  const CudaIpcOffer* offer = hold.offer<CudaIpcOffer>();
  ASSERT_NE(offer, nullptr);
  EXPECT_EQ(offer->handle, std::string(64, 'h'));
  EXPECT_EQ(offer->offset, 4096u);
  EXPECT_EQ(offer->device_uuid, "GPU-uuid");
}

TEST(MpiProtocol, OfferedBetweenRanksOfOneJobWithTheTagAsked) {
  const MpiHello self(0, 7);
  const PeerView holder = Rank(3, 7), stranger = Rank(3, 8);
  const MpiCodec codec(&self);
  RemoteAsk ask;
  auto mpi = std::make_shared<MpiAsk>();
  mpi->tag = 42;
  mpi->chunk = 1 << 20;
  ask.path_ask = mpi;
  peer::v1::PrepareRemoteRequest request;
  codec.EncodeAsk(*ask.path_ask, holder, &request);
  EXPECT_EQ(request.mpi().from_rank(), 0);
  EXPECT_EQ(request.mpi().tag(), 42);
  EXPECT_EQ(request.mpi().chunk(), 1u << 20);

  peer::v1::PrepareRemoteResponse response;
  RemoteHold not_started;
  codec.DecodeOffer(holder, ask, response, &not_started);
  ASSERT_NE(not_started.offer<MpiOffer>(), nullptr);
  EXPECT_EQ(not_started.offer<MpiOffer>()->rank, 3);
  EXPECT_EQ(not_started.offer<MpiOffer>()->started_tag, 0);
  response.mutable_mpi()->set_started(true);
  RemoteHold started;
  codec.DecodeOffer(holder, ask, response, &started);
  EXPECT_EQ(started.offer<MpiOffer>()->started_tag, 42);
  EXPECT_EQ(started.offer<MpiOffer>()->started_chunk, 1u << 20);
  RemoteHold elsewhere;
  codec.DecodeOffer(stranger, ask, response, &elsewhere);
  EXPECT_EQ(elsewhere.offer<MpiOffer>(), nullptr);
  // A node that is no rank offers no MPI, nor does a holder to a runner that is none.
  RemoteHold no_rank, not_a_rank_here;
  codec.DecodeOffer(PeerView{}, ask, response, &no_rank);
  EXPECT_EQ(no_rank.offer<MpiOffer>(), nullptr);
  MpiCodec(nullptr).DecodeOffer(holder, ask, response, &not_a_rank_here);
  EXPECT_EQ(not_a_rank_here.offer<MpiOffer>(), nullptr);
  // Another path's ask is not MPI's to write.
  peer::v1::PrepareRemoteRequest other;
  codec.EncodeAsk(PathAsk{}, holder, &other);
  EXPECT_FALSE(other.has_mpi());
}

TEST(UcxHello, AMalformedOrUnboundedBlobIsRefused) {
  // With no address shape (this node's own did not parse) the bounds still hold.
  const UcxHello reader(peer::v1::UcxDetails(), nullptr);
  EXPECT_TRUE(reader.Read(HolderUcx().SerializeAsString()).ok());
  EXPECT_TRUE(reader.Read("").ok());  // Every field unset: no worker, no offer.
  std::vector<std::string> bad = {std::string("\x0a\xff\xff\xff\x7f", 5)};  // Cut short.
  peer::v1::UcxDetails pools = HolderUcx();
  pools.clear_lanes();
  for (int i = 0; i < kMaxUcxPools; ++i) pools.add_pools();
  bad.push_back(pools.SerializeAsString());  // 67 pools.
  peer::v1::UcxDetails lanes;
  for (int i = 0; i < kMaxUcxLanes + 1; ++i) lanes.add_lanes();
  bad.push_back(lanes.SerializeAsString());  // 65 lanes.
  peer::v1::UcxDetails keys = HolderUcx();
  keys.mutable_lanes(0)->mutable_rkeys()->RemoveLast();  // A lane short of a pool's key.
  bad.push_back(keys.SerializeAsString());
  for (const std::string& blob : bad) {
    EXPECT_EQ(reader.Read(blob).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // With a shape (an empty one: no transport known), made-up addresses and keys are
  // refused.
  const UcxHello checking(peer::v1::UcxDetails(), std::make_shared<UcxAddressShape>());
  EXPECT_EQ(checking.Read(HolderUcx().SerializeAsString()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MpiHello, ABlobThatIsNoRankOfAJobIsRefused) {
  const MpiHello reader(0, 7);
  EXPECT_TRUE(reader.Read(MpiHello(5, 9).Pack()).ok());
  for (const std::string& bad : {MpiHello(-1, 7).Pack(), MpiHello(2, 0).Pack(),
                                 std::string("\xff\xff\xff")}) {
    EXPECT_EQ(reader.Read(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(Kinds, UnknownValuesAreRefusedNotTakenForAnother) {
  EXPECT_EQ(*FromProto(v1::DEVICE), MemoryKind::kDevice);
  EXPECT_EQ(ToProto(MemoryKind::kPinnedHost), v1::PINNED_HOST);
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(static_cast<v1::MemoryKind>(99)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(static_cast<v1::Path>(99)).status()));
  for (PathKind p :
       {PathKind::kAuto, PathKind::kLocal, PathKind::kCudaIpc, PathKind::kUcx, PathKind::kMpi}) {
    EXPECT_EQ(*FromProto(ToProto(p)), p);
  }
}

// An MPI half starts with the hold for a push and for a vectored move either way (its
// pieces come as the move's first message); a list the runner keeps goes with its key.
TEST(MpiProtocol, HalvesAreAskedToStartWithTheHold) {
  const MpiHello self(3, 7);
  const PeerView holder = Rank(0, 7);
  const MpiCodec codec(&self);
  MpiAsk ask;
  ask.tag = 9;
  ask.chunk = 4 << 20;
  ask.piece_count = 65536;
  ask.list_key = 77;
  peer::v1::PrepareRemoteRequest vectored;
  codec.EncodeAsk(ask, holder, &vectored);
  EXPECT_EQ(vectored.mpi().from_rank(), 3);
  EXPECT_EQ(vectored.mpi().tag(), 9);
  EXPECT_EQ(vectored.mpi().chunk(), 4u << 20);
  EXPECT_EQ(vectored.mpi().piece_count(), 65536u);
  EXPECT_EQ(vectored.mpi().list_key(), 77u);
  ask.piece_count = 0;
  peer::v1::PrepareRemoteRequest whole;
  codec.EncodeAsk(ask, holder, &whole);
  EXPECT_EQ(whole.mpi().tag(), 9);
  EXPECT_EQ(whole.mpi().piece_count(), 0u);
  EXPECT_EQ(whole.mpi().list_key(), 0u);  // Only a vectored move's list has a key.
  // No tag: nothing asked (the half starts when the move runs).
  ask.tag = 0;
  peer::v1::PrepareRemoteRequest none;
  codec.EncodeAsk(ask, holder, &none);
  EXPECT_FALSE(none.has_mpi());
}

}  // namespace
}  // namespace gpumove
