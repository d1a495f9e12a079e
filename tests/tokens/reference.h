#pragma once

// The reference files that tests/tokens/make_token_reference.py writes before the token tests
// run (ctest fixture token_ref), and what the tests read them back with.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include <torch/types.h>

namespace ferry::test {

// Where the script wrote them (FERRY_TOKEN_REF_DIR, set by tests/CMakeLists.txt).
inline const std::filesystem::path kRef = FERRY_TOKEN_REF_DIR;

// manifest.json: what the script wrote, with the values NumPy and the Python construction of
// Megatron-LM's indices gave.
inline const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    std::ifstream in(kRef / "manifest.json");
    return nlohmann::json::parse(in);
  }();
  return m;
}

inline std::vector<std::int64_t> ints_of(const torch::Tensor& t) {
  const torch::Tensor flat = t.reshape({-1}).to(torch::kInt64).contiguous();
  return std::vector<std::int64_t>(flat.data_ptr<std::int64_t>(),
                                   flat.data_ptr<std::int64_t>() + flat.numel());
}

}  // namespace ferry::test
