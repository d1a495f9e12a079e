#pragma once

// Folders listed in tests as ferry lists them (ipc/files.h: opendir and readdir, never
// std::filesystem's directory iterators, which a LibTorch exporting its own libstdc++ can break:
// pytorch#133437).

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "ipc/files.h"

namespace ferry::testing {

// Every entry of `dir` that is not a folder, under it at any depth (symbolic links to folders
// followed), as full paths; throws naming the folder if it cannot be listed.
inline std::vector<std::filesystem::path> files_under(const std::filesystem::path& dir) {
  std::error_code error;
  std::vector<std::filesystem::path> files;
  for (const std::filesystem::path& folder : ipc::folders_under(dir, error)) {
    for (const ipc::DirectoryEntry& entry : ipc::list_directory(folder, error)) {
      if (!entry.is_directory) files.push_back(folder / entry.name);
    }
  }
  if (error) throw std::runtime_error("cannot list " + dir.string() + ": " + error.message());
  return files;
}

// The names in `dir` itself (folders too); throws naming the folder if it cannot be listed.
inline std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::error_code error;
  std::vector<std::string> names;
  for (const ipc::DirectoryEntry& entry : ipc::list_directory(dir, error)) {
    names.push_back(entry.name);
  }
  if (error) throw std::runtime_error("cannot list " + dir.string() + ": " + error.message());
  return names;
}

}  // namespace ferry::testing
