// The vectored benchmarks' block lists: `count` blocks of `block` bytes, shuffled on each
// side (the same seed gives the same lists in every benchmark and rank).
#ifndef GPUMOVE_CLIENT_BENCH_SHUFFLED_BLOCKS_H_
#define GPUMOVE_CLIENT_BENCH_SHUFFLED_BLOCKS_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace gpumove {

struct Shape {
  uint64_t block;
  size_t count;
};

// Shuffled source and destination block indices.
inline void Shuffle(size_t n, uint64_t seed, std::vector<uint64_t>* s, std::vector<uint64_t>* d) {
  std::mt19937_64 rng(seed);
  s->resize(n);
  d->resize(n);
  std::iota(s->begin(), s->end(), 0);
  std::iota(d->begin(), d->end(), 0);
  std::shuffle(s->begin(), s->end(), rng);
  std::shuffle(d->begin(), d->end(), rng);
}

}  // namespace gpumove

#endif  // GPUMOVE_CLIENT_BENCH_SHUFFLED_BLOCKS_H_
