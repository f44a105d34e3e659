// The main of a fuzz target built without libFuzzer (gcc, the default build): replays every
// file of the corpus folders given as arguments, and a bounded number of byte-level
// mutations of each (seeded, so a failure repeats; --mutations=N, default 200), through LLVMFuzzerTestOneInput. With
// `--config=fuzz` the targets link libFuzzer instead (tests/fuzz/run.sh).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

// What libFuzzer's simplest mutators do: flip a bit, set a byte, cut, insert, duplicate.
std::string Mutate(std::string s, std::mt19937_64& rng) {
  const int steps = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < steps; ++i) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 5) {
      case 0:
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1u << (rng() % 8)));
        break;
      case 1:
        if (!s.empty()) s[at] = static_cast<char>(rng());
        break;
      case 2:
        s.resize(at);
        break;
      case 3:
        s.insert(at, 1, static_cast<char>(rng()));
        break;
      default:
        if (!s.empty()) s.insert(at, s.substr(at, 1 + rng() % 16));
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  int mutations = 200;  // Of each corpus input; --mutations=N says otherwise.
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--mutations=", 12) == 0) {
      mutations = std::atoi(argv[i] + 12);
      continue;
    }
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[i])) files.push_back(e.path());
    } else {
      files.push_back(argv[i]);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      inputs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no corpus inputs given\n");
    return 1;
  }
  std::mt19937_64 rng(1);
  size_t runs = 0;
  for (const std::string& input : inputs) {
    Run(input);
    ++runs;
    for (int m = 0; m < mutations; ++m, ++runs) Run(Mutate(input, rng));
  }
  std::printf("replayed %zu corpus inputs and %zu mutations of them\n", inputs.size(),
              runs - inputs.size());
  return 0;
}
