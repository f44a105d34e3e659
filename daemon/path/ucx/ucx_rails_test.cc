#include "daemon/path/ucx/ucx_rails.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

namespace fs = std::filesystem;

// A recorded /sys/class/infiniband: each device's ports with their states.
std::string FakeSysfs(const std::vector<std::pair<std::string, std::string>>& ports) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path root = fs::path(tmp != nullptr ? tmp : "/tmp") / "rails_sysfs";
  fs::remove_all(root);
  for (const auto& [port, state] : ports) {
    const size_t colon = port.find(':');
    fs::path dir =
        root / "class" / "infiniband" / port.substr(0, colon) / "ports" / port.substr(colon + 1);
    fs::create_directories(dir);
    std::ofstream(dir / "state") << state << "\n";
  }
  return root.string();
}

TEST(UcxRails, AutoPairsARoCEPortWithItsNetdev) {
  const std::string sys = FakeSysfs({{"rxe0:1", "4: ACTIVE"}, {"rxe1:1", "4: ACTIVE"}});
  std::filesystem::create_directories(sys + "/class/infiniband/rxe1/ports/1/gid_attrs/ndevs");
  std::ofstream(sys + "/class/infiniband/rxe1/ports/1/gid_attrs/ndevs/0") << "eth1\n";
  EXPECT_EQ(*ParseUcxRails("auto", sys), (std::vector<std::string>{"rxe0:1", "rxe1:1+eth1"}));
}

TEST(UcxRails, AutoTakesEveryActivePortWhenThereAreTwoOrMore) {
  const std::string sys = FakeSysfs({{"rxe1:1", "4: ACTIVE"},
                                     {"rxe0:1", "4: ACTIVE"},
                                     {"mlx5_2:1", "1: DOWN"}});
  EXPECT_EQ(ActiveRdmaPorts(sys), (std::vector<std::string>{"rxe0:1", "rxe1:1"}));
  EXPECT_EQ(*ParseUcxRails("auto", sys), (std::vector<std::string>{"rxe0:1", "rxe1:1"}));
  // One active port is no rails: the lanes stay as they were.
  const std::string one = FakeSysfs({{"rxe0:1", "4: ACTIVE"}, {"rxe1:1", "1: DOWN"}});
  EXPECT_TRUE(ParseUcxRails("auto", one)->empty());
  EXPECT_TRUE(ParseUcxRails("auto", "/nonexistent")->empty());
  EXPECT_TRUE(ParseUcxRails("", sys)->empty());
}

TEST(UcxRails, NamedRailsAreCheckedAndBadOnesRefusedByPlace) {
  EXPECT_EQ(*ParseUcxRails("mlx5_0:1,mlx5_1:1"),
            (std::vector<std::string>{"mlx5_0:1", "mlx5_1:1"}));
  EXPECT_EQ(*ParseUcxRails("rxe0:1+eth0,rxe1:1+eth1"),
            (std::vector<std::string>{"rxe0:1+eth0", "rxe1:1+eth1"}));
  EXPECT_EQ(RailNetDevices("rxe1:1+eth1"), "rxe1:1,eth1");
  for (const std::string bad : {"rxe0", "rxe0:", ":1", "rxe0:0", "rxe0:1,rxe0:1", "rx e0:1",
                                "rxe0:1,,rxe1:1", "a/b:1", "rxe0:1x", "rxe0:1+", "rxe0:1+a+b+c+d",
                                "rxe0:1+e th0", "eth0+rxe0:1"}) {
    auto rails = ParseUcxRails(bad);
    EXPECT_FALSE(rails.ok()) << bad;
    EXPECT_EQ(rails.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  std::string many;
  for (int i = 0; i <= static_cast<int>(kMaxRails); ++i) many += "d" + std::to_string(i) + ":1,";
  many.pop_back();
  EXPECT_FALSE(ParseUcxRails(many).ok());
}

}  // namespace
}  // namespace gpumove
