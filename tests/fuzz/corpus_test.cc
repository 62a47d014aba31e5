// Replays the fuzz seed corpus (tests/fuzz/corpus/TARGET/*) through every fuzz target in the ordinary build:
// inputs that once crashed a parser live there, so the fix stays. Under the sanitizer build (KVROUTE_SANITIZE)
// a memory error in any of them fails this test too.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <gtest/gtest.h>

#include "tests/fuzz/targets.h"
#include "tests/support/harness.h"

namespace kvroute::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<std::uint8_t> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class CorpusReplay : public ::testing::TestWithParam<std::string_view> {};

TEST_P(CorpusReplay, EverySeedRunsCleanly) {
  const FuzzTarget* target = find_fuzz_target(event_fuzz_targets(), GetParam());
  if (target == nullptr) target = find_fuzz_target(router_fuzz_targets(), GetParam());
  ASSERT_NE(target, nullptr);
  const fs::path dir = fs::path(test::source_dir()) / "tests/fuzz/corpus" / std::string(GetParam());
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  std::size_t seeds = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    SCOPED_TRACE(entry.path().filename().string());
    const auto bytes = read_all(entry.path());
    target->run(bytes.data(), bytes.size());
    ++seeds;
  }
  EXPECT_GE(seeds, 3u) << "a target keeps a few seeds";
  target->run(nullptr, 0);  // the empty input
}

INSTANTIATE_TEST_SUITE_P(Targets, CorpusReplay,
                         ::testing::Values("request", "usage", "vllm_events", "native_events", "metrics", "config",
                                           "hygiene"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvroute::fuzz
