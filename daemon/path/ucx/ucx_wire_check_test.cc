#include "daemon/path/ucx/ucx_wire_check.h"

#include <ucp/api/ucp.h>

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

// A real UCX context and worker, as a daemon has: their packed address and the packed
// key of a registered buffer are what peers send each other.
class UcxWireCheckTest : public ::testing::Test {
 protected:
  // `transports`: UCX_TLS for the context (empty: UCX's default).
  void Start(const char* transports) {
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
    ucp_config_t* config = nullptr;
    ASSERT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
    if (*transports != '\0') ASSERT_EQ(ucp_config_modify(config, "TLS", transports), UCS_OK);
    const ucs_status_t init = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    ASSERT_EQ(init, UCS_OK);
    ucp_worker_params_t wp = {};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ASSERT_EQ(ucp_worker_create(context_, &wp, &worker_), UCS_OK);
    ucp_address_t* address = nullptr;
    size_t length = 0;
    ASSERT_EQ(ucp_worker_get_address(worker_, &address, &length), UCS_OK);
    address_.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
    ucp_mem_map_params_t mp = {};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = memory_.data();
    mp.length = memory_.size();
    ASSERT_EQ(ucp_mem_map(context_, &mp, &memh_), UCS_OK);
    void* packed = nullptr;
    size_t packed_size = 0;
    ASSERT_EQ(ucp_rkey_pack(context_, memh_, &packed, &packed_size), UCS_OK);
    rkey_.assign(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
    ASSERT_TRUE(shape_.Learn(address_).ok());
  }
  void SetUp() override { Start(""); }
  void TearDown() override {
    if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }
  // ucp_ep_create on `address`, then the endpoint closed: what a daemon does with a
  // peer's address. Returns UCX's status (a crash here is what the check prevents).
  ucs_status_t Connect(const std::string& address) {
    ucp_ep_params_t ep = {};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h h = nullptr;
    const ucs_status_t st = ucp_ep_create(worker_, &ep, &h);
    if (st == UCS_OK) {
      ucp_request_param_t close = {};
      close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      close.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* req = ucp_ep_close_nbx(h, &close);
      for (int i = 0;
           i < 100000 && UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS;
           ++i) {
        ucp_worker_progress(worker_);
      }
      if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    }
    return st;
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_mem_h memh_ = nullptr;
  std::vector<char> memory_ = std::vector<char>(1 << 20);
  std::string address_, rkey_;
  UcxAddressShape shape_;
};

TEST_F(UcxWireCheckTest, ARealWorkerAddressAndRemoteKeyPass) {
  EXPECT_TRUE(CheckUcxWorkerAddress(address_).ok()) << CheckUcxWorkerAddress(address_);
  EXPECT_TRUE(CheckUcxWorkerAddress(address_, &shape_).ok());
  EXPECT_FALSE(ParseUcxWorkerAddress(address_)->empty());
  EXPECT_TRUE(CheckUcxRkey(rkey_).ok()) << CheckUcxRkey(rkey_);
  EXPECT_EQ(Connect(address_), UCS_OK);
}

TEST_F(UcxWireCheckTest, EveryTruncationOrExtensionOfTheAddressIsRefused) {
  for (size_t n = 0; n < address_.size(); ++n) {
    EXPECT_EQ(CheckUcxWorkerAddress(address_.substr(0, n)).code(),
              absl::StatusCode::kInvalidArgument)
        << n << " of " << address_.size();
  }
  EXPECT_FALSE(CheckUcxWorkerAddress(address_ + '\0').ok());
  EXPECT_FALSE(CheckUcxWorkerAddress(std::string(kMaxUcxWorkerAddress + 1, '\1')).ok());
}

TEST_F(UcxWireCheckTest, UnknownAddressVersionsAreRefused) {
  // UCX itself aborts on these (ucs_assertv_always in ucp_address_unpack_header).
  for (int version = 2; version < 16; ++version) {
    std::string bad = address_;
    bad[0] = static_cast<char>((bad[0] & 0xf0) | version);
    EXPECT_FALSE(CheckUcxWorkerAddress(bad).ok()) << version;
  }
  EXPECT_FALSE(CheckUcxWorkerAddress("garbage that is no address").ok());
}

TEST_F(UcxWireCheckTest, RandomBytesAreRefused) {
  std::mt19937_64 rng(7);
  int passed = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string bytes(1 + rng() % 512, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    passed += CheckUcxWorkerAddress(bytes).ok();
  }
  EXPECT_EQ(passed, 0);
}

// An entry of a transport this node has, shorter than its own: UCX would read past it (a
// 0-byte device address is dereferenced as a null pointer). Longer ones fit (a peer's
// IPv6 interface where this node has IPv4 ones).
TEST_F(UcxWireCheckTest, EntriesOfKnownTransportsMustBeAtLeastAsLongAsOurs) {
  auto entries = ParseUcxWorkerAddress(address_);
  ASSERT_TRUE(entries.ok());
  for (const UcxAddressEntry& own : *entries) {
    UcxAddressEntry e = own;
    EXPECT_TRUE(shape_.Fits(e));
    ++e.device_length;
    ++e.iface_length;
    EXPECT_TRUE(shape_.Fits(e));
    e = own;
    if (e.device_length > 0) {
      e.device_length = 0;
      bool empty_known = false;  // Another entry of the transport may have none.
      for (const UcxAddressEntry& o : *entries) {
        empty_known |= o.transport == e.transport && o.device_length == 0;
      }
      EXPECT_EQ(shape_.Fits(e), empty_known) << e.transport;
    }
    e = own;
    if (e.iface_length > 0) {
      --e.iface_length;
      bool shorter_known = false;  // Another entry of the transport may be that short.
      for (const UcxAddressEntry& o : *entries) {
        shorter_known |= o.transport == e.transport && o.iface_length <= e.iface_length;
      }
      EXPECT_EQ(shape_.Fits(e), shorter_known) << e.transport;
    }
    EXPECT_TRUE(shape_.Knows(e.transport));
  }
  UcxAddressEntry unknown;
  unknown.transport = 0xabcd;
  EXPECT_FALSE(shape_.Knows(unknown.transport) && shape_.Fits(unknown));
}

// Addresses with bytes changed that the check still lets through must not crash UCX (it
// may refuse them). The context has no network transport, so that a changed IP address
// is dialed nowhere: test traffic stays on this machine.
TEST_F(UcxWireCheckTest, MutatedAddressesThatPassDoNotCrashUcx) {
  TearDown();
  context_ = nullptr;
  worker_ = nullptr;
  memh_ = nullptr;
  shape_ = UcxAddressShape();
  Start("self,sysv,posix,cma");
  std::mt19937_64 rng(11);
  int passed = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bad = address_;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] ^= static_cast<char>(1u << (rng() % 8));
    if (!CheckUcxWorkerAddress(bad, &shape_).ok()) {
      ++refused;
      continue;
    }
    ++passed;
    Connect(bad);  // Any status; no crash.
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(passed, 0);
}

TEST_F(UcxWireCheckTest, MalformedRemoteKeysAreRefused) {
  for (size_t n = 0; n < 9; ++n) EXPECT_FALSE(CheckUcxRkey(rkey_.substr(0, n)).ok()) << n;
  std::string no_md(rkey_);
  std::memset(no_md.data(), 0, 8);
  EXPECT_FALSE(CheckUcxRkey(no_md).ok());
  std::string bad_type(rkey_);
  bad_type[8] = static_cast<char>(200);
  EXPECT_FALSE(CheckUcxRkey(bad_type).ok());
  std::string many_mds(rkey_);
  std::memset(many_mds.data(), 0xff, 8);  // 64 domains' keys announced, a few present.
  EXPECT_FALSE(CheckUcxRkey(many_mds).ok());
  EXPECT_FALSE(CheckUcxRkey(std::string(kMaxUcxRkey + 1, '\1')).ok());
}

}  // namespace
}  // namespace gpumove
