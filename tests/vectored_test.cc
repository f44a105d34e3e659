// Vectored moves (TransferSpec.segments and .blocks) on path LOCAL with host memory:
// random piece lists of 1 B to 1 MiB, shuffled, with and without strides, every byte of
// the destination checked (the pieces' and the untouched bytes between them); bad lists
// refused with their codes and nothing written; cancel; checksums over the pieces.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/pieces.h"
#include "tests/util/random_bytes.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

using absl::StatusCode;

v1::Segment seg(uint64_t source_offset, uint64_t destination_offset, uint64_t length) {
  v1::Segment g;
  g.set_source_offset(source_offset);
  g.set_destination_offset(destination_offset);
  g.set_length(length);
  return g;
}

class VectoredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start({"--node=a", "--host_pool_size=512MiB",
                                   "--pinned_pool_size=16MiB", "--max_blocks_per_move=70000"});
    ASSERT_TRUE(d.ok()) << d.status();
    d_ = *std::move(d);
    auto c = Client::Connect(d_->address(), ConnectOptions{});
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = *std::move(c);
  }
  // A source of `src_size` random bytes and a destination of `dst_size` patterned ones.
  void Buffers(uint64_t src_size, uint64_t dst_size, uint64_t seed) {
    auto s = c_->Allocate(src_size);
    auto d = c_->Allocate(dst_size);
    ASSERT_TRUE(s.ok() && d.ok());
    src_id_ = s->id();
    dst_id_ = d->id();
    src_ = RandomBytes(src_size, seed);
    dst_ = RandomBytes(dst_size, seed + 1000);
    ASSERT_TRUE(c_->Write(Ref(src_id_), src_).ok());
    ASSERT_TRUE(c_->Write(Ref(dst_id_), dst_).ok());
  }
  std::string Destination() {
    auto r = c_->Read(Ref(dst_id_));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : "";
  }

  std::unique_ptr<DaemonProcess> d_;
  std::unique_ptr<Client> c_;
  std::string src_id_, dst_id_, src_, dst_;
};

TEST_F(VectoredTest, RandomSegmentListsMoveEveryByteAndTouchNothingElse) {
  struct Case {
    size_t n;
    uint64_t max_len;
  };
  uint64_t seed = 1;
  for (const Case& k :
       {Case{1, 1}, Case{200, 1}, Case{500, 4096}, Case{64, 1 << 20}, Case{3000, 777}}) {
    ++seed;
    std::mt19937_64 rng(seed);
    const uint64_t slot = k.max_len + 3;  // Gaps between pieces that must stay untouched.
    auto pieces = Shuffled(
        k.n, slot, slot + 5, [&](size_t) { return 1 + rng() % k.max_len; }, seed);
    Buffers(k.n * slot, k.n * (slot + 5), seed);
    MoveOptions o;
    o.checksum = seed % 2 == 0;
    o.segments = AsSegments(pieces);
    auto t = c_->Move(Ref(src_id_), Ref(dst_id_), o);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
    uint64_t total = 0;
    for (const Piece& p : pieces) total += p.len;
    EXPECT_EQ(t->length(), total);
    EXPECT_EQ(t->bytes_done(), total);
    EXPECT_EQ(t->pieces(), k.n);
    EXPECT_EQ(t->path(), v1::LOCAL);
    if (o.checksum) {
      EXPECT_EQ(t->source_xxh3(), PiecesHash(src_, pieces));
      EXPECT_EQ(t->destination_xxh3(), t->source_xxh3());
    }
    EXPECT_TRUE(Destination() == Expected(src_, dst_, pieces)) << k.n << " pieces";
  }
}

