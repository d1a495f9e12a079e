#include "loader/trace.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "ferry/error.h"
#include "ferry/version.h"

#include "ipc/files.h"

namespace ferry::detail {

Tracer::Tracer(std::size_t capacity, std::size_t num_workers)
    : capacity_(std::max<std::size_t>(1, capacity)),
      num_workers_(num_workers),
      origin_ns_(now_ns()),
      pid_(static_cast<int>(::getpid())) {
  ring_.reserve(std::min<std::size_t>(capacity_, 4096));
}

std::uint64_t Tracer::now_ns() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(t.tv_nsec);
}

void Tracer::push(Event event) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(event));
    return;
  }
  ring_[next_] = std::move(event);
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

bool Tracer::plausible(std::uint64_t start_ns, std::uint64_t end_ns) const noexcept {
  // A worker's span lies within the trace's life so far, and ends after it starts.
  return start_ns >= origin_ns_ && start_ns <= end_ns && end_ns <= now_ns() + 1'000'000'000u;
}

void Tracer::wait(std::uint64_t start_ns,
                  std::uint64_t end_ns,
                  std::uint64_t epoch,
                  std::int64_t batch) {
  push({.kind = Kind::kWait,
        .track = 0,
        .start_ns = start_ns,
        .end_ns = end_ns,
        .epoch = epoch,
        .batch = batch});
}

void Tracer::worker_sample(std::size_t worker,
                           std::uint64_t start_ns,
                           std::uint64_t end_ns,
                           std::uint64_t epoch,
                           std::uint64_t batch,
                           std::int64_t index) {
  if (!plausible(start_ns, end_ns)) return;
  push({.kind = Kind::kSample,
        .track = static_cast<std::uint32_t>(worker + 1),
        .start_ns = start_ns,
        .end_ns = end_ns,
        .epoch = epoch,
        .batch = static_cast<std::int64_t>(batch),
        .value = index});
}

void Tracer::worker_collate(std::size_t worker,
                            std::uint64_t start_ns,
                            std::uint64_t end_ns,
                            std::uint64_t epoch,
                            std::uint64_t batch,
                            std::size_t samples) {
  if (!plausible(start_ns, end_ns)) return;
  push({.kind = Kind::kCollate,
        .track = static_cast<std::uint32_t>(worker + 1),
        .start_ns = start_ns,
        .end_ns = end_ns,
        .epoch = epoch,
        .batch = static_cast<std::int64_t>(batch),
        .value = static_cast<std::int64_t>(samples)});
}

void Tracer::worker_load(std::size_t worker,
                         std::uint64_t start_ns,
                         std::uint64_t end_ns,
                         std::uint64_t epoch,
                         std::uint64_t batch) {
  if (!plausible(start_ns, end_ns)) return;
  push({.kind = Kind::kLoad,
        .track = static_cast<std::uint32_t>(worker + 1),
        .start_ns = start_ns,
        .end_ns = end_ns,
        .epoch = epoch,
        .batch = static_cast<std::int64_t>(batch)});
}

void Tracer::worker_download(std::size_t worker, std::uint64_t start_ns, std::uint64_t end_ns) {
  if (!plausible(start_ns, end_ns)) return;
  push({.kind = Kind::kDownload,
        .track = static_cast<std::uint32_t>(worker + 1),
        .start_ns = start_ns,
        .end_ns = end_ns});
}

void Tracer::batch_dispatched(std::uint64_t epoch, std::uint64_t batch, std::size_t worker) {
  const std::uint64_t now = now_ns();
  push({.kind = Kind::kBatchBegin,
        .track = 0,
        .start_ns = now,
        .end_ns = now,
        .epoch = epoch,
        .batch = static_cast<std::int64_t>(batch),
        .value = static_cast<std::int64_t>(worker)});
}

void Tracer::batch_delivered(std::uint64_t epoch, std::uint64_t batch) {
  const std::uint64_t now = now_ns();
  push({.kind = Kind::kBatchEnd,
        .track = 0,
        .start_ns = now,
        .end_ns = now,
        .epoch = epoch,
        .batch = static_cast<std::int64_t>(batch)});
}

void Tracer::instant(std::string name, std::string message) {
  const std::uint64_t now = now_ns();
  push({.kind = Kind::kInstant,
        .track = 0,
        .start_ns = now,
        .end_ns = now,
        .name = std::move(name),
        .message = std::move(message)});
}

std::size_t Tracer::recorded() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return ring_.size();
}

