#pragma once

// Whole small files (checkpoints and summaries that must never be seen half-written), and
// folders listed.

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace ferry::ipc {

// Writes `text` to `path` so that a crash at any moment leaves either the old file or the new
// one: a temporary file in the same folder, written and fsync'ed, renamed over `path`, then the
// folder fsync'ed. `what` names the file in errors ("--save-state"). Throws ferry::Error naming
// the path, the step and the system's reason; the temporary file is removed.
void write_file_atomically(const std::filesystem::path& path,
                           std::string_view text,
                           std::string_view what);

// The same with the temporary file's name given: a job that may be killed and run again names
// its temporaries itself, so the next run finds and removes what a killed one left.
void write_file_atomically(const std::filesystem::path& path,
                           std::string_view text,
                           std::string_view what,
                           const std::filesystem::path& temporary);

// The two steps: `text` written to `path` and fsync'ed (removed again on failure); `from`
// renamed to `to` and the folder fsync'ed (`from` removed on failure).
void write_file_durably(const std::filesystem::path& path,
                        std::string_view text,
                        std::string_view what);
void rename_durably(const std::filesystem::path& from,
                    const std::filesystem::path& to,
                    std::string_view what);

// The whole of `path`; ferry::Error naming it and the reason when it cannot be read.
std::string read_file(const std::filesystem::path& path, std::string_view what);

// One entry of a folder: its name, and whether it is a folder (a symbolic link followed).
struct DirectoryEntry {
  std::string name;
  bool is_directory = false;
};

// The entries of `folder` ('.' and '..' left out), in no particular order; on failure, none, with
// `error` set. Through opendir/readdir (one RAII handle), not std::filesystem's directory
// iterators: those keep their state in a struct private to the libstdc++ that made it, and a
// LibTorch that exports a statically linked libstdc++ of its own (PyTorch's since 2.5,
// pytorch#133437) can run half of an iteration in one copy and half in the other.
std::vector<DirectoryEntry> list_directory(const std::filesystem::path& folder,
                                           std::error_code& error);

// Every folder under `folder`, itself included, following symbolic links to folders as
// os.walk(followlinks=True) does (a folder reached by two links is listed twice), but never
// into a folder it is already inside, so a link loop ends; on failure `error` is set and the
// folders found so far returned.
std::vector<std::filesystem::path> folders_under(const std::filesystem::path& folder,
                                                 std::error_code& error);

}  // namespace ferry::ipc
