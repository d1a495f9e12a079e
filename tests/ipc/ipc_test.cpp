// The OS primitives and the wire protocol, on their own.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"

#include "ipc/cgroup.h"
#include "ipc/channel.h"
#include "ipc/child_process.h"
#include "ipc/output_relay.h"
#include "ipc/protocol.h"
#include "ipc/shared_memory.h"
#include "support/files.h"
#include "support/timing.h"

namespace ferry::ipc {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Protocol, EveryMessageRoundTrips) {
  TaskMessage task{7, 42, {1, -2, 3}, {9, 10}, 12, true, "shard-3:17", {{3, "quarantined", "x"}}};
  const auto t = std::get<TaskMessage>(decode_index(encode(IndexMessage(task))));
  ASSERT_EQ(t.leave_out.size(), 1u);
  EXPECT_EQ(t.leave_out[0].index, 3);
  EXPECT_EQ(t.leave_out[0].type_name, "quarantined");
  EXPECT_EQ(t.leave_out[0].message, "x");
  EXPECT_EQ(t.epoch, 7u);
  EXPECT_EQ(t.sequence, 42u);
  EXPECT_EQ(t.indices, task.indices);
  EXPECT_EQ(t.recycled, task.recycled);
  EXPECT_EQ(t.stream_position, 12u);
  EXPECT_TRUE(t.has_stream_cursor);
  EXPECT_EQ(t.stream_cursor, "shard-3:17");
  EXPECT_EQ(
      std::get<RecycleMessage>(decode_index(encode(IndexMessage(RecycleMessage{{5}})))).segment_ids,
      std::vector<std::uint64_t>{5});
  EXPECT_TRUE(
      std::holds_alternative<StopMessage>(decode_index(encode(IndexMessage(StopMessage{})))));

