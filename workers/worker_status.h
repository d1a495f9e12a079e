#pragma once

// A page of shared memory per worker process, in which the worker says what it is doing: the
// batch in hand, the sample each of its loading threads is in, and the sample whose loading
// raised a fatal signal. The main process reads it once the worker has died, to tell which
// sample killed it (on_worker_death=respawn quarantines a sample that killed two); the worker
// reads it when asked where it is (SIGUSR1). The main process believes an index from it only if
// the dead worker held that index: nothing that crosses the process boundary is trusted.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>

#include "ipc/shared_memory.h"
#include "ipc/unique_fd.h"

namespace ferry::workers {

struct WorkerStatusPage {
  static constexpr std::size_t kSlots = 128;  // loading threads tracked (worker_threads)
  struct Slot {
    std::atomic<pid_t> tid{0};            // the thread using the slot
    std::atomic<std::int64_t> index{-1};  // the sample it is loading, or -1
  };
  std::atomic<std::uint32_t> busy{0};  // 1 while a task is in hand
  std::atomic<std::uint64_t> epoch{0};
  std::atomic<std::uint64_t> sequence{0};       // the task in hand (its batch's sequence number)
  std::atomic<std::int64_t> crashed_index{-1};  // the sample whose loading raised a fatal signal
  std::atomic<std::int32_t> crashed_signal{0};
  Slot slots[kSlots];
};
static_assert(std::atomic<std::int64_t>::is_always_lock_free &&
                  std::atomic<pid_t>::is_always_lock_free,
              "the status page is written from signal handlers and read by another process");
static_assert(sizeof(WorkerStatusPage) <= 4096, "one page");

// The main process's handle on one worker's page: a memfd, mapped here (and, for fork, in the
// child, which inherits the mapping), its descriptor kept only until a spawned worker has it.
struct StatusPage {
  ipc::UniqueFd fd;
  ipc::MappedRegion region;
  WorkerStatusPage* page() const noexcept {
    return reinterpret_cast<WorkerStatusPage*>(region.data());
  }
};
// A fresh page, every slot idle (a memfd, or the shm fallback's object). Throws std::system_error.
StatusPage make_status_page();
// In a spawned worker: maps the page the main process made (the descriptor is closed). Null if
// it cannot be mapped (the worker then runs without one).
WorkerStatusPage* map_status_page(ipc::UniqueFd fd) noexcept;

// Marks the calling thread as loading `index` in `slot` for its lifetime (none when `page` is
// null or the slot out of range). Cheap: two relaxed stores each way.
class LoadingMark {
 public:
  LoadingMark(WorkerStatusPage* page, std::size_t slot, std::int64_t index) noexcept;
  ~LoadingMark();
  LoadingMark(const LoadingMark&) = delete;
  LoadingMark& operator=(const LoadingMark&) = delete;

 private:
  WorkerStatusPage::Slot* slot_ = nullptr;
  std::int64_t previous_ = -1;
};

// In a fatal-signal handler: the index the calling thread was loading, recorded as the crash's
// (async-signal-safe); -1 if it was loading none.
std::int64_t record_crash(WorkerStatusPage* page, int signal) noexcept;

}  // namespace ferry::workers
