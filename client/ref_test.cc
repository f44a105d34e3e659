#include "client/ref.h"

#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(ParseBufferRef, BareId) {
  auto r = ParseBufferRef("b-00ff");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->node(), "");
  EXPECT_EQ(r->buffer_id(), "b-00ff");
  EXPECT_EQ(r->offset(), 0u);
}

TEST(ParseBufferRef, NodeAndOffsetWithSuffix) {
  auto r = ParseBufferRef("node-a/b-1@64MiB");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->node(), "node-a");
  EXPECT_EQ(r->buffer_id(), "b-1");
  EXPECT_EQ(r->offset(), 64u << 20);
  EXPECT_EQ(ParseBufferRef("b-1@4096")->offset(), 4096u);
}

TEST(ParseBufferRef, RejectsMalformed) {
  for (const char* bad : {"", "/b-1", "node/", "b-1@", "b-1@x", "a/b/c", "b-1@-4", "b 1",
                          "n/b@1@2", "b-1@99999999999999999999"}) {
    EXPECT_EQ(ParseBufferRef(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(FormatBufferRef, RoundTrips) {
  v1::BufferRef r = *ParseBufferRef("n1/b-9@100");
  EXPECT_EQ(FormatBufferRef(r), "n1/b-9@100");
  r.set_length(5);
  EXPECT_EQ(FormatBufferRef(r), "n1/b-9@100+5");
}

}  // namespace
}  // namespace gpumove
