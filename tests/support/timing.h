#pragma once

// Time bounds in tests. A test that checks *when* something happens waits for an event where it
// can (a file written, a line printed, the moment the loop asked for a batch) and measures from
// there; a bound that only guards against a hang is generous and multiplied by time_scale(), so a
// busy machine (CI's neighbours, two CPU burners) makes a test slower, never red.
//
// POSIX and the C++ standard library only, like process_harness.h.

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace ferry::testing {

// How many times slower than an idle machine a CPU-bound step may run now: the runnable tasks
// per core, from the kernel's load average (the last minute) or the tasks running this instant,
// whichever is more, at least 1 and at most 10; times $FERRY_TEST_TIME_SCALE (tests/sanitize.sh
// sets it: a sanitizer slows a spawned worker's start several times over). Read afresh at each
// call, so a bound taken just before the timed step reflects the load of that moment.
inline double time_scale() {
  double factor = 1.0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    double one_minute = 0;
    double five = 0;
    double fifteen = 0;
    int running = 0;
    int total = 0;
    if (std::fscanf(f, "%lf %lf %lf %d/%d", &one_minute, &five, &fifteen, &running, &total) == 5) {
      const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
      // `running` counts this process's own thread: the others compete with it.
      const double contenders = std::max(one_minute, static_cast<double>(running - 1));
      factor = std::clamp(contenders / static_cast<double>(cores), 1.0, 10.0);
    }
    std::fclose(f);
  }
  const char* scale = std::getenv("FERRY_TEST_TIME_SCALE");
  const double configured = scale != nullptr ? std::atof(scale) : 1.0;
  return factor * std::max(configured, 1.0);
}

// A hang guard of `seconds` on an idle machine, scaled to the load of this moment.
inline std::chrono::duration<double> scaled(double seconds) {
  return std::chrono::duration<double>(seconds * time_scale());
}

// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine.
inline std::int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// Intervals that any process appends to one file ("start end\n" in monotonic_ns, one write()
// with O_APPEND, so lines never mix), for a test to check afterwards that work in several
// workers ran at the same time: an event the processes record, not a duration the test guesses.
inline void append_interval(const std::string& path, std::int64_t start, std::int64_t end) {
  const std::string line = std::to_string(start) + " " + std::to_string(end) + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}
inline std::vector<std::pair<std::int64_t, std::int64_t>> read_intervals(const std::string& path) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::ifstream in(path);
  std::int64_t start = 0;
  std::int64_t end = 0;
  while (in >> start >> end) out.emplace_back(start, end);
  return out;
}
// Whether some instant lies inside every interval: they all ran at once.
inline bool all_overlap(const std::vector<std::pair<std::int64_t, std::int64_t>>& intervals) {
  std::int64_t latest_start = INT64_MIN;
  std::int64_t earliest_end = INT64_MAX;
  for (const auto& [start, end] : intervals) {
    latest_start = std::max(latest_start, start);
    earliest_end = std::min(earliest_end, end);
  }
  return latest_start < earliest_end;
}

}  // namespace ferry::testing
