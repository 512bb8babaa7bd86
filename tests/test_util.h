// Helpers shared by the multi-process tests: runfile paths and whole-file reads.
#ifndef STAGEHAND_TESTS_TEST_UTIL_H_
#define STAGEHAND_TESTS_TEST_UTIL_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace stagehand::testing {

// A file of this workspace's runfiles, e.g. "launcher/launcher".
inline std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/stagehand/" + path;
}

// The whole file, or "" when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace stagehand::testing

#endif  // STAGEHAND_TESTS_TEST_UTIL_H_
