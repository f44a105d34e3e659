// Reproducible random payloads for tests.
#ifndef GPUMOVE_TESTS_UTIL_RANDOM_BYTES_H_
#define GPUMOVE_TESTS_UTIL_RANDOM_BYTES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace gpumove {

// `n` bytes from a generator seeded with `seed`: the same seed, the same bytes.
inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&out[i], &v, std::min<size_t>(8, n - i));
  }
  return out;
}

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_RANDOM_BYTES_H_
