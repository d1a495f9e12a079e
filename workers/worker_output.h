#pragma once

// What the main process does with its workers' output and reports: every worker's stderr is a
// pipe that one thread of this process relays to this process's stderr as it comes, keeping
// each worker's last lines for the error that reports its death; and SIGUSR1 makes every
// worker print where it is (its batch, the samples in hand, a stack trace) without stopping.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ipc/unique_fd.h"

namespace ferry::workers {

// Relays a worker's stderr pipe (its read end, registered parent-only) from now on; returns its
// key. Starts the relay thread, and takes SIGUSR1 if it is at its default, on first use.
// Throws std::system_error if the thread cannot be started; `read_end` is taken only on success
// (the caller closes it otherwise, unregistering it).
std::uint64_t relay_worker_stderr(ipc::UniqueFd& read_end);

// Waits until the worker's pipe has no writer left (its process ended), relaying the rest, or
// until `deadline`; closes it and returns its last lines, oldest first.
std::vector<std::string> finish_worker_stderr(std::uint64_t key,
                                              std::chrono::steady_clock::time_point deadline);

// Async-signal-safe: every worker of this process prints where it is. What SIGUSR1 does.
void request_worker_reports() noexcept;

// In a worker, first thing (prepare_worker_process): SIGUSR1 prints this worker's state from
// `page` (may be null) and a stack trace on stderr; `prefix` names the worker.
struct WorkerStatusPage;
void install_worker_report_handler(const char* prefix, WorkerStatusPage* page) noexcept;

}  // namespace ferry::workers
