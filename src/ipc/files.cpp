#include "ipc/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "ferry/error.h"

#include "ipc/unique_fd.h"

namespace ferry::ipc {

namespace {

[[noreturn]] void fail(std::string_view what,
                       const std::filesystem::path& path,
                       const char* step,
                       int error) {
  throw Error(detail::str(what, " ", path.string(), ": ", step, " failed: ", std::strerror(error),
                          "; check that the folder exists, is writable and has room"));
}

}  // namespace

void write_file_durably(const std::filesystem::path& path,
                        std::string_view text,
                        std::string_view what) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) fail(what, path, "creating", errno);
  auto give_up = [&](const char* step) {
    const int error = errno;
    fd.reset();
    ::unlink(path.c_str());
    fail(what, path, step, error);
  };
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) give_up("writing");
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) give_up("flushing to disk");
}

void rename_durably(const std::filesystem::path& from,
                    const std::filesystem::path& to,
                    std::string_view what) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int error = errno;
    ::unlink(from.c_str());
    fail(what, to, "renaming into place", error);
  }
  // The rename itself reaches the disk with the folder.
  std::filesystem::path folder = to.parent_path();
  if (folder.empty()) folder = ".";
  UniqueFd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir) (void)::fsync(dir.get());
}

void write_file_atomically(const std::filesystem::path& path,
                           std::string_view text,
                           std::string_view what,
                           const std::filesystem::path& temporary) {
  write_file_durably(temporary, text, what);
  rename_durably(temporary, path, what);
}

void write_file_atomically(const std::filesystem::path& path,
                           std::string_view text,
                           std::string_view what) {
  // Unique per process and call, so two threads saving the same file never share one.
  static std::atomic<std::uint64_t> calls{0};
  std::filesystem::path temporary = path;
  temporary += detail::str(".tmp.", ::getpid(), ".", calls.fetch_add(1));
  write_file_atomically(path, text, what, temporary);
}

std::string read_file(const std::filesystem::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(
        detail::str(what, " ", path.string(), ": cannot open for reading: ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(detail::str(what, " ", path.string(), ": read failed"));
  return text.str();
}

std::vector<DirectoryEntry> list_directory(const std::filesystem::path& folder,
                                           std::error_code& error) {
  error.clear();
  std::vector<DirectoryEntry> entries;
  const std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(folder.c_str()), &::closedir);
  if (!dir) {
    error.assign(errno, std::generic_category());
    return entries;
  }
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir.get());
    if (entry == nullptr) {
      if (errno != 0) error.assign(errno, std::generic_category());
      return entries;
    }
    const std::string_view name(entry->d_name);
    if (name == "." || name == "..") continue;
    bool is_directory = entry->d_type == DT_DIR;
    if (entry->d_type == DT_LNK || entry->d_type == DT_UNKNOWN) {
      struct stat st {};
      is_directory = ::fstatat(::dirfd(dir.get()), entry->d_name, &st, 0) == 0 &&
                     S_ISDIR(st.st_mode);
    }
    entries.push_back({std::string(name), is_directory});
  }
}

namespace {

// Depth first, as os.walk(followlinks=True) goes, with the folders above `folder` in `above`.
void walk(const std::filesystem::path& folder,
          std::vector<std::pair<dev_t, ino_t>>& above,
          std::vector<std::filesystem::path>& folders,
          std::error_code& error) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    error.assign(errno, std::generic_category());
    return;
  }
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  if (std::find(above.begin(), above.end(), id) != above.end()) return;  // a link back up
  folders.push_back(folder);
  const std::vector<DirectoryEntry> entries = list_directory(folder, error);
  if (error) return;
  above.push_back(id);
  for (const DirectoryEntry& entry : entries) {
    if (entry.is_directory) walk(folder / entry.name, above, folders, error);
    if (error) break;
  }
  above.pop_back();
}

}  // namespace

std::vector<std::filesystem::path> folders_under(const std::filesystem::path& folder,
                                                 std::error_code& error) {
  error.clear();
  std::vector<std::filesystem::path> folders;
  std::vector<std::pair<dev_t, ino_t>> above;
  walk(folder, above, folders, error);
  return folders;
}

}  // namespace ferry::ipc
