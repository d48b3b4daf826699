// A main() for the fuzz targets without libFuzzer: replays every file of the corpus directories
// (or files) named on the command line through LLVMFuzzerTestOneInput, plus every prefix of
// each file (truncated inputs). A target that finds a bad input aborts, failing the test; with
// no input at all the driver fails too (a corpus that went missing is not a pass).
//
// Usage: <fuzzer>_corpus_test DIR_OR_FILE...   (Bazel passes tests/fuzz/corpus/<name>)
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// Prefixes of each file replayed: all of a small file, evenly spaced ones of a big file.
constexpr size_t kMaxPrefixes = 512;

std::vector<std::string> ListInputs(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> out;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    for (auto& sub : ListInputs(path + "/" + name)) out.push_back(sub);
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  size_t files = 0, runs = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<std::string> inputs = ListInputs(argv[i]);
    if (inputs.empty()) {
      std::fprintf(stderr, "no corpus files under %s\n", argv[i]);
      return 1;
    }
    for (const std::string& path : inputs) {
      std::string bytes;
      if (!ReadFile(path, &bytes)) {
        std::fprintf(stderr, "cannot read corpus file %s\n", path.c_str());
        return 1;
      }
      std::fprintf(stderr, "%s (%zu bytes)\n", path.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      const size_t step = std::max<size_t>(1, bytes.size() / kMaxPrefixes);
      for (size_t n = 0; n < bytes.size(); n += step, ++runs) {
        std::string prefix = bytes.substr(0, n);  // its own buffer, so overreads are caught
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(prefix.data()), prefix.size());
      }
      ++files;
      ++runs;
    }
  }
  if (files == 0) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 1;
  }
  std::printf("%zu corpus files, %zu inputs: no failure\n", files, runs);
  return 0;
}