  BatchReadyMessage ready;
  ready.epoch = 1;
  ready.sequence = 2;
  ready.segment_id = 3;
  ready.segment_size = 4096;
  ready.num_samples = 2;
  ready.fields.push_back(FieldMeta{"image", 0, 6, {2, 3}, 64, 24, {}});
  ready.fields.push_back(FieldMeta{"path", 3, -1, {}, 0, 0, {"a.jpg", "b.jpg"}});
  ready.indices = {10, 11};
  ready.retired_segments = {8};
  ready.has_stream_cursor = true;
  ready.stream_cursor = "offset=4096";
  const auto r = std::get<BatchReadyMessage>(decode_data(encode(DataMessage(ready))));
  EXPECT_TRUE(r.has_stream_cursor);
  EXPECT_EQ(r.stream_cursor, "offset=4096");
  EXPECT_EQ(r.fields.size(), 2u);
  EXPECT_EQ(r.fields[0].sizes, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(r.fields[1].strings, (std::vector<std::string>{"a.jpg", "b.jpg"}));
  EXPECT_EQ(r.indices, ready.indices);
  EXPECT_EQ(r.retired_segments, ready.retired_segments);
  const auto e = std::get<SampleErrorMessage>(
      decode_data(encode(DataMessage(SampleErrorMessage{1, 2, 3, "std::bad_alloc", "boom"}))));
  EXPECT_EQ(e.type_name, "std::bad_alloc");
  EXPECT_EQ(e.message, "boom");
}

TEST(Protocol, EveryTruncationIsAClearErrorNeverAnOverread) {
  BatchReadyMessage ready;
  ready.fields.push_back(FieldMeta{"image", 0, 6, {2, 3}, 64, 24, {}});
  ready.indices = {1, 2};
  const auto bytes = encode(DataMessage(ready));
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THAT([&] { decode_data(std::span<const std::byte>(bytes.data(), cut)); },
                ThrowsMessage<Error>(HasSubstr("cut short")))
        << "cut at " << cut;
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THAT([&] { decode_data(longer); }, ThrowsMessage<Error>(HasSubstr("trailing bytes")));
}

TEST(Protocol, ForeignBytesAndOtherVersionsAreRefused) {
  std::vector<std::byte> junk(16, std::byte{0x41});
  EXPECT_THAT([&] { decode_index(junk); }, ThrowsMessage<Error>(HasSubstr("bad magic")));
  auto bytes = encode(IndexMessage(StopMessage{}));
  bytes[4] = std::byte{99};  // the version field
  EXPECT_THAT([&] { decode_index(bytes); }, ThrowsMessage<Error>(HasSubstr("out of step")));
  // A count that claims more than the message holds.
  auto task = encode(IndexMessage(TaskMessage{0, 0, {1}, {}, 0, false, {}, {}}));
  const std::uint32_t huge = 1u << 27;
  std::memcpy(task.data() + 8 + 16, &huge, 4);
  EXPECT_THAT([&] { decode_index(task); }, ThrowsMessage<Error>(HasSubstr("cut short")));
}

TEST(Channel, CarriesMessagesLargerThanAPacketAndDescriptors) {
  auto [a, b] = Channel::pair();
  std::vector<std::byte> big(300'000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 7);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  std::thread sender([&] {
    EXPECT_EQ(a.send(big, std::span<const int>(pipe_fds, 1)), Channel::SendResult::kSent);
  });
  std::vector<std::byte> got;
  std::vector<UniqueFd> fds;
  ASSERT_TRUE(b.receive(got, fds));
  sender.join();
  EXPECT_EQ(got, big);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_TRUE(::fcntl(fds[0].get(), F_GETFD) & FD_CLOEXEC);
  // The received descriptor is the same pipe.
  ASSERT_EQ(::write(pipe_fds[1], "x", 1), 1);
  char c = 0;
  EXPECT_EQ(::read(fds[0].get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  a.close();
  EXPECT_FALSE(b.receive(got, fds));  // EOF once the peer is gone
}

TEST(Channel, SendToAPeerThatStoppedReadingTimesOutAndToAGoneOneSaysSo) {
  auto [a, b] = Channel::pair();
  std::vector<std::byte> chunk(64 * 1024);
  Channel::SendResult result = Channel::SendResult::kSent;
  for (int i = 0; i < 1000 && result == Channel::SendResult::kSent; ++i) {
    result = a.send(chunk, {}, Clock::now() + std::chrono::milliseconds(50));
  }
  EXPECT_EQ(result, Channel::SendResult::kTimedOut);
  b.close();
  EXPECT_EQ(a.send(chunk, {}, Clock::now() + std::chrono::milliseconds(50)),
            Channel::SendResult::kPeerGone);
}

TEST(Channel, PostNeverBlocksAndFlushDeliversInOrderOnceThePeerReads) {
  // Two peers that each post far more than a socket buffer holds, then read: neither blocks.
  auto [a, b] = Channel::pair();
  std::vector<std::vector<std::byte>> sent;
  for (int i = 0; i < 8; ++i) {
    sent.emplace_back(200'000 + static_cast<std::size_t>(i), static_cast<std::byte>(i));
    ASSERT_TRUE(a.post(sent.back()));
  }
  EXPECT_TRUE(a.has_queued());  // 1.6 MB cannot all be in the socket yet
  std::vector<std::byte> got;
  std::vector<UniqueFd> fds;
  for (std::size_t k = 0; k < sent.size();) {
    ASSERT_TRUE(a.flush());
    switch (b.try_receive(got, fds)) {
      case Channel::Received::kMessage:
        ASSERT_EQ(got, sent[k]) << "message " << k;
        ++k;
        break;
      case Channel::Received::kNotYet:
        break;
      case Channel::Received::kClosed:
        FAIL() << "closed";
    }
  }
  EXPECT_FALSE(a.has_queued());
  EXPECT_EQ(b.try_receive(got, fds), Channel::Received::kNotYet);
}

TEST(Channel, ASenderBlockedOnAFullChannelStopsWhenItsOtherChannelHangsUp) {
  // A worker blocked sending a reply notices its loader closing its index channel.
  auto [data_main, data_worker] = Channel::pair();
  auto [index_main, index_worker] = Channel::pair();
  std::thread closer([&index_main = index_main] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    index_main.close();
  });
  const auto result =
      data_worker.send(std::vector<std::byte>(4'000'000), {}, std::nullopt, index_worker.fd());
  closer.join();
  EXPECT_EQ(result, Channel::SendResult::kPeerGone);
}

TEST(Channel, APeerThatClosesPartWayThroughAMessageIsClosedNotAnError) {
  auto [a, b] = Channel::pair();
  ASSERT_TRUE(a.post(std::vector<std::byte>(2'000'000)));  // only part of it fits
  ASSERT_TRUE(a.has_queued());
  std::vector<std::byte> got;
  std::vector<UniqueFd> fds;
  EXPECT_EQ(b.try_receive(got, fds), Channel::Received::kNotYet);  // the first packets kept
  a.close();
  EXPECT_EQ(b.try_receive(got, fds), Channel::Received::kClosed);
  EXPECT_TRUE(b.closed_mid_message());
}

TEST(Channel, AHeaderClaimingMoreThanTheLimitIsRefusedWithoutAllocatingIt) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
  Channel b{UniqueFd(fds[1])};
  const std::uint32_t header[2] = {0x46525931, 0xFFFFFFF0u};  // magic, ~4 GiB
  ASSERT_EQ(::write(fds[0], header, sizeof header), static_cast<ssize_t>(sizeof header));
  std::vector<std::byte> got;
  std::vector<UniqueFd> received;
  EXPECT_THAT([&] { (void)b.try_receive(got, received); },
              ThrowsMessage<Error>(HasSubstr("more than the limit")));
  ::close(fds[0]);
}

TEST(SharedMemory, IsAnonymousCloseOnExecAndSized) {
  auto memory = SharedMemory::create(1 << 20, "ferry-test");
  EXPECT_TRUE(::fcntl(memory.fd(), F_GETFD) & FD_CLOEXEC);
  struct stat st {};
  ASSERT_EQ(::fstat(memory.fd(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
  EXPECT_GE(st.st_blocks * 512, 1 << 20) << "the pages are reserved up front";
  auto mapping = MappedRegion::map_shared(memory.fd(), memory.size(), true);
  std::memset(mapping.data(), 0xAB, mapping.size());
}

TEST(SharedMemory, IsSealedSoThatAReceiverCanTrustTheSizeItMeasures) {
  auto memory = SharedMemory::create(1 << 20, "ferry-test");
  EXPECT_NE(::ftruncate(memory.fd(), 4096), 0) << "a segment could be cut short under a mapping";
  EXPECT_NE(::ftruncate(memory.fd(), 2 << 20), 0);
  EXPECT_EQ(measure_received_segment(memory.fd()), std::size_t{1} << 20);
  // An unsealed memfd (a sender that could shrink it) is refused; so is something else.
  UniqueFd unsealed(::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(unsealed.valid());
  ASSERT_EQ(::ftruncate(unsealed.get(), 4096), 0);
  EXPECT_THAT([&] { measure_received_segment(unsealed.get()); },
              ThrowsMessage<Error>(HasSubstr("not sealed against shrinking")));
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  EXPECT_THAT([&] { measure_received_segment(pipe_fds[0]); },
              ThrowsMessage<Error>(HasSubstr("not a shared-memory file")));
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

TEST(SharedMemory, TheShmOpenFallbackLeavesNoNameBehind) {
  fault::pretend_memfd_is_missing(true);
  // This process's own names only (/ferry-PID-...): other tests may run beside this one.
  auto count_ferry_names = [] {
    const std::string mine = "ferry-" + std::to_string(::getpid()) + "-";
    int n = 0;
    for (const std::string& name : testing::names_in("/dev/shm")) {
      n += name.find(mine) != std::string::npos;
    }
    return n;
  };
  const int before = count_ferry_names();
  {
    auto memory = SharedMemory::create(4096, "fallback");
    EXPECT_TRUE(::fcntl(memory.fd(), F_GETFD) & FD_CLOEXEC);
    EXPECT_EQ(count_ferry_names(), before) << "the name was not unlinked at once";
    auto mapping = MappedRegion::map_shared(memory.fd(), 4096, false);
    std::memset(mapping.data(), 1, 4096);
  }
  fault::pretend_memfd_is_missing(false);
}

TEST(SharedMemory, NoSpaceIsAClearError) {
  fault::fail_next_allocations(1);
  EXPECT_THAT([] { SharedMemory::create(3 << 20, "full"); },
              ThrowsMessage<SharedMemoryError>(HasSubstr("cannot reserve 3.0 MiB")));
  EXPECT_NO_THROW(SharedMemory::create(3 << 20, "fine"));
  // A memfd's pages count against memory; only the fallback's against /dev/shm.
  fault::fail_next_allocations(1);
  EXPECT_THAT([] { SharedMemory::create(4096, "full"); },
              ThrowsMessage<SharedMemoryError>(HasSubstr("of memory available")));
  fault::pretend_memfd_is_missing(true);
  fault::fail_next_allocations(1);
  EXPECT_THAT([] { SharedMemory::create(4096, "full"); },
              ThrowsMessage<SharedMemoryError>(HasSubstr("free in /dev/shm")));
  fault::pretend_memfd_is_missing(false);
}

TEST(ChildProcess, ReapsAndDescribesHowAChildEnded) {
  const pid_t exits = ::fork();
  if (exits == 0) ::_exit(3);
  ChildProcess a(exits);
  EXPECT_EQ(a.terminate(std::chrono::milliseconds(2000)).describe(), "exited with code 3");
  const pid_t sleeps = ::fork();
  if (sleeps == 0) {
    ::pause();
    ::_exit(0);
  }
  {
    ChildProcess b(sleeps);
    EXPECT_GE(b.pidfd(), 0);
    EXPECT_FALSE(b.try_wait().has_value());
  }  // the destructor kills and reaps
  EXPECT_NE(::kill(sleeps, 0), 0) << "the child survived its owner";
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
}

// Reads everything from `fd` until it has been quiet for 200 ms.
std::string read_quietly(int fd) {
  std::string out;
  char buffer[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) return out;
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) return out;
    out.append(buffer, static_cast<std::size_t>(n));
  }
}

TEST(OutputRelay, ForwardsEverythingAndKeepsTheLastLinesOfEachPipe) {
  int target[2];
  ASSERT_EQ(::pipe2(target, O_CLOEXEC), 0);
  UniqueFd target_read(target[0]), target_write(target[1]);
  int wakes = 0;
  std::mutex mutex;
  std::condition_variable woken;
  OutputRelay relay({.target_fd = target_write.get(),
                     .tail_lines = 3,
                     .line_bytes = 10,
                     .on_wake =
                         [&] {
                           const std::lock_guard<std::mutex> lock(mutex);
                           ++wakes;
                           woken.notify_all();
                         },
                     .close_fd = {}});
  int a[2], b[2];
  ASSERT_EQ(::pipe2(a, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(b, O_CLOEXEC), 0);
  UniqueFd reader_a(a[0]), reader_b(b[0]);
  const auto key_a = relay.add(reader_a);
  const auto key_b = relay.add(reader_b);
  EXPECT_FALSE(reader_a.valid());  // the relay's now
  UniqueFd writer_a(a[1]), writer_b(b[1]);
  const std::string text_a = "one\ntwo\nthree\nfour is a long line\nfive";
  ASSERT_EQ(::write(writer_a.get(), text_a.data(), text_a.size()),
            static_cast<ssize_t>(text_a.size()));
  ASSERT_EQ(::write(writer_b.get(), "bee\n", 4), 4);
  // Everything goes through, in full, as it comes.
  const std::string relayed = read_quietly(target_read.get());
  EXPECT_THAT(relayed, HasSubstr(text_a));
  EXPECT_THAT(relayed, HasSubstr("bee\n"));
  EXPECT_EQ(relayed.size(), text_a.size() + 4);
  // The tail: the last 3 lines (the unfinished one included), each cut at 10 bytes.
  writer_a.reset();  // its process ended
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  EXPECT_EQ(relay.finish(key_a, deadline),
            (std::vector<std::string>{"three", "four is a ", "five"}));
  EXPECT_TRUE(relay.finish(key_a, deadline).empty());  // finished: forgotten
  // A pipe whose writer lives on is given up at the deadline, its lines kept.
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(relay.finish(key_b, started + std::chrono::milliseconds(100)),
            std::vector<std::string>{"bee"});
  EXPECT_LT(std::chrono::steady_clock::now() - started, testing::scaled(2.0));
  // wake() (async-signal-safe) runs on_wake on the relay's thread.
  relay.wake();
  std::unique_lock<std::mutex> lock(mutex);
  EXPECT_TRUE(woken.wait_for(lock, std::chrono::seconds(5), [&] { return wakes == 1; }));
}

// The files of a memory cgroup, v2 and v1, as the kernel writes them.
TEST(MemoryCgroup, ReadsTheOomKillCountAndTheLimitOfV2AndV1) {
  const std::string dir = "/tmp/ferry_cgroup_test_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
  };
  const MemoryCgroup v2(dir, /*v2=*/true);
  write("memory.events", "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n");
  write("memory.max", "268435456\n");
  EXPECT_EQ(v2.events_file(), dir + "/memory.events");
  EXPECT_EQ(v2.oom_kills(), 2u);
  EXPECT_EQ(v2.limit_bytes(), 268435456u);
  write("memory.max", "max\n");
  EXPECT_EQ(v2.limit_bytes(), std::nullopt);
  write("memory.events", "low 0\nhigh 0\nmax 0\noom 0\n");  // a kernel that does not count
  EXPECT_EQ(v2.oom_kills(), std::nullopt);
  const MemoryCgroup v1(dir, /*v2=*/false);
  write("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n");
  write("memory.limit_in_bytes", "9223372036854771712\n");  // v1's "unlimited"
  EXPECT_EQ(v1.events_file(), dir + "/memory.oom_control");
  EXPECT_EQ(v1.oom_kills(), 7u);
  EXPECT_EQ(v1.limit_bytes(), std::nullopt);
  write("memory.limit_in_bytes", "1073741824\n");
  EXPECT_EQ(v1.limit_bytes(), 1073741824u);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(v1.oom_kills(), std::nullopt) << "files gone: nothing to read";
}

}  // namespace
}  // namespace ferry::ipc