TEST_F(VectoredTest, BlockListsWithAndWithoutStrides) {
  uint64_t seed = 100;
  for (uint64_t block : {uint64_t{1}, uint64_t{4096}, uint64_t{65536}}) {
    for (bool strides : {false, true}) {
      ++seed;
      const size_t n = block == 1 ? 5000 : block == 4096 ? 1024 : 64;
      const uint64_t ss = strides ? block * 2 + 8 : block, ds = strides ? block + 16 : block;
      auto pieces = Shuffled(
          n, ss, ds, [&](size_t) { return block; }, seed);
      Buffers(n * ss, n * ds + 100, seed);
      MoveOptions o;
      o.checksum = true;
      o.blocks.set_block_size(block);
      if (strides) {
        o.blocks.set_source_stride(ss);
        o.blocks.set_destination_stride(ds);
      }
      for (const Piece& p : pieces) {
        o.blocks.add_source_blocks(p.src / ss);
        o.blocks.add_destination_blocks(p.dst / ds);
      }
      auto t = c_->Move(Ref(src_id_), Ref(dst_id_), o);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
      EXPECT_EQ(t->pieces(), n);
      EXPECT_EQ(t->source_xxh3(), PiecesHash(src_, pieces));
      EXPECT_TRUE(Destination() == Expected(src_, dst_, pieces)) << block << " " << strides;
    }
  }
  // Offsets of the ranges count: blocks relative to source offset 4096, destination 100.
  Buffers(1 << 20, 1 << 20, 7);
  MoveOptions o;
  o.blocks.set_block_size(512);
  o.blocks.add_source_blocks(3);
  o.blocks.add_destination_blocks(1);
  v1::BufferRef from = Ref(src_id_), to = Ref(dst_id_);
  from.set_offset(4096);
  to.set_offset(100);
  auto t = c_->Move(from, to, o);
  ASSERT_TRUE(t.ok() && t->state() == v1::SUCCEEDED) << t.status();
  EXPECT_EQ(t->source().offset(), 4096u + 3 * 512);  // The range holding the pieces.
  EXPECT_EQ(t->destination().offset(), 100u + 512);
  EXPECT_TRUE(Destination() == Expected(src_, dst_, {{4096 + 3 * 512, 100 + 512, 512}}));
}

// Block indices as varints (*_blocks) or fixed 32-bit integers (*_blocks32), each side in
// either form, move the same bytes; a side in both forms is refused and writes nothing.
TEST_F(VectoredTest, BlockIndicesInEitherFormMoveTheSameBytes) {
  const size_t n = 3000;
  const uint64_t block = 256;
  auto pieces = Shuffled(
      n, block, block, [&](size_t) { return block; }, 77);
  for (int form = 0; form < 4; ++form) {  // Bit 0: source 32-bit, bit 1: destination.
    Buffers(n * block, n * block, 300 + form);
    v1::SubmitRequest request;
    v1::TransferSpec* spec = request.add_transfers();
    *spec->mutable_source() = Ref(src_id_);
    *spec->mutable_destination() = Ref(dst_id_);
    v1::BlockList* b = spec->mutable_blocks();
    b->set_block_size(block);
    for (const Piece& p : pieces) {
      if (form & 1) {
        b->add_source_blocks32(static_cast<uint32_t>(p.src / block));
      } else {
        b->add_source_blocks(p.src / block);
      }
      if (form & 2) {
        b->add_destination_blocks32(static_cast<uint32_t>(p.dst / block));
      } else {
        b->add_destination_blocks(p.dst / block);
      }
    }
    request.set_wait(true);
    auto r = c_->Submit(request);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->transfers(0).state(), v1::SUCCEEDED) << r->transfers(0).error_message();
    EXPECT_EQ(r->transfers(0).pieces(), n);
    EXPECT_TRUE(Destination() == Expected(src_, dst_, pieces)) << "form " << form;
    if (form == 3) {
      // Both forms on one side: refused whole.
      Buffers(n * block, n * block, 400);
      b->add_source_blocks(0);
      auto refused = c_->Submit(request);
      EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
      EXPECT_TRUE(Destination() == dst_);
    }
  }
  // The client packs indices below 2^32 in the 32-bit form, and leaves bigger ones.
  v1::BlockList small, big;
  small.add_source_blocks(7);
  small.add_destination_blocks(uint64_t{1} << 32);
  CompactBlockIndices(&small);
  EXPECT_EQ(small.source_blocks32_size(), 1);
  EXPECT_EQ(small.source_blocks_size(), 0);
  EXPECT_EQ(small.destination_blocks_size(), 1);
  EXPECT_EQ(small.destination_blocks32_size(), 0);
}

