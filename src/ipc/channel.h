#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ipc/unique_fd.h"

struct pollfd;

namespace ferry::ipc {

using Clock = std::chrono::steady_clock;

/// How long a reader polls without sleeping before it blocks, when it has a core to itself: the
/// peer's next message is usually microseconds away, and a sleep and a cross-CPU wake-up cost
/// more than that, which dominates small-batch latency.
inline constexpr std::chrono::microseconds kSpinBeforeSleep{50};
/// Polls `fds` without sleeping for up to `spin`; true as soon as one has an event.
bool spin_poll(pollfd* fds, std::size_t count, std::chrono::microseconds spin = kSpinBeforeSleep);

/// One end of a Unix SOCK_SEQPACKET socket pair carrying whole messages of any length, with
/// descriptors passed alongside (SCM_RIGHTS). A message longer than one packet is split and
/// reassembled; with one writer per direction, packets of two messages never interleave.
/// A reader never waits on a peer in the middle of a message (try_receive keeps what has come),
/// and a writer that must not block queues its messages (post) and flushes them when the
/// channel is writable.
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
  /// Sends one message with `fds` attached, blocking until it is written or `deadline` passes
  /// (nullopt: no limit). Never raises SIGPIPE. A message cut short by the deadline leaves the
  /// channel unusable (the peer holds part of it): close it after kTimedOut. For a process that
  /// must never block in a send, see post().
  /// While it waits, a hang-up of `hangup_fd` (another channel of the same peer) also ends it
  /// as kPeerGone: a worker blocked sending a reply still notices its loader stopping.
  SendResult send(std::span<const std::byte> message,
                  std::span<const int> fds = {},
                  std::optional<Clock::time_point> deadline = std::nullopt,
                  int hangup_fd = -1);

  /// Queues `message` behind those already queued and writes what the socket takes now,
  /// without blocking; the rest goes out with flush() once the channel is writable (poll for
  /// POLLOUT while has_queued()). False if the peer is gone. Do not mix with send().
  bool post(std::vector<std::byte> message);
  /// Writes queued messages until the socket would block. False if the peer is gone.
  bool flush();
  bool has_queued() const noexcept { return !outbox_.empty(); }

  /// Messages longer than this are refused on receipt (a header claiming more is corrupt).
  static constexpr std::size_t kMaxMessageBytes = std::size_t{1} << 30;

  enum class Received { kMessage, kNotYet, kClosed };
  /// Reads without blocking: kMessage with a whole message in `message` (descriptors appended
  /// to `fds`); kNotYet when the next packet has not arrived (a message's earlier packets are
  /// kept for the next call); kClosed once the peer has closed its end, even in the middle of
  /// a message (closed_mid_message() then says so). Throws ferry::Error on a malformed packet.
  Received try_receive(std::vector<std::byte>& message, std::vector<UniqueFd>& fds);
  /// Waits for one whole message, without a time limit. Returns false when the peer has
  /// closed its end. Throws ferry::Error on a malformed packet.
  bool receive(std::vector<std::byte>& message, std::vector<UniqueFd>& fds);
  /// After kClosed: whether the peer closed part-way through a message.
  bool closed_mid_message() const noexcept { return closed_mid_message_; }

  /// True if a whole packet can be read now without blocking (or the peer hung up).
  bool readable_now() const;
  /// True once the peer has closed its end (messages may still be queued to read).
  bool peer_hung_up() const;
  /// Stops both directions without closing: the peer's sends fail from now on.
  void shutdown() noexcept;
  /// spin_poll() on this channel: true as soon as it is readable (or the peer hung up).
  bool spin_until_readable(std::chrono::microseconds spin = kSpinBeforeSleep) const;

 private:
  struct Outgoing {
    std::vector<std::byte> bytes;
    std::size_t sent = 0;  // payload bytes written
    bool started = false;  // its first packet (with the header) is written
  };
  enum class Write { kDone, kWouldBlock, kPeerGone };
  // Writes `out`'s next packets until it is done or the socket would block.
  Write write_packets(Outgoing& out, std::span<const int> fds);

  UniqueFd fd_;
  std::unique_ptr<std::byte[]> packet_;  // one packet's buffer, allocated once, never zeroed
  std::deque<Outgoing> outbox_;          // post(): messages not yet written, oldest first
  // A message being received: its payload and descriptors so far, and its announced length.
  std::vector<std::byte> partial_;
  std::vector<UniqueFd> partial_fds_;
  std::size_t expected_ = 0;
  bool in_message_ = false;
  bool closed_mid_message_ = false;
};

}  // namespace ferry::ipc
