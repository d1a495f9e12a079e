#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ipc/unique_fd.h"

namespace ferry::ipc {

using Clock = std::chrono::steady_clock;

/// One end of a Unix SOCK_SEQPACKET socket pair carrying whole messages of any length, with
/// descriptors passed alongside (SCM_RIGHTS). A message longer than one packet is split and
/// reassembled; with one writer per direction, packets of two messages never interleave.
/// Both ends are close-on-exec, and received descriptors too.
class Channel {
 public:
  Channel() = default;
  explicit Channel(UniqueFd fd) : fd_(std::move(fd)) {}
  /// A connected pair. Throws std::system_error.
  static std::pair<Channel, Channel> pair();

  int fd() const noexcept { return fd_.get(); }
  bool valid() const noexcept { return fd_.valid(); }
  void close() noexcept { fd_.reset(); }
  UniqueFd release() noexcept { return std::move(fd_); }

  enum class SendResult { kSent, kPeerGone, kTimedOut };
  /// Sends one message with `fds` attached. Never blocks past `deadline` (nullopt: no limit):
  /// a peer that stops reading cannot hang the sender. Never raises SIGPIPE.
  SendResult send(std::span<const std::byte> message,
                  std::span<const int> fds = {},
                  std::optional<Clock::time_point> deadline = std::nullopt);

  /// Receives one whole message into `message`, appending received descriptors to `fds`.
  /// Returns false when the peer has closed its end. Throws ferry::Error on a malformed packet.
  bool receive(std::vector<std::byte>& message, std::vector<UniqueFd>& fds);

  /// True if a whole packet can be read now without blocking (or the peer hung up).
  bool readable_now() const;
  /// True once the peer has closed its end (messages may still be queued to read).
  bool peer_hung_up() const;
  /// Stops both directions without closing: the peer's sends fail from now on.
  void shutdown() noexcept;
  /// Polls without sleeping for up to `spin`; true as soon as the channel is readable. A reader
  /// that spins briefly before blocking usually finds the peer's next message already there,
  /// and skips a sleep and a cross-CPU wake-up, which dominate small-batch latency.
  bool spin_until_readable(std::chrono::microseconds spin) const;

 private:
  UniqueFd fd_;
  std::unique_ptr<std::byte[]> packet_;  // one packet's buffer, allocated once, never zeroed
};

}  // namespace ferry::ipc