TEST_F(VectoredTest, BadListsAreRefusedAndNothingIsWritten) {
  Buffers(1 << 20, 1 << 20, 9);
  auto expect = [&](StatusCode code, const MoveOptions& o, v1::BufferRef to, const char* why) {
    auto t = c_->Move(Ref(src_id_), to, o);
    EXPECT_EQ(t.status().code(), code) << why << ": " << t.status();
    EXPECT_TRUE(Destination() == dst_) << why;
  };
  MoveOptions o;
  o.segments = {seg(0, 0, 100), seg(200, 50, 100)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "destination pieces overlap");
  o.segments = {seg(0, 0, 100), seg(0, (1 << 20) - 10, 100)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "past the destination buffer");
  o.segments = {seg((1 << 20) - 10, 0, 100)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "past the source buffer");
  o.segments = {seg(0, 0, 0)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "an empty piece");
  o.segments = {seg(0, 1000, 100)};
  v1::BufferRef small = Ref(dst_id_);
  small.set_length(500);
  expect(StatusCode::kInvalidArgument, o, small, "past the destination range");
  o.segments = {seg(0, 0, 8)};
  o.blocks.set_block_size(8);
  o.blocks.add_source_blocks(1);
  o.blocks.add_destination_blocks(1);
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "segments and blocks");
  o.segments.clear();
  o.blocks.set_source_blocks(0, uint64_t{1} << 62);
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "index x block size past 2^64");
  o.blocks.set_source_blocks(0, 1);
  o.blocks.add_source_blocks(2);
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "lists of different lengths");
  MoveOptions many;
  many.blocks.set_block_size(1);
  for (int i = 0; i < 70001; ++i) {
    many.blocks.add_source_blocks(i);
    many.blocks.add_destination_blocks(i);
  }
  expect(StatusCode::kResourceExhausted, many, Ref(dst_id_), "past --max_blocks_per_move");
  // Within one buffer, pieces whose ranges overlap.
  o.blocks.Clear();
  o.segments = {seg(0, 10, 100)};
  auto t = c_->Move(Ref(src_id_), Ref(src_id_), o);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status();
  // A batch with one bad vectored move is refused whole.
  v1::SubmitRequest batch;
  for (int i = 0; i < 2; ++i) {
    v1::TransferSpec* s = batch.add_transfers();
    *s->mutable_source() = Ref(src_id_);
    *s->mutable_destination() = Ref(dst_id_);
    *s->add_segments() = seg(0, i == 0 ? 0 : 2 << 20, 64);
  }
  EXPECT_EQ(c_->Submit(batch).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Destination() == dst_);
}

