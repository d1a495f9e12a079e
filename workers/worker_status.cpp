#include "workers/worker_status.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <system_error>

namespace ferry::workers {

namespace {
constexpr std::size_t kPageBytes = 4096;
}  // namespace

StatusPage make_status_page() {
  StatusPage out;
  // Sealed to its size (a memfd): a worker cannot shrink it under this process's mapping.
  ipc::SharedMemory memory = ipc::SharedMemory::create_page(kPageBytes, "ferry-worker-status");
  // Not MADV_DONTFORK: a fork worker uses this very mapping.
  out.region = ipc::MappedRegion::map_shared(memory.fd(), kPageBytes, false);
  out.fd = memory.release_fd();
  new (out.region.data()) WorkerStatusPage();
  return out;
}

WorkerStatusPage* map_status_page(ipc::UniqueFd fd) noexcept {
  if (!fd) return nullptr;
  void* data = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  // Kept for the worker's life; the main process made the page and sealed its size.
  return data == MAP_FAILED ? nullptr : static_cast<WorkerStatusPage*>(data);
}

LoadingMark::LoadingMark(WorkerStatusPage* page, std::size_t slot, std::int64_t index) noexcept {
  if (page == nullptr || slot >= WorkerStatusPage::kSlots) return;
  slot_ = &page->slots[slot];
  // A thread that loads a sample inside another's (a dataset using TBB itself lets it steal
  // work) marks the inner one, then the outer one again.
  previous_ = slot_->index.load(std::memory_order_relaxed);
  slot_->tid.store(static_cast<pid_t>(::syscall(SYS_gettid)), std::memory_order_relaxed);
  slot_->index.store(index, std::memory_order_relaxed);
}

LoadingMark::~LoadingMark() {
  if (slot_ != nullptr) slot_->index.store(previous_, std::memory_order_relaxed);
}

std::int64_t record_crash(WorkerStatusPage* page, int signal) noexcept {
  if (page == nullptr) return -1;
  const auto tid = static_cast<pid_t>(::syscall(SYS_gettid));
  for (auto& slot : page->slots) {
    if (slot.tid.load(std::memory_order_relaxed) != tid) continue;
    const std::int64_t index = slot.index.load(std::memory_order_relaxed);
    if (index < 0) continue;
    page->crashed_signal.store(signal, std::memory_order_relaxed);
    page->crashed_index.store(index, std::memory_order_release);
    return index;
  }
  return -1;
}

}  // namespace ferry::workers
