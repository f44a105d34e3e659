// What every benchmark measures the same way: medians, and the throughput of a stream of
// moves (many per Submit, several Submits in flight), which is what a pipeline sees.
#ifndef GPUMOVE_CLIENT_BENCH_STREAM_H_
#define GPUMOVE_CLIENT_BENCH_STREAM_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/gpumove_client.h"

namespace gpumove {

double Median(std::vector<double> v);

// A transfer's own start -> end time in seconds (the daemon's clock).
double EngineSeconds(const v1::Transfer& t);

struct StreamOptions {
  int per_submit = 16;
  int in_flight = 2;
  absl::Duration duration = absl::Seconds(1);
  v1::Path path = v1::PATH_AUTO;
};

// GB/s of wall time for moves of `size` bytes from `src` to `dst` (buffers of at least
// `capacity` bytes; node fields are kept): up to per_submit moves per Submit over disjoint
// ranges, in_flight Submits at once on ranges of their own where the buffers hold them all
// (else on the same ranges, whose moves then wait for each other). An error if a Submit
// fails or a move does not succeed.
absl::StatusOr<double> StreamThroughput(Client& client, const v1::BufferRef& src,
                                        const v1::BufferRef& dst, uint64_t size,
                                        uint64_t capacity, const StreamOptions& options);

// Bytes of each buffer that StreamThroughput's moves of `size` go round.
uint64_t StreamFootprint(uint64_t size, uint64_t capacity, const StreamOptions& options);

// What the memory allows one thread of this process for copies of `size` bytes, GB/s:
// `hot` copies between the same two buffers every time (as ucx_perftest and NetPIPE do:
// cache-resident while they fit), `cold` goes round `footprint` bytes of each (as a
// stream of moves does).
struct MemcpyFigures {
  double hot = 0, cold = 0;
};
MemcpyFigures MeasureMemcpy(uint64_t size, uint64_t footprint, absl::Duration budget);

}  // namespace gpumove

#endif  // GPUMOVE_CLIENT_BENCH_STREAM_H_