// Prepared piece lists (TransferService.PreparePieces): a block list kept once, with
// strides and indices that do not start at 0 (so that its rebased form is kept too), then
// named by moves between ranges at different offsets, alone and as a batch of "layers"
// into one buffer; every byte checked, checksums over the pieces in list order. Listed with
// its figures; released, it is NOT_FOUND and a move naming it writes nothing.
TEST_F(VectoredTest, PreparedListsMoveTheirPiecesMoveAfterMove) {
  const size_t n = 1000;
  const uint64_t block = 4096, ss = 8200, ds = 4100;
  auto shuffled = Shuffled(
      n, ss, ds, [&](size_t) { return block; }, 901);
  std::vector<Piece> pieces;  // Indices from 3 on both sides.
  v1::BlockList blocks;
  blocks.set_block_size(block);
  blocks.set_source_stride(ss);
  blocks.set_destination_stride(ds);
  uint64_t src_extent = 0, dst_extent = 0;
  for (const Piece& p : shuffled) {
    pieces.push_back({p.src + 3 * ss, p.dst + 3 * ds, block});
    blocks.add_source_blocks(p.src / ss + 3);
    blocks.add_destination_blocks(p.dst / ds + 3);
    src_extent = std::max(src_extent, p.src + 3 * ss + block);
    dst_extent = std::max(dst_extent, p.dst + 3 * ds + block);
  }
  auto list = c_->PreparePieces({}, blocks, "", "kv layout");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->pieces(), n);
  EXPECT_EQ(list->bytes(), n * block);
  EXPECT_EQ(list->source_extent(), src_extent);
  EXPECT_EQ(list->destination_extent(), dst_extent);
  EXPECT_EQ(list->label(), "kv layout");
  auto listed = c_->ListPreparedPieces();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].id(), list->id());
  for (uint64_t k = 0; k < 3; ++k) {
    const uint64_t from = k * 100, to = k * 7;
    Buffers(src_extent + from, dst_extent + to + 50, 910 + k);
    MoveOptions o;
    o.prepared_pieces = list->id();
    o.checksum = true;
    auto t = c_->Move(Ref(src_id_, from), Ref(dst_id_, to), o);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
    EXPECT_EQ(t->pieces(), n);
    EXPECT_EQ(t->length(), n * block);
    std::vector<Piece> moved;
    for (const Piece& p : pieces) moved.push_back({p.src + from, p.dst + to, p.len});
    EXPECT_EQ(t->source_xxh3(), PiecesHash(src_, moved));
    EXPECT_EQ(t->destination_xxh3(), t->source_xxh3());
    EXPECT_TRUE(Destination() == Expected(src_, dst_, moved)) << "move " << k;
  }
  // Two "layers" in one Submit: the same list into two halves of one buffer.
  Buffers(2 * src_extent, 2 * dst_extent, 920);
  v1::SubmitRequest batch;
  std::vector<Piece> both;
  for (uint64_t layer = 0; layer < 2; ++layer) {
    v1::TransferSpec* spec = batch.add_transfers();
    *spec->mutable_source() = Ref(src_id_, layer * src_extent, src_extent);
    *spec->mutable_destination() = Ref(dst_id_, layer * dst_extent, dst_extent);
    spec->set_prepared_pieces(list->id());
    for (const Piece& p : pieces) {
      both.push_back({p.src + layer * src_extent, p.dst + layer * dst_extent, p.len});
    }
  }
  batch.set_wait(true);
  auto r = c_->Submit(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const v1::Transfer& t : r->transfers()) {
    EXPECT_EQ(t.state(), v1::SUCCEEDED) << t.error_message();
  }
  EXPECT_TRUE(Destination() == Expected(src_, dst_, both));
  // Released: gone, and a move naming it is refused with nothing written.
  ASSERT_TRUE(c_->ReleasePieces(list->id()).ok());
  EXPECT_EQ(c_->ReleasePieces(list->id()).code(), StatusCode::kNotFound);
  listed = c_->ListPreparedPieces();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  Buffers(src_extent, dst_extent, 930);
  MoveOptions o;
  o.prepared_pieces = list->id();
  auto gone = c_->Move(Ref(src_id_), Ref(dst_id_), o);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status();
  EXPECT_TRUE(Destination() == dst_);
}

TEST_F(VectoredTest, PreparedListsAreCheckedAndBadOnesRefused) {
  Buffers(1 << 20, 1 << 20, 940);
  // Lists refused when prepared, as in a Submit.
  EXPECT_EQ(c_->PreparePieces({}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_->PreparePieces({seg(0, 0, 100), seg(200, 50, 100)}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c_->PreparePieces({seg(0, 0, 0)}, {}).status().code(), StatusCode::kInvalidArgument);
  v1::BlockList one;
  one.set_block_size(8);
  one.add_source_blocks(0);
  one.add_destination_blocks(0);
  EXPECT_EQ(c_->PreparePieces({seg(0, 0, 8)}, one).status().code(), StatusCode::kInvalidArgument);
  v1::BlockList many;
  many.set_block_size(1);
  for (int i = 0; i < 70001; ++i) {
    many.add_source_blocks(i);
    many.add_destination_blocks(i);
  }
  EXPECT_EQ(c_->PreparePieces({}, many).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c_->PreparePieces({}, one, "nowhere").status().code(), StatusCode::kNotFound);
  auto listed = c_->ListPreparedPieces();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  // Moves naming a good list, refused with nothing written.
  auto list = c_->PreparePieces({seg(0, 1000, 100), seg(5000, 0, 10)}, {});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->destination_extent(), 1100u);
  auto expect = [&](StatusCode code, const MoveOptions& o, v1::BufferRef to, const char* why) {
    auto t = c_->Move(Ref(src_id_), to, o);
    EXPECT_EQ(t.status().code(), code) << why << ": " << t.status();
    EXPECT_TRUE(Destination() == dst_) << why;
  };
  MoveOptions o;
  o.prepared_pieces = list->id();
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_, 0, 1099), "a range shorter than the list");
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_, (1 << 20) - 1000), "past the buffer");
  o.segments = {seg(0, 0, 8)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "a list and segments");
  o.segments.clear();
  o.blocks = one;
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "a list and blocks");
  o.blocks.Clear();
  o.prepared_pieces = "p-0123456789abcdef.a";
  expect(StatusCode::kNotFound, o, Ref(dst_id_), "an unknown list");
  o.prepared_pieces = "p-0123456789abcdef.elsewhere";
  expect(StatusCode::kFailedPrecondition, o, Ref(dst_id_), "a list on a node holding no end");
  o.prepared_pieces = "no-node";
  expect(StatusCode::kFailedPrecondition, o, Ref(dst_id_), "an id without a node");
  // Within one buffer, the list's source and destination pieces overlap.
  o.prepared_pieces = list->id();
  auto t = c_->Move(Ref(src_id_), Ref(src_id_), o);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status();
  o.checksum = false;
  auto ok = c_->Move(Ref(src_id_), Ref(dst_id_), o);
  ASSERT_TRUE(ok.ok() && ok->state() == v1::SUCCEEDED) << ok.status();
  EXPECT_TRUE(Destination() == Expected(src_, dst_, {{0, 1000, 100}, {5000, 0, 10}}));
}

