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

inline const std::filesystem::path& token_reference_dir() {
  static const std::filesystem::path dir = FERRY_TOKEN_REF_DIR;
  return dir;
}

// manifest.json: what the script wrote, with the values NumPy and the Python construction of
// Megatron-LM's indices gave.
inline const nlohmann::json& token_manifest() {
  static const nlohmann::json m = [] {
    std::ifstream in(token_reference_dir() / "manifest.json");
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
