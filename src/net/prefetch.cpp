#include "net/prefetch.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

namespace ferry::net {

Prefetcher::Prefetcher(Limits limits) : limits_(limits), owner_(::getpid()) {}

Prefetcher::~Prefetcher() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    cancel_.store(true);
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void Prefetcher::new_round() {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++round_;
}

void Prefetcher::drop_stale(std::uint64_t need) {
  for (auto it = entries_.begin(); it != entries_.end() && bytes_ + need > limits_.max_bytes;) {
    Entry& e = it->second;
    if (!e.warm && e.state == State::kDone && e.round + kStaleRounds <= taken_round_) {
      bytes_ -= e.bytes;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Prefetcher::fetch(std::uint64_t key, std::uint64_t bytes, Fetch job) {
  key &= ~kWarmBit;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (cancel_.load() || entries_.count(key) != 0) return false;
  if (bytes_ + bytes > limits_.max_bytes) drop_stale(bytes);
  if (bytes_ + bytes > limits_.max_bytes) return false;
  Entry& e = entries_[key];
  e.bytes = bytes;
  e.round = round_;
  e.fetch = std::move(job);
  bytes_ += bytes;
  queue_.push_back(key);
  start_thread_if_needed();
  work_.notify_one();
  return true;
}

bool Prefetcher::warm(std::uint64_t key, Warm job) {
  key |= kWarmBit;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (cancel_.load() || entries_.count(key) != 0 || warm_ >= limits_.max_warm) return false;
  Entry& e = entries_[key];
  e.warm = true;
  e.round = round_;
  e.warm_job = std::move(job);
  ++warm_;
  queue_.push_back(key);
  start_thread_if_needed();
  work_.notify_one();
  return true;
}

void Prefetcher::start_thread_if_needed() {
  // Idle threads may not have woken for earlier jobs yet: one more while jobs outnumber them.
  if (queue_.size() <= idle_ || threads_.size() >= limits_.threads) return;
  threads_.emplace_back([this] { run(); });
}

void Prefetcher::execute(Entry& entry, const std::atomic<bool>& cancel) {
  try {
    if (entry.warm) {
      entry.warm_job(cancel);
    } else {
      entry.result = entry.fetch(cancel);
    }
  } catch (...) {
    entry.error = std::current_exception();
  }
}

void Prefetcher::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    work_.wait(lock, [&] { return cancel_.load() || !queue_.empty(); });
    --idle_;
    if (cancel_.load()) return;
    const std::uint64_t key = queue_.front();
    queue_.pop_front();
    Entry& entry = entries_.at(key);  // stable: unordered_map keeps its elements in place
    entry.state = State::kRunning;
    lock.unlock();
    execute(entry, cancel_);
    lock.lock();
    if (entry.warm) {  // nothing to hand over: its work is in the cache
      --warm_;
      entries_.erase(key);
    } else {
      entry.state = State::kDone;
      entry.fetch = nullptr;
    }
    done_.notify_all();
  }
}

std::optional<std::vector<std::uint8_t>> Prefetcher::take(std::uint64_t key) {
  key &= ~kWarmBit;
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  if (it->second.state == State::kQueued) {  // not started: this thread does it now
    for (auto q = queue_.begin(); q != queue_.end(); ++q) {
      if (*q == key) {
        queue_.erase(q);
        break;
      }
    }
    Entry entry = std::move(it->second);
    bytes_ -= entry.bytes;
    taken_round_ = std::max(taken_round_, entry.round);
    entries_.erase(it);
    lock.unlock();
    execute(entry, cancel_);
    if (entry.error) std::rethrow_exception(entry.error);
    return std::move(entry.result);
  }
  // Found again after the wait: another thread taking the same key (a sampler may repeat an
  // index) may have had it first.
  done_.wait(lock, [&] {
    it = entries_.find(key);
    return it == entries_.end() || it->second.state == State::kDone;
  });
  if (it == entries_.end()) return std::nullopt;
  Entry entry = std::move(it->second);
  bytes_ -= entry.bytes;
  taken_round_ = std::max(taken_round_, entry.round);
  entries_.erase(it);
  lock.unlock();
  if (entry.error) std::rethrow_exception(entry.error);
  return std::move(entry.result);
}

std::uint64_t Prefetcher::bytes_in_use() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

std::size_t Prefetcher::jobs_pending() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.state != State::kDone ? 1 : 0;
  return n;
}

PrefetcherSlot::~PrefetcherSlot() {
  Prefetcher* p = prefetcher_.load();
  if (p != nullptr && p->owner() == ::getpid()) delete p;  // else: left as it came (see header)
}

Prefetcher& PrefetcherSlot::get(const Prefetcher::Limits& limits) {
  const pid_t self = ::getpid();
  Prefetcher* p = prefetcher_.load();
  while (p == nullptr || p->owner() != self) {
    auto* fresh = new Prefetcher(limits);
    if (prefetcher_.compare_exchange_strong(p, fresh)) return *fresh;
    delete fresh;  // another thread of this process made one first: `p` is now it
  }
  return *p;
}

Prefetcher* PrefetcherSlot::find() const noexcept {
  Prefetcher* p = prefetcher_.load();
  return p != nullptr && p->owner() == ::getpid() ? p : nullptr;
}

}  // namespace ferry::net