// Each tenant keeps at most --max_prepared_lists lists of --max_prepared_pieces pieces in
// all; a release makes room. A list released while a move that named it runs still moves
// all its pieces.
TEST_F(VectoredTest, PreparedListsAreBoundedAndOutliveTheirRelease) {
  d_.reset();
  auto d = DaemonProcess::Start({"--node=a", "--host_pool_size=512MiB", "--pinned_pool_size=16MiB",
                                 "--max_move_rate=32MiB", "--max_prepared_lists=2",
                                 "--max_prepared_pieces=100"});
  ASSERT_TRUE(d.ok()) << d.status();
  d_ = *std::move(d);
  auto c = Client::Connect(d_->address(), ConnectOptions{});
  ASSERT_TRUE(c.ok());
  c_ = *std::move(c);
  v1::BlockList blocks;
  blocks.set_block_size(512 << 10);
  for (int i = 0; i < 64; ++i) {
    blocks.add_source_blocks(i);
    blocks.add_destination_blocks(63 - i);
  }
  auto big = c_->PreparePieces({}, blocks);
  ASSERT_TRUE(big.ok()) << big.status();
  auto over = c_->PreparePieces({}, blocks);  // 128 pieces > 100.
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status();
  v1::BlockList small;
  small.set_block_size(1);
  small.add_source_blocks(0);
  small.add_destination_blocks(0);
  auto second = c_->PreparePieces({}, small);
  ASSERT_TRUE(second.ok()) << second.status();
  auto third = c_->PreparePieces({}, small);  // A third list > 2.
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted) << third.status();
  ASSERT_TRUE(c_->ReleasePieces(second->id()).ok());
  ASSERT_TRUE(c_->PreparePieces({}, small).ok());
  // A move of 32 MiB at 32 MiB/s; its list released at once.
  Buffers(32 << 20, 32 << 20, 950);
  MoveOptions o;
  o.prepared_pieces = big->id();
  o.wait = false;
  o.checksum = true;
  auto t = c_->Move(Ref(src_id_), Ref(dst_id_), o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(c_->ReleasePieces(big->id()).ok());
  auto end = c_->Wait(t->id(), absl::Seconds(60));
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_EQ(end->state(), v1::SUCCEEDED) << end->error_message();
  std::vector<Piece> pieces;
  for (uint64_t i = 0; i < 64; ++i) pieces.push_back({i << 19, (63 - i) << 19, 512 << 10});
  EXPECT_EQ(end->source_xxh3(), PiecesHash(src_, pieces));
  EXPECT_TRUE(Destination() == Expected(src_, dst_, pieces));
}

