#include "client/bench/stream.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/common/bytes.h"

namespace gpumove {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double EngineSeconds(const v1::Transfer& t) {
  return (t.end_time().seconds() - t.start_time().seconds()) +
         (t.end_time().nanos() - t.start_time().nanos()) * 1e-9;
}

namespace {

// At least one move per Submit and one Submit in flight, whatever the flags said.
StreamOptions AtLeastOne(StreamOptions o) {
  o.per_submit = std::max(1, o.per_submit);
  o.in_flight = std::max(1, o.in_flight);
  return o;
}

int StreamParts(uint64_t size, uint64_t capacity, const StreamOptions& options) {
  return static_cast<int>(std::clamp<uint64_t>(capacity / size, 1, options.per_submit));
}

bool StreamApart(uint64_t size, uint64_t capacity, const StreamOptions& options) {
  return static_cast<uint64_t>(options.in_flight) * StreamParts(size, capacity, options) *
             size <= capacity;
}

}  // namespace

uint64_t StreamFootprint(uint64_t size, uint64_t capacity, const StreamOptions& flags) {
  const StreamOptions options = AtLeastOne(flags);
  return (StreamApart(size, capacity, options) ? options.in_flight : 1) *
         static_cast<uint64_t>(StreamParts(size, capacity, options)) * size;
}

MemcpyFigures MeasureMemcpy(uint64_t size, uint64_t footprint, absl::Duration budget) {
  footprint = std::max(footprint, size);
  std::vector<char> from(footprint, 1), to(footprint, 2);  // Touched: no page faults timed.
  auto rate = [&](bool hot) {
    uint64_t bytes = 0, offset = 0;
    const absl::Time start = absl::Now();
    absl::Duration spent;
    while ((spent = absl::Now() - start) < budget || bytes == 0) {
      std::memcpy(to.data() + offset, from.data() + offset, size);
      bytes += size;
      if (!hot && (offset += size) + size > footprint) offset = 0;
    }
    return bytes / absl::ToDoubleSeconds(spent) / 1e9;
  };
  MemcpyFigures f;
  f.hot = rate(true);
  f.cold = rate(false);
  return f;
}

absl::StatusOr<double> StreamThroughput(Client& client, const v1::BufferRef& src,
                                        const v1::BufferRef& dst, uint64_t size,
                                        uint64_t capacity, const StreamOptions& flags) {
  const StreamOptions options = AtLeastOne(flags);
  const int parts = StreamParts(size, capacity, options);
  const bool apart = StreamApart(size, capacity, options);
  std::vector<v1::SubmitRequest> batches(options.in_flight);
  for (int k = 0; k < options.in_flight; ++k) {
    batches[k].set_wait(true);
    for (int i = 0; i < parts; ++i) {
      const uint64_t offset = ((apart ? k * parts : 0) + i) * size;
      auto* s = batches[k].add_transfers();
      s->set_path(options.path);
      *s->mutable_source() = src;
      s->mutable_source()->set_offset(src.offset() + offset);
      s->mutable_source()->set_length(size);
      *s->mutable_destination() = dst;
      s->mutable_destination()->set_offset(dst.offset() + offset);
      s->mutable_destination()->set_length(size);
    }
  }
  std::atomic<uint64_t> bytes{0};
  absl::Mutex mu;
  absl::Status error;
  const absl::Time start = absl::Now();
  const absl::Time end = start + options.duration;
  auto run = [&](const v1::SubmitRequest& batch) {
    while (absl::Now() < end) {
      auto r = client.Submit(batch);
      absl::Status st = r.status();
      if (r.ok()) {
        for (const v1::Transfer& t : r->transfers()) {
          if (t.state() != v1::SUCCEEDED && st.ok()) {
            st = absl::InternalError(absl::StrCat("move ", t.id(), " ended ",
                                                  v1::TransferState_Name(t.state()), ": ",
                                                  t.error_message()));
          }
        }
      }
      if (!st.ok()) {
        absl::MutexLock lock(&mu);
        if (error.ok()) error = st;
        return;
      }
      bytes += size * parts;
    }
  };
  std::vector<std::thread> others;
  for (int k = 1; k < options.in_flight; ++k) others.emplace_back(run, std::cref(batches[k]));
  run(batches[0]);
  for (auto& t : others) t.join();
  if (!error.ok()) return error;
  return static_cast<double>(bytes.load()) / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
}

}  // namespace gpumove
