// Private to the MPI transport: an operation's record, which the calls other threads make
// (mpi_transport.cc) and the MPI thread's loop (mpi_transport_loop.cc) share, and the
// library's error codes as statuses.
#ifndef GPUMOVE_DAEMON_PATH_MPI_TRANSPORT_IMPL_H_
#define GPUMOVE_DAEMON_PATH_MPI_TRANSPORT_IMPL_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/path/mpi/mpi_transport.h"

#ifdef GPUMOVE_HAVE_MPI
#include <mpi.h>
#endif

namespace gpumove {

struct MpiTransport::Op {
  bool send = false;
  bool patient = false;  // A receive posted ahead of its sender (see Irecv).
  bool woken = false;    // Its sender said it started (see Wake); the MPI thread's.
  int32_t payload = 0;   // A wake's tag: a wake sends these four bytes.
  void* data = nullptr;
  uint64_t n = 0;
  Parts parts;  // parts.at nonempty: a derived datatype of these (IsendParts).
  int peer = 0;
  int tag = 0;
  uint64_t generation = 0;
  absl::Time posted;
  absl::Duration timeout;
  // Written under mu_ by the MPI thread.
  bool done = false;               // Waiters may return: status/count are final.
  std::atomic<bool> ready{false};  // done, for a waiter polling without the lock.
  bool finished = false;           // MPI is done with the buffer.
  bool cancel_asked = false;
  absl::Status status;
  uint64_t count = 0;
};

#ifdef GPUMOVE_HAVE_MPI
namespace mpi_internal {

inline std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return absl::StrCat("MPI error ", code);
  return std::string(text, len);
}

inline absl::Status MpiStatus(int code, const char* what) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", MpiError(code)));
}

}  // namespace mpi_internal
#endif  // GPUMOVE_HAVE_MPI

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_MPI_TRANSPORT_IMPL_H_
