#include "ipc/output_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <future>
#include <system_error>

namespace ferry::ipc {

namespace {

UniqueFd make_eventfd() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd) throw std::system_error(errno, std::generic_category(), "eventfd for the output relay");
  return fd;
}

void drain_eventfd(int fd) {
  std::uint64_t value = 0;
  (void)!::read(fd, &value, sizeof value);
}

void post_eventfd(int fd) noexcept {
  const std::uint64_t one = 1;
  (void)!::write(fd, &one, sizeof one);
}

}  // namespace

OutputRelay::OutputRelay(Options options)
    : options_(std::move(options)), control_(make_eventfd()), signal_(make_eventfd()) {
  // Returns once the thread has made all it allocates: a worker forked right after (the first
  // one is) must not copy an allocator lock that the new thread holds. glibc's malloc is safe
  // across fork, but a sanitizer's allocator is not.
  std::promise<void> started;
  std::future<void> ready = started.get_future();
  thread_ = std::thread([this, &started] { run(started); });
  ready.wait();
}

OutputRelay::~OutputRelay() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  post_eventfd(control_.get());
  if (thread_.joinable()) thread_.join();
  for (auto& [key, source] : sources_) {
    if (!source.ended) close_source(source);
  }
}

std::uint64_t OutputRelay::add(UniqueFd& read_end) {
  const int flags = ::fcntl(read_end.get(), F_GETFL);
  if (flags >= 0) (void)::fcntl(read_end.get(), F_SETFL, flags | O_NONBLOCK);
  std::uint64_t key = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    key = next_key_++;
    Source& source = sources_[key];  // may throw: the descriptor is still the caller's
    source.ring.resize(options_.tail_lines);
    for (auto& line : source.ring) line.reserve(options_.line_bytes);
    source.partial.reserve(options_.line_bytes);
    source.fd = std::move(read_end);
  }
  post_eventfd(control_.get());
  return key;
}

std::vector<std::string> OutputRelay::finish(std::uint64_t key,
                                             std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = sources_.find(key);
  if (it == sources_.end()) return {};
  Source& source = it->second;
  changed_.wait_until(lock, deadline, [&] { return source.ended; });
  if (!source.ended) {
    // A writer is still there (a process the dead one started, say): stop reading it. The
    // thread closes it; it may be busy writing, so wait for that a little only.
    source.dropped = true;
    post_eventfd(control_.get());
    changed_.wait_until(lock, std::chrono::steady_clock::now() + std::chrono::milliseconds(20),
                        [&] { return source.ended; });
  }
  std::vector<std::string> lines = lines_of(source);
  if (source.ended) {
    sources_.erase(it);
  } else {
    source.orphaned = true;  // the thread erases it once it has closed it
  }
  return lines;
}

std::vector<std::string> OutputRelay::tail(std::uint64_t key) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = sources_.find(key);
  return it == sources_.end() ? std::vector<std::string>{} : lines_of(it->second);
}

void OutputRelay::wake() noexcept { post_eventfd(signal_.get()); }

std::vector<std::string> OutputRelay::lines_of(const Source& source) const {
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < source.count; ++i) {
    lines.push_back(source.ring[(source.first + i) % source.ring.size()]);
  }
  if (!source.partial.empty()) lines.push_back(source.partial);
  if (lines.size() > options_.tail_lines) {
    lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(options_.tail_lines));
  }
  return lines;
}

void OutputRelay::close_source(Source& source) {
  if (options_.close_fd) {
    options_.close_fd(std::move(source.fd));
  } else {
    source.fd.reset();
  }
  source.ended = true;
}

void OutputRelay::keep(Source& source, const char* bytes, std::size_t n) {
  // Within the capacities reserved at add(): no allocation here.
  for (std::size_t i = 0; i < n; ++i) {
    if (bytes[i] == '\n') {
      if (source.ring.empty()) {
        source.partial.clear();
        continue;
      }
      std::string& slot = source.ring[(source.first + source.count) % source.ring.size()];
      slot.assign(source.partial);
      if (source.count < source.ring.size()) {
        ++source.count;
      } else {
        source.first = (source.first + 1) % source.ring.size();
      }
      source.partial.clear();
    } else if (bytes[i] != '\r' && source.partial.size() < options_.line_bytes) {
      source.partial.push_back(bytes[i]);
    }
  }
}

void OutputRelay::relay(Source& source, const char* bytes, std::size_t n) {
  (void)source;
  while (n > 0) {
    const ssize_t written = ::write(options_.target_fd, bytes, n);
    if (written > 0) {
      bytes += written;
      n -= static_cast<std::size_t>(written);
      continue;
    }
    if (written < 0 && errno == EINTR) continue;
    if (written < 0 && errno == EAGAIN) {  // a non-blocking stderr that is full: wait for room
      pollfd p{options_.target_fd, POLLOUT, 0};
      (void)::poll(&p, 1, 1000);
      const std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      continue;
    }
    // stderr is closed, or a pipe nobody reads: the bytes are dropped (the tail keeps them).
    // The SIGPIPE that came with EPIPE is pending on this thread, which blocks it: take it.
    sigset_t pipe;
    ::sigemptyset(&pipe);
    ::sigaddset(&pipe, SIGPIPE);
    const timespec zero{0, 0};
    (void)::sigtimedwait(&pipe, nullptr, &zero);
    return;
  }
}

void OutputRelay::run(std::promise<void>& started) {
  // Signals are the application's threads' business; a write to a closed pipe gives EPIPE.
  sigset_t all;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
  std::vector<pollfd> fds;
  std::vector<Source*> polled;
  fds.reserve(256);  // grown only past 254 workers
  polled.reserve(256);
  std::vector<char> buffer(64 * 1024);
  started.set_value();
  for (;;) {
    fds.clear();
    polled.clear();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      bool closed = false;
      for (auto it = sources_.begin(); it != sources_.end();) {
        Source& source = it->second;
        if (source.dropped && !source.ended) {
          close_source(source);
          closed = true;
        }
        if (source.ended && source.orphaned) {
          it = sources_.erase(it);
          continue;
        }
        if (!source.ended) {
          fds.push_back({source.fd.get(), POLLIN, 0});
          polled.push_back(&source);
        }
        ++it;
      }
      if (closed) changed_.notify_all();
    }
    fds.push_back({control_.get(), POLLIN, 0});
    fds.push_back({signal_.get(), POLLIN, 0});
    const int rc = ::poll(fds.data(), fds.size(), -1);
    if (rc < 0) continue;  // EINTR (every signal is blocked here, so hardly)
    const std::size_t n = polled.size();
    if (fds[n].revents != 0) drain_eventfd(control_.get());
    if (fds[n + 1].revents != 0) {
      drain_eventfd(signal_.get());
      if (options_.on_wake) {
        try {
          options_.on_wake();
        } catch (...) {
        }
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      // Sources in `polled` are not ended, so no finish() erases them while this thread
      // reads: only this thread ends a source.
      Source& source = *polled[i];
      const ssize_t got = ::read(fds[i].fd, buffer.data(), buffer.size());
      if (got > 0) {
        relay(source, buffer.data(), static_cast<std::size_t>(got));
        const std::lock_guard<std::mutex> lock(mutex_);
        keep(source, buffer.data(), static_cast<std::size_t>(got));
        continue;
      }
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      const std::lock_guard<std::mutex> lock(mutex_);  // EOF: every writer has closed it
      if (!source.ended) close_source(source);
      changed_.notify_all();
    }
  }
}

}  // namespace ferry::ipc
