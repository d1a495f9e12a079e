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
// A peer in the middle of a message writes its next packet at once; one that has not within
// this long is stopped or stuck, and waiting on would hang the reader (and its loader's close).
constexpr std::chrono::milliseconds kContinuationWait{2000};

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

Channel::SendResult Channel::send(std::span<const std::byte> message,
                                  std::span<const int> fds,
                                  std::optional<Clock::time_point> deadline) {
  FERRY_ASSERT(fds.size() <= static_cast<std::size_t>(kMaxFds));
  FERRY_ASSERT(message.size() <= UINT32_MAX);
  std::byte header[kHeaderBytes];
  const auto total = static_cast<std::uint32_t>(message.size());
  std::memcpy(header, &kPacketMagic, 4);
  std::memcpy(header + 4, &total, 4);

  std::size_t sent = 0;  // payload bytes sent so far
  bool first = true;
  while (first || sent < message.size()) {
    const std::size_t room = kPacketBytes - (first ? kHeaderBytes : 0);
    const std::size_t chunk = std::min(room, message.size() - sent);
    iovec iov[2];
    int niov = 0;
    if (first) iov[niov++] = {header, kHeaderBytes};
    if (chunk > 0) iov[niov++] = {const_cast<std::byte*>(message.data() + sent), chunk};
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
      if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) return SendResult::kPeerGone;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
        const int revents = poll_one(fd_.get(), POLLOUT, deadline);
        if (revents == 0) return SendResult::kTimedOut;
        if (revents & (POLLHUP | POLLERR)) return SendResult::kPeerGone;
        continue;
      }
      throw std::system_error(errno, std::generic_category(), "sendmsg on a channel");
    }
    sent += chunk;
    first = false;
  }
  return SendResult::kSent;
}

bool Channel::receive(std::vector<std::byte>& message, std::vector<UniqueFd>& fds) {
  message.clear();
  if (!packet_) packet_ = std::make_unique_for_overwrite<std::byte[]>(kPacketBytes);
  std::byte* packet = packet_.get();
  std::size_t expected = 0;
  bool first = true;
  while (first || message.size() < expected) {
    if (!first && poll_one(fd_.get(), POLLIN, Clock::now() + kContinuationWait) == 0) {
      throw Error("channel: the peer stopped in the middle of a message (nothing for 2 s)");
    }
    iovec iov{packet, kPacketBytes};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return false;
      throw std::system_error(errno, std::generic_category(), "recvmsg on a channel");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
          int received;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          fds.emplace_back(received);
        }
      }
    }
    if (n == 0) {
      if (first) return false;  // the peer closed between messages
      throw Error("channel: the peer closed in the middle of a message");
    }
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
      throw Error("channel: a packet or its descriptors were truncated");
    }
    std::size_t offset = 0;
    if (first) {
      std::uint32_t magic = 0, total = 0;
      if (static_cast<std::size_t>(n) < kHeaderBytes) throw Error("channel: short packet header");
      std::memcpy(&magic, packet, 4);
      std::memcpy(&total, packet + 4, 4);
      if (magic != kPacketMagic) throw Error("channel: bad packet magic; not a ferry peer?");
      expected = total;
      message.reserve(expected);
      offset = kHeaderBytes;
      first = false;
    }
    message.insert(message.end(), packet + offset, packet + n);
    if (message.size() > expected) throw Error("channel: message longer than its header says");
  }
  return true;
}

bool Channel::spin_until_readable(std::chrono::microseconds spin) const {
  const auto until = Clock::now() + spin;
  do {
    if (readable_now()) return true;
  } while (Clock::now() < until);
  return false;
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