TEST_F(VectoredTest, ACancelledVectoredMoveStopsBetweenPieces) {
  d_.reset();
  auto d = DaemonProcess::Start(
      {"--node=a", "--host_pool_size=512MiB", "--pinned_pool_size=16MiB", "--max_move_rate=16MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  d_ = *std::move(d);
  auto c = Client::Connect(d_->address(), ConnectOptions{});
  ASSERT_TRUE(c.ok());
  c_ = *std::move(c);
  Buffers(256 << 20, 256 << 20, 11);
  MoveOptions o;
  o.wait = false;
  o.blocks.set_block_size(1 << 20);
  for (int i = 0; i < 256; ++i) {
    o.blocks.add_source_blocks(i);
    o.blocks.add_destination_blocks(255 - i);
  }
  auto t = c_->Move(Ref(src_id_), Ref(dst_id_), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::SleepFor(absl::Milliseconds(1500));
  ASSERT_TRUE(c_->Cancel(t->id()).ok());
  auto end = c_->Wait(t->id(), absl::Seconds(20));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::CANCELLED);
  EXPECT_GT(end->bytes_done(), 0u);
  EXPECT_LT(end->bytes_done(), uint64_t{256} << 20);
}

struct Way {
  TestNode *from, *to, *via;
};
void MoveBetweenNodesAndCheck(const Way& w, const std::vector<Piece>& pieces, uint64_t src_size,
                              uint64_t dst_size, uint64_t seed) {
  auto end = [](TestNode* n) { return NodeEnd{n->client.get(), n->name}; };
  MoveVectoredAndCheck(end(w.from), end(w.to), end(w.via), v1::PATH_AUTO, v1::UCX, pieces, src_size,
                       dst_size, seed);
}

// Between nodes over UCX: pushes, pulls and a third-party move (submitted to a node that
// holds neither end), through UCX's puts and gets and through same-host direct copies,
// every byte of the destination checked. The moves are checksummed, so each hold carries
// the other node's pieces.
TEST(VectoredNodes, PushPullAndThirdPartyOverUcx) {
  for (bool direct : {false, true}) {
    const std::vector<std::string> flags = {"--host_pool_size=64MiB", "--pinned_pool_size=16MiB",
                                            absl::StrCat("--ucx_direct=", direct)};
    TestNode a = LaunchNode("a", "", flags);
    ASSERT_TRUE(a.client);
    TestNode b = LaunchNode("b", a.process->address(), flags);
    TestNode c = LaunchNode("c", a.process->address(), flags);
    ASSERT_TRUE(b.client && c.client);
    for (TestNode* n : {&a, &b, &c}) ASSERT_TRUE(AwaitPeersUp(*n, 2).ok()) << n->name;
    uint64_t seed = direct ? 500 : 600;
    for (const Way& w : {Way{&a, &b, &a}, Way{&a, &b, &b}, Way{&b, &a, &c}}) {
      ++seed;
      SCOPED_TRACE(absl::StrCat("direct ", direct));
      std::mt19937_64 rng(seed);
      const size_t n = 2000;
      const uint64_t slot = 4099;
      // Pieces of one length (as a block list's) go with one length for all.
      const bool uniform = w.via == &b;
      auto pieces = Shuffled(
          n, slot, slot + 1, [&](size_t) { return uniform ? 4096 : 1 + rng() % 4096; }, seed);
      MoveBetweenNodesAndCheck(w, pieces, n * slot, n * (slot + 1), seed);
    }
  }
}

// Prepared piece lists between nodes: the node that keeps the list runs the move, whichever
// node the Submit went to (a list on the destination's node makes a pull of a move
// submitted to the source's node); a list kept on a node that holds neither end is
// FAILED_PRECONDITION. Every byte and both checksums checked.
TEST(VectoredNodes, PreparedListsRunWhereTheyAreKept) {
  const std::vector<std::string> flags = {"--host_pool_size=64MiB", "--pinned_pool_size=16MiB"};
  TestNode a = LaunchNode("a", "", flags);
  ASSERT_TRUE(a.client);
  TestNode b = LaunchNode("b", a.process->address(), flags);
  TestNode c = LaunchNode("c", a.process->address(), flags);
  ASSERT_TRUE(b.client && c.client);
  for (TestNode* n : {&a, &b, &c}) ASSERT_TRUE(AwaitPeersUp(*n, 2).ok()) << n->name;
  auto end = [](TestNode* n) { return NodeEnd{n->client.get(), n->name}; };
  const size_t n = 1500;
  const uint64_t slot = 4099;
  struct Case {
    TestNode *from, *to, *via, *keeper;
  };
  uint64_t seed = 800;
  for (const Case& k :
       {Case{&a, &b, &a, &b}, Case{&a, &b, &b, &a}, Case{&b, &a, &c, &a}, Case{&b, &a, &c, &b}}) {
    ++seed;
    SCOPED_TRACE(absl::StrCat("list on ", k.keeper->name));
    std::mt19937_64 rng(seed);
    auto pieces = Shuffled(
        n, slot, slot + 1, [&](size_t) { return 1 + rng() % 4096; }, seed);
    const NodeEnd keeper = end(k.keeper);
    MoveVectoredAndCheck(end(k.from), end(k.to), end(k.via), v1::PATH_AUTO, v1::UCX, pieces,
                         n * slot, n * (slot + 1), seed, v1::HOST, v1::HOST, &keeper);
  }
  // Kept on c, a move from a to b: c holds neither end.
  v1::Segment g;
  g.set_length(8);
  auto list = a.client->PreparePieces({g}, {}, "c");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(absl::EndsWith(list->id(), ".c")) << list->id();
  auto s = a.client->Allocate(4096);
  auto d = b.client->Allocate(4096);
  ASSERT_TRUE(s.ok() && d.ok());
  MoveOptions o;
  o.prepared_pieces = list->id();
  v1::BufferRef to = Ref(d->id());
  to.set_node("b");
  auto t = a.client->Move(Ref(s->id()), to, o);
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition) << t.status();
  auto on_c = a.client->ListPreparedPieces("c");
  ASSERT_TRUE(on_c.ok()) << on_c.status();
  ASSERT_EQ(on_c->size(), 1u);
  EXPECT_TRUE(a.client->ReleasePieces(list->id()).ok());  // Forwarded to c.
  on_c = c.client->ListPreparedPieces();
  ASSERT_TRUE(on_c.ok());
  EXPECT_TRUE(on_c->empty());
}

// Vectored moves whose far end the other node stages (--ucx_force_staging there: its
// ranges go through its bounce slots, as its device memory does with a UCX that is not
// CUDA-aware): rounds of pieces packed into its slots, scattered or gathered there in one
// call a round. Pieces longer than a slot (cut across rounds), and more tiny pieces than a
// round takes; push, pull and third party; checksums; every byte checked.
TEST(VectoredNodes, RoundsThroughTheOtherNodesBounceSlots) {
  const std::vector<std::string> common = {"--host_pool_size=64MiB", "--pinned_pool_size=16MiB"};
  TestNode a = LaunchNode("a", "", common);
  ASSERT_TRUE(a.client);
  std::vector<std::string> staged = common;
  staged.push_back("--ucx_force_staging");
  staged.push_back("--stage_chunk=1MiB");
  TestNode b = LaunchNode("b", a.process->address(), staged);
  TestNode c = LaunchNode("c", a.process->address(), common);
  ASSERT_TRUE(b.client && c.client);
  for (TestNode* n : {&a, &b, &c}) ASSERT_TRUE(AwaitPeersUp(*n, 2).ok()) << n->name;
  struct Shape {
    size_t n;
    uint64_t slot, max_len;
  };
  uint64_t seed = 700;
  for (const Shape& k :
       {Shape{20000, 17, 16}, Shape{300, 4099, 4096}, Shape{6, (3 << 20) + 5, 3 << 20}}) {
    for (const Way& w :
         {Way{&a, &b, &a}, Way{&b, &a, &a}, Way{&a, &b, &c}}) {
      ++seed;
      SCOPED_TRACE(absl::StrCat("pieces of up to ", k.max_len));
      std::mt19937_64 rng(seed);
      auto pieces = Shuffled(
          k.n, k.slot, k.slot, [&](size_t) { return 1 + rng() % k.max_len; }, seed);
      MoveBetweenNodesAndCheck(w, pieces, k.n * k.slot, k.n * k.slot, seed);
    }
  }
}

}  // namespace
}  // namespace gpumove
