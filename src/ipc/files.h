#pragma once

// Whole small files: checkpoints and summaries that must never be seen half-written.

#include <filesystem>
#include <string>
#include <string_view>

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

}  // namespace ferry::ipc
