// The machine-dependent defaults, picked in one place (WithMachineDefaults).
#include "absl/time/time.h"
#include "daemon/server/daemon.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(MachineDefaults, ASmallMachineSparesItsCpus) {
  const DaemonOptions o = WithMachineDefaults(DaemonOptions{}, 2);
  EXPECT_EQ(o.pool_spin, absl::ZeroDuration());
  EXPECT_EQ(o.peer_call_poll, absl::Microseconds(200));  // A fifth of ucx_poll_window.
  EXPECT_EQ(o.peer_call_awake, absl::ZeroDuration());
  EXPECT_EQ(o.direct_copy_threads, 1);
  EXPECT_EQ(o.ucx_lanes, 1);
  EXPECT_EQ(o.mpi_spin, false);
}

TEST(MachineDefaults, ALargeMachinePolls) {
  const DaemonOptions o = WithMachineDefaults(DaemonOptions{}, 16);
  EXPECT_EQ(o.pool_spin, absl::Milliseconds(1));
  EXPECT_EQ(o.peer_call_poll, absl::Milliseconds(1));
  EXPECT_EQ(o.peer_call_awake, absl::Milliseconds(10));
  EXPECT_EQ(o.direct_copy_threads, 4);
  EXPECT_EQ(o.ucx_lanes, 2);
  EXPECT_EQ(o.mpi_spin, true);
  const DaemonOptions big = WithMachineDefaults(DaemonOptions{}, 128);
  EXPECT_EQ(big.direct_copy_threads, 8);
  EXPECT_EQ(big.ucx_lanes, 4);
}

TEST(MachineDefaults, WhatWasSetStays) {
  DaemonOptions set;
  set.pool_spin = absl::ZeroDuration();
  set.peer_call_poll = absl::Microseconds(50);
  set.peer_call_awake = absl::Milliseconds(3);
  set.direct_copy_threads = 3;
  set.ucx_lanes = 1;
  set.mpi_spin = false;
  set.ucx_poll_window = absl::Milliseconds(-5);  // Negative polls nothing.
  const DaemonOptions o = WithMachineDefaults(set, 64);
  EXPECT_EQ(o.pool_spin, absl::ZeroDuration());
  EXPECT_EQ(o.peer_call_poll, absl::Microseconds(50));
  EXPECT_EQ(o.peer_call_awake, absl::Milliseconds(3));
  EXPECT_EQ(o.direct_copy_threads, 3);
  EXPECT_EQ(o.ucx_lanes, 1);
  EXPECT_EQ(o.mpi_spin, false);
  EXPECT_EQ(o.ucx_poll_window, absl::ZeroDuration());
}

}  // namespace
}  // namespace gpumove
