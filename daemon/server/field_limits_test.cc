#include "daemon/server/field_limits.h"

#include <string>

#include "gtest/gtest.h"
#include "proto/gpumove/v1/gpumove.pb.h"

namespace gpumove {
namespace {

TEST(FieldLimits, LongStringsAnywhereAreInvalidArgumentsNamingTheField) {
  v1::AllocateRequest allocate;
  allocate.set_label(std::string(kMaxLabelBytes, 'x'));
  EXPECT_TRUE(CheckStringFields(allocate).ok());
  allocate.set_label(std::string(kMaxLabelBytes + 1, 'x'));
  absl::Status st = CheckStringFields(allocate);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "label has 257 bytes; at most 256");

  v1::SubmitRequest submit;
  submit.set_idempotency_key(std::string(kMaxIdempotencyKeyBytes + 1, 'k'));
  EXPECT_EQ(CheckStringFields(submit).code(), absl::StatusCode::kInvalidArgument);
  submit.clear_idempotency_key();
  submit.add_transfers()->mutable_source()->set_buffer_id("b-1");
  submit.add_transfers()->mutable_destination()->set_node(std::string(5000, 'n'));
  st = CheckStringFields(submit);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "transfers[1].destination.node has 5000 bytes; at most 1024");

  // Bytes fields are bounded where they are read, not here.
  submit.mutable_transfers(1)->mutable_destination()->clear_node();
  submit.mutable_transfers(0)->set_notify(std::string(5000, 'b'));
  EXPECT_TRUE(CheckStringFields(submit).ok());
}

}  // namespace
}  // namespace gpumove
