#include "ipc/channel.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <system_error>

#include "ferry/error.h"

namespace ferry::ipc {

namespace {

constexpr std::uint32_t kPacketMagic = 0x46525931;  // "FRY1"
constexpr std::size_t kPacketBytes = 32 * 1024;     // well below the socket's send buffer
constexpr std::size_t kHeaderBytes = 8;             // magic, total length
constexpr int kMaxFds = 8;

int poll_one(int fd, short events, std::optional<Clock::time_point> deadline) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
      timeout_ms = static_cast<int>(std::max<long long>(0, left.count()));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::system_error(errno, std::generic_category(), "poll on a channel");
    return n == 0 ? 0 : p.revents;
  }
}

}  // namespace

std::pair<Channel, Channel> Channel::pair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "socketpair(AF_UNIX, SOCK_SEQPACKET)");
  }
  return {Channel(UniqueFd(fds[0])), Channel(UniqueFd(fds[1]))};
}

Channel::Write Channel::write_packets(Outgoing& out, std::span<const int> fds) {
  FERRY_ASSERT(fds.size() <= static_cast<std::size_t>(kMaxFds));
  FERRY_ASSERT(out.bytes.size() <= kMaxMessageBytes);
  std::byte header[kHeaderBytes];
  const auto total = static_cast<std::uint32_t>(out.bytes.size());
  std::memcpy(header, &kPacketMagic, 4);
  std::memcpy(header + 4, &total, 4);
  while (!out.started || out.sent < out.bytes.size()) {
    const bool first = !out.started;
    const std::size_t room = kPacketBytes - (first ? kHeaderBytes : 0);
    const std::size_t chunk = std::min(room, out.bytes.size() - out.sent);
    iovec iov[2];
    int niov = 0;
    if (first) iov[niov++] = {header, kHeaderBytes};
    if (chunk > 0) iov[niov++] = {out.bytes.data() + out.sent, chunk};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(niov);
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    if (first && !fds.empty()) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) return Write::kPeerGone;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) return Write::kWouldBlock;
      throw std::system_error(errno, std::generic_category(), "sendmsg on a channel");
    }
    out.sent += chunk;
    out.started = true;
  }
  return Write::kDone;
}

Channel::SendResult Channel::send(std::span<const std::byte> message,
                                  std::span<const int> fds,
                                  std::optional<Clock::time_point> deadline,
                                  int hangup_fd) {
  FERRY_ASSERT(outbox_.empty(), "send() on a channel with posted messages queued");
  Outgoing out;
  out.bytes.assign(message.begin(), message.end());
  for (;;) {
    switch (write_packets(out, out.started ? std::span<const int>() : fds)) {
      case Write::kDone:
        return SendResult::kSent;
      case Write::kPeerGone:
        return SendResult::kPeerGone;
      case Write::kWouldBlock:
        break;
    }
    if (hangup_fd >= 0) {
      // POLLHUP is reported without being asked for: the other channel's peer closed it.
      pollfd p[2] = {{fd_.get(), POLLOUT, 0}, {hangup_fd, 0, 0}};
      int timeout_ms = -1;
      if (deadline) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
        timeout_ms = static_cast<int>(std::max<long long>(0, left.count()));
      }
      const int n = ::poll(p, 2, timeout_ms);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::system_error(errno, std::generic_category(), "poll on a channel");
      if (n == 0) return SendResult::kTimedOut;
      if ((p[0].revents & (POLLHUP | POLLERR)) || (p[1].revents & (POLLHUP | POLLERR))) {
        return SendResult::kPeerGone;
      }
      continue;
    }
    const int revents = poll_one(fd_.get(), POLLOUT, deadline);
    if (revents == 0) return SendResult::kTimedOut;
    if (revents & (POLLHUP | POLLERR)) return SendResult::kPeerGone;
  }
}

bool Channel::post(std::vector<std::byte> message) {
  outbox_.push_back(Outgoing{std::move(message)});
  return flush();
}

bool Channel::flush() {
  while (!outbox_.empty()) {
    switch (write_packets(outbox_.front(), {})) {
      case Write::kDone:
        outbox_.pop_front();
        break;
      case Write::kWouldBlock:
        return true;
      case Write::kPeerGone:
        outbox_.clear();
        return false;
    }
  }
  return true;
}

Channel::Received Channel::try_receive(std::vector<std::byte>& message,
                                       std::vector<UniqueFd>& fds) {
  if (!packet_) packet_ = std::make_unique_for_overwrite<std::byte[]>(kPacketBytes);
  std::byte* packet = packet_.get();
  for (;;) {
    iovec iov{packet, kPacketBytes};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Received::kNotYet;
      if (errno != ECONNRESET) {
        throw std::system_error(errno, std::generic_category(), "recvmsg on a channel");
      }
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
          int received;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          partial_fds_.emplace_back(received);
        }
      }
    }
    if (n <= 0) {  // the peer closed (between messages, or part-way through one)
      closed_mid_message_ = in_message_;
      in_message_ = false;
      partial_.clear();
      partial_fds_.clear();
      return Received::kClosed;
    }
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
      throw Error("channel: a packet or its descriptors were truncated");
    }
    std::size_t offset = 0;
    if (!in_message_) {
      std::uint32_t magic = 0, total = 0;
      if (static_cast<std::size_t>(n) < kHeaderBytes) throw Error("channel: short packet header");
      std::memcpy(&magic, packet, 4);
      std::memcpy(&total, packet + 4, 4);
      if (magic != kPacketMagic) throw Error("channel: bad packet magic; not a ferry peer?");
      if (total > kMaxMessageBytes) {
        throw Error(detail::str("channel: a message header claims ", total,
                                " bytes, more than the limit of ", kMaxMessageBytes,
                                "; the peer is corrupt or not a ferry peer"));
      }
      expected_ = total;
      partial_.clear();
      // Grown as packets come, not reserved at the size a header claims.
      partial_.reserve(std::min<std::size_t>(expected_, 64 * kPacketBytes));
      offset = kHeaderBytes;
      in_message_ = true;
    }
    if (partial_.size() + (static_cast<std::size_t>(n) - offset) > expected_) {
      throw Error("channel: message longer than its header says");
    }
    partial_.insert(partial_.end(), packet + offset, packet + n);
    if (partial_.size() == expected_) {
      in_message_ = false;
      message.swap(partial_);
      partial_.clear();
      for (auto& fd : partial_fds_) fds.push_back(std::move(fd));
      partial_fds_.clear();
      return Received::kMessage;
    }
  }
}

bool Channel::receive(std::vector<std::byte>& message, std::vector<UniqueFd>& fds) {
  for (;;) {
    switch (try_receive(message, fds)) {
      case Received::kMessage:
        return true;
      case Received::kClosed:
        return false;
      case Received::kNotYet:
        (void)poll_one(fd_.get(), POLLIN, std::nullopt);
        break;
    }
  }
}

bool spin_poll(pollfd* fds, std::size_t count, std::chrono::microseconds spin) {
  const auto until = Clock::now() + spin;
  do {
    if (::poll(fds, count, 0) > 0) return true;
  } while (Clock::now() < until);
  return false;
}

bool Channel::spin_until_readable(std::chrono::microseconds spin) const {
  pollfd p{fd_.get(), POLLIN, 0};
  return spin_poll(&p, 1, spin);
}

bool Channel::peer_hung_up() const {
  pollfd p{fd_.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLHUP);
}

void Channel::shutdown() noexcept {
  if (fd_) (void)::shutdown(fd_.get(), SHUT_RDWR);
}

bool Channel::readable_now() const {
  pollfd p{fd_.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

}  // namespace ferry::ipc
