// Each path's part of the hold handshake: what the holder writes is what the runner reads,
// and a path's offer is made only from its own part of the answer.
#include <gtest/gtest.h>

#include "daemon/peer/kinds.h"
#include "daemon/path/cuda_ipc/cuda_ipc_protocol.h"
#include "daemon/path/mpi/mpi_protocol.h"
#include "daemon/path/ucx/ucx_protocol.h"

namespace gpumove {
namespace {

peer::v1::NodeDescriptor Holder() {
  peer::v1::NodeDescriptor d;
  d.set_node("holder");
  d.set_ucx_worker_address("worker-0");
  for (auto [kind, device, rkey] :
       {std::tuple{v1::HOST, -1, "rkey-host"}, std::tuple{v1::PINNED_HOST, -1, "rkey-pinned"},
        std::tuple{v1::DEVICE, 0, "rkey-gpu0"}}) {
    peer::v1::RegisteredPool* p = d.add_pools();
    p->set_kind(kind);
    p->set_device(device);
    p->set_rkey(rkey);
  }
  peer::v1::UcxLane* lane = d.add_ucx_lanes();
  lane->set_worker_address("worker-1");
  for (const char* k : {"l1-host", "l1-pinned", "l1-gpu0"}) lane->add_rkeys(k);
  return d;
}

TEST(UcxProtocol, TheRunnerReadsThePoolTheHolderOffered) {
  const peer::v1::NodeDescriptor holder = Holder(), self;
  peer::v1::PrepareRemoteResponse response;
  OfferUcx(holder, MemoryKind::kDevice, 0, &response);
  RemoteHold hold;
  UcxCodec().DecodeOffer(holder, self, RemoteAsk{}, response, &hold);
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
  const peer::v1::NodeDescriptor holder = Holder(), self;
  peer::v1::PrepareRemoteResponse response;
  OfferUcx(holder, MemoryKind::kDevice, 3, &response);  // No pool of GPU 3.
  EXPECT_FALSE(response.has_ucx());
  RemoteHold hold;
  UcxCodec().DecodeOffer(holder, self, RemoteAsk{}, response, &hold);
  ASSERT_NE(hold.offer<UcxOffer>(), nullptr);
  EXPECT_TRUE(hold.offer<UcxOffer>()->rkey.empty());
  EXPECT_TRUE(hold.offer<UcxOffer>()->lanes.empty());
  // A holder without UCX offers nothing.
  peer::v1::NodeDescriptor bare;
  RemoteHold none;
  UcxCodec().DecodeOffer(bare, self, RemoteAsk{}, response, &none);
  EXPECT_TRUE(none.offers.empty());
}

TEST(UcxProtocol, BounceSlotsNowOrLater) {
  const peer::v1::NodeDescriptor holder = Holder(), self;
  char a[8], b[8];
  peer::v1::PrepareRemoteResponse now, later;
  OfferStage(holder, {a, b}, 8, false, &now);
  OfferStage(holder, {}, 8, true, &later);
  RemoteHold h1, h2;
  UcxCodec().DecodeOffer(holder, self, RemoteAsk{}, now, &h1);
  UcxCodec().DecodeOffer(holder, self, RemoteAsk{}, later, &h2);
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
  CudaIpcCodec().DecodeOffer({}, {}, RemoteAsk{}, response, &none);
  EXPECT_EQ(none.offer<CudaIpcOffer>(), nullptr);
  OfferCudaIpc(std::string(64, 'h'), 4096, "GPU-uuid", &response);
  RemoteHold hold;
  CudaIpcCodec().DecodeOffer({}, {}, RemoteAsk{}, response, &hold);
  const CudaIpcOffer* offer = hold.offer<CudaIpcOffer>();
  ASSERT_NE(offer, nullptr);
  EXPECT_EQ(offer->handle, std::string(64, 'h'));
  EXPECT_EQ(offer->offset, 4096u);
  EXPECT_EQ(offer->device_uuid, "GPU-uuid");
}

TEST(MpiProtocol, OfferedBetweenRanksOfOneJobWithTheTagAsked) {
  peer::v1::NodeDescriptor self, holder, stranger;
  self.set_mpi_world(7);
  self.set_mpi_rank(0);
  holder.set_mpi_world(7);
  holder.set_mpi_rank(3);
  stranger.set_mpi_world(8);
  stranger.set_mpi_rank(3);
  RemoteAsk ask;
  auto mpi = std::make_shared<MpiAsk>();
  mpi->tag = 42;
  mpi->chunk = 1 << 20;
  ask.path_ask = mpi;
  peer::v1::PrepareRemoteRequest request;
  MpiCodec().EncodeAsk(*ask.path_ask, self, holder, &request);
  EXPECT_EQ(request.mpi().from_rank(), 0);
  EXPECT_EQ(request.mpi().tag(), 42);
  EXPECT_EQ(request.mpi().chunk(), 1u << 20);

  peer::v1::PrepareRemoteResponse response;
  RemoteHold not_started;
  MpiCodec().DecodeOffer(holder, self, ask, response, &not_started);
  ASSERT_NE(not_started.offer<MpiOffer>(), nullptr);
  EXPECT_EQ(not_started.offer<MpiOffer>()->rank, 3);
  EXPECT_EQ(not_started.offer<MpiOffer>()->started_tag, 0);
  response.mutable_mpi()->set_started(true);
  RemoteHold started;
  MpiCodec().DecodeOffer(holder, self, ask, response, &started);
  EXPECT_EQ(started.offer<MpiOffer>()->started_tag, 42);
  EXPECT_EQ(started.offer<MpiOffer>()->started_chunk, 1u << 20);
  RemoteHold elsewhere;
  MpiCodec().DecodeOffer(stranger, self, ask, response, &elsewhere);
  EXPECT_EQ(elsewhere.offer<MpiOffer>(), nullptr);
  // Another path's ask is not MPI's to write.
  peer::v1::PrepareRemoteRequest other;
  MpiCodec().EncodeAsk(PathAsk{}, self, holder, &other);
  EXPECT_FALSE(other.has_mpi());
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
  peer::v1::NodeDescriptor self, holder;
  self.set_mpi_rank(3);
  MpiAsk ask;
  ask.tag = 9;
  ask.chunk = 4 << 20;
  ask.piece_count = 65536;
  ask.list_key = 77;
  peer::v1::PrepareRemoteRequest vectored;
  MpiCodec().EncodeAsk(ask, self, holder, &vectored);
  EXPECT_EQ(vectored.mpi().from_rank(), 3);
  EXPECT_EQ(vectored.mpi().tag(), 9);
  EXPECT_EQ(vectored.mpi().chunk(), 4u << 20);
  EXPECT_EQ(vectored.mpi().piece_count(), 65536u);
  EXPECT_EQ(vectored.mpi().list_key(), 77u);
  ask.piece_count = 0;
  peer::v1::PrepareRemoteRequest whole;
  MpiCodec().EncodeAsk(ask, self, holder, &whole);
  EXPECT_EQ(whole.mpi().tag(), 9);
  EXPECT_EQ(whole.mpi().piece_count(), 0u);
  EXPECT_EQ(whole.mpi().list_key(), 0u);  // Only a vectored move's list has a key.
  // No tag: nothing asked (the half starts when the move runs).
  ask.tag = 0;
  peer::v1::PrepareRemoteRequest none;
  MpiCodec().EncodeAsk(ask, self, holder, &none);
  EXPECT_FALSE(none.has_mpi());
}

}  // namespace
}  // namespace gpumove
