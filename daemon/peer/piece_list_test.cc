#include "daemon/peer/piece_list.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

using Pieces = std::vector<std::pair<uint64_t, uint64_t>>;

peer::v1::PieceList Encode(const Pieces& p) {
  peer::v1::PieceList list;
  EncodePieces(
      p.size(), [&](size_t i) { return p[i].first; }, [&](size_t i) { return p[i].second; }, &list);
  return list;
}

Pieces Decode(const PieceListView& v) {
  Pieces out;
  for (size_t i = 0; i < v.size(); ++i) out.emplace_back(v.offset(i), v.length(i));
  return out;
}

TEST(PieceList, PiecesReadBackAsWritten) {
  const Pieces mixed = {{4096, 10}, {0, 4096}, {1ull << 40, 1}, {77, 1ull << 33}};
  const Pieces uniform = {{8192, 4096}, {0, 4096}, {1ull << 40, 4096}};
  for (const Pieces& p : {mixed, uniform}) {
    const peer::v1::PieceList list = Encode(p);  // The view borrows its arrays.
    auto v = PieceListView::Of(list, 16);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(Decode(*v), p);
  }
  // One length for a block list's pieces goes once.
  peer::v1::PieceList e = Encode(uniform);
  EXPECT_EQ(e.lengths_size(), 0);
  EXPECT_EQ(e.length(), 4096u);
  EXPECT_EQ(Encode(mixed).lengths_size(), 4);
  // It survives the wire.
  peer::v1::StageChunkRequest request;
  *request.mutable_pieces() = e;
  peer::v1::StageChunkRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString()));
  auto v = PieceListView::Of(parsed.pieces(), 16);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(Decode(*v), uniform);
}

TEST(PieceList, NoPiecesIsAnEmptyView) {
  const peer::v1::PieceList none = Encode({});
  auto v = PieceListView::Of(none, 16);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->empty());
  const peer::v1::StageChunkRequest unset;
  v = PieceListView::Of(unset.pieces(), 16);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->empty());
}

TEST(PieceList, BadFormsAreRefused) {
  auto refused = [](const peer::v1::PieceList& e, size_t max = 16) {
    auto v = PieceListView::Of(e, max);
    return !v.ok() && v.status().code() == absl::StatusCode::kInvalidArgument;
  };
  const Pieces p = {{0, 1}, {8, 2}};
  {  // Lengths of another count.
    peer::v1::PieceList e = Encode(p);
    e.mutable_lengths()->RemoveLast();
    EXPECT_TRUE(refused(e));
  }
  {  // Lengths per piece and for all.
    peer::v1::PieceList e = Encode(p);
    e.set_length(1);
    EXPECT_TRUE(refused(e));
  }
  {  // No lengths at all.
    peer::v1::PieceList e = Encode({{0, 4}, {8, 4}});
    e.set_length(0);
    EXPECT_TRUE(refused(e));
  }
  {  // Lengths without offsets.
    peer::v1::PieceList e;
    e.add_lengths(4);
    EXPECT_TRUE(refused(e));
  }
  // More than the call takes.
  EXPECT_TRUE(refused(Encode(p), 1));
}

}  // namespace
}  // namespace gpumove