std::string Tracer::json() const {
  std::vector<Event> events;
  std::uint64_t dropped = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    events.reserve(ring_.size());
    // Oldest first: from the slot the next event would overwrite.
    for (std::size_t i = 0; i < ring_.size(); ++i)
      events.push_back(ring_[(next_ + i) % ring_.size()]);
    dropped = dropped_;
  }
  // A batch whose dispatch fell out of the ring has no beginning: its end is left out too.
  std::string out;
  out.reserve(events.size() * 150 + 1024);
  char line[512];
  out += "{\"traceEvents\":[\n";
  std::snprintf(line, sizeof line,
                "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
                "\"args\":{\"name\":\"ferry DataLoader\"}},\n"
                "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":0,"
                "\"args\":{\"name\":\"training loop\"}}",
                pid_, pid_);
  out += line;
  for (std::size_t w = 0; w < num_workers_; ++w) {
    std::snprintf(line, sizeof line,
                  ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%zu,"
                  "\"args\":{\"name\":\"worker %zu\"}}",
                  pid_, w + 1, w);
    out += line;
    std::snprintf(line, sizeof line,
                  ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%zu,"
                  "\"args\":{\"sort_index\":%zu}}",
                  pid_, w + 1, w + 1);
    out += line;
  }
  const auto us = [&](std::uint64_t ns) {
    return static_cast<double>(ns - std::min(ns, origin_ns_)) / 1000.0;
  };
  std::vector<std::pair<std::uint64_t, std::int64_t>> begun;  // batches whose dispatch is here
  for (const Event& e : events) {
    if (e.kind == Kind::kBatchBegin) begun.emplace_back(e.epoch, e.batch);
  }
  std::sort(begun.begin(), begun.end());
  for (const Event& e : events) {
    const double ts = us(e.start_ns);
    const double dur = static_cast<double>(e.end_ns - e.start_ns) / 1000.0;
    const unsigned long long epoch = e.epoch;
    const long long batch = e.batch;
    switch (e.kind) {
      case Kind::kWait:
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"X\",\"name\":\"wait\",\"cat\":\"loop\",\"pid\":%d,\"tid\":0,"
                      "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"epoch\":%llu,\"batch\":%lld}}",
                      pid_, ts, dur, epoch, batch);
        break;
      case Kind::kSample:
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"X\",\"name\":\"sample\",\"cat\":\"worker\",\"pid\":%d,"
                      "\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"index\":%lld,"
                      "\"epoch\":%llu,\"batch\":%lld}}",
                      pid_, e.track, ts, dur, static_cast<long long>(e.value), epoch, batch);
        break;
      case Kind::kCollate:
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"X\",\"name\":\"collate\",\"cat\":\"worker\",\"pid\":%d,"
                      "\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"epoch\":%llu,"
                      "\"batch\":%lld,\"samples\":%lld}}",
                      pid_, e.track, ts, dur, epoch, batch, static_cast<long long>(e.value));
        break;
      case Kind::kLoad:
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"X\",\"name\":\"load\",\"cat\":\"worker\",\"pid\":%d,"
                      "\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"epoch\":%llu,"
                      "\"batch\":%lld}}",
                      pid_, e.track, ts, dur, epoch, batch);
        break;
      case Kind::kDownload:
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"X\",\"name\":\"download\",\"cat\":\"worker\",\"pid\":%d,"
                      "\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f}",
                      pid_, e.track, ts, dur);
        break;
      case Kind::kBatchBegin:
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"b\",\"name\":\"batch\",\"cat\":\"batch\",\"id\":\"%llu:%lld\","
                      "\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"args\":{\"epoch\":%llu,\"batch\":%lld,"
                      "\"worker\":%lld}}",
                      epoch, batch, pid_, ts, epoch, batch, static_cast<long long>(e.value));
        break;
      case Kind::kBatchEnd:
        if (!std::binary_search(begun.begin(), begun.end(), std::make_pair(e.epoch, e.batch))) {
          continue;
        }
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"e\",\"name\":\"batch\",\"cat\":\"batch\",\"id\":\"%llu:%lld\","
                      "\"pid\":%d,\"tid\":0,\"ts\":%.3f}",
                      epoch, batch, pid_, ts);
        break;
      case Kind::kInstant:
        out += ",\n{\"ph\":\"i\",\"s\":\"g\",\"name\":";
        append_quoted(out, e.name);
        std::snprintf(line, sizeof line, ",\"cat\":\"loader\",\"pid\":%d,\"tid\":0,\"ts\":%.3f",
                      pid_, ts);
        out += line;
        if (!e.message.empty()) {
          out += ",\"args\":{\"message\":";
          append_quoted(out, e.message);
          out += "}";
        }
        out += "}";
        continue;
    }
    out += line;
  }
  std::snprintf(line, sizeof line,
                "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"ferry %s\","
                "\"capacity\":%zu,\"dropped\":%llu}}\n",
                FERRY_VERSION, capacity_, static_cast<unsigned long long>(dropped));
  out += line;
  return out;
}

void Tracer::write(const std::filesystem::path& path) const {
  ipc::write_file_atomically(path, json(), "the DataLoader trace");
}

}  // namespace ferry::detail
