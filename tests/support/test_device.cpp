#include "support/test_device.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/detail/PrivateUse1HooksInterface.h>
#endif

#include "device/accelerator.h"

namespace ferry::testing::test_device {

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
constexpr std::int64_t kPoolStreams = 4;  // ids 1..4; 0 is each device's default stream

// ------------------------------------------------------------------------------------------
// Events and streams.

// One recording of an event: done once its stream has run everything queued before it.
struct Mark {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  void complete() {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      done = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done; });
  }
  bool query() {
    const std::lock_guard<std::mutex> lock(mutex);
    return done;
  }
};
using MarkPtr = std::shared_ptr<Mark>;

// A stream: a queue of work that its own thread runs in order. Streams live as long as the
// process (their threads are detached; nothing here is ever destroyed).
class Stream {
 public:
  Stream() {
    std::thread([this] { run(); }).detach();
  }
  void enqueue(std::function<void()> work) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
      ++pending_;
    }
    cv_.notify_one();
  }
  // A mark that completes when the stream has run what is queued now.
  MarkPtr mark() {
    auto m = std::make_shared<Mark>();
    enqueue([m] { m->complete(); });
    return m;
  }
  void synchronize() { mark()->wait(); }
  bool idle() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return pending_ == 0;
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        work();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "test device: work on a stream failed: %s\n", e.what());
      }
      work = nullptr;  // what it held goes before the stream counts it done
      const std::lock_guard<std::mutex> lock(mutex_);
      --pending_;
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::size_t pending_ = 0;  // queued or running
};

std::mutex g_streams_mutex;
std::map<std::pair<int, std::int64_t>, Stream*>& streams() {
  static auto* all = new std::map<std::pair<int, std::int64_t>, Stream*>();  // never freed
  return *all;
}
std::atomic<std::int64_t> g_next_pool{0};
std::atomic<std::int64_t> g_next_new{kPoolStreams + 1};

Stream& stream_of(int device, std::int64_t id) {
  TORCH_CHECK(device >= 0 && device < kDevices, "test device: no device ", device);
  const std::lock_guard<std::mutex> lock(g_streams_mutex);
  Stream*& s = streams()[{device, id}];
  if (s == nullptr) s = new Stream();  // never freed: its thread runs for the process's life
  return *s;
}
Stream& stream_of(const c10::Stream& s) { return stream_of(s.device_index(), s.id()); }

thread_local int t_device = 0;
thread_local std::array<std::int64_t, kDevices> t_stream{};  // current stream id per device

int device_index_of(c10::optional<c10::Device> device) {
  return device && device->has_index() ? device->index() : t_device;
}
Stream& current_stream(int device) { return stream_of(device, t_stream.at(device)); }

std::atomic<std::int64_t> g_copy_delay_us{0};
std::atomic<std::size_t> g_live_events{0};
std::atomic<std::size_t> g_raced_copies{0};
std::array<std::atomic<std::int64_t>, kDevices> g_memory_used{};

// ------------------------------------------------------------------------------------------
// Host memory page-locked for the device: ranges ferry registered, and the pinned allocator's.

struct PinnedBlock;
struct HostRange {
  std::size_t size = 0;
  PinnedBlock* block = nullptr;  // null: a registered range
};
std::mutex g_ranges_mutex;
std::map<std::uintptr_t, HostRange>& ranges() {
  static auto* all = new std::map<std::uintptr_t, HostRange>();
  return *all;
}
std::size_t g_registered = 0;  // under g_ranges_mutex

// The range holding [p, p + n), if any (under g_ranges_mutex).
const HostRange* find_range(const void* p, std::size_t n, std::uintptr_t* start = nullptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = ranges().upper_bound(address);
  if (it == ranges().begin()) return nullptr;
  --it;
  if (address + n > it->first + it->second.size) return nullptr;
  if (start != nullptr) *start = it->first;
  return &it->second;
}

bool host_pinned(const void* p, std::size_t n) {
  const std::lock_guard<std::mutex> lock(g_ranges_mutex);
  return find_range(p, std::max<std::size_t>(n, 1)) != nullptr;
}

// The pinned allocator's blocks are freed, like CUDA's caching host allocator's, only once the
// copies that read them have run: the streams they were used on must pass a mark first.
struct PinnedBlock {
  void* data = nullptr;
  std::size_t size = 0;
  std::mutex mutex;
  std::set<std::pair<int, std::int64_t>> used_on;
};

void free_pinned(void* context) {
  auto* block = static_cast<PinnedBlock*>(context);
  std::set<std::pair<int, std::int64_t>> used_on;
  {
    const std::lock_guard<std::mutex> lock(block->mutex);
    used_on = block->used_on;
  }
  auto release = [block] {
    {
      const std::lock_guard<std::mutex> lock(g_ranges_mutex);
      ranges().erase(reinterpret_cast<std::uintptr_t>(block->data));
    }
    std::free(block->data);
    delete block;
  };
  if (used_on.empty()) {
    release();
    return;
  }
  std::vector<MarkPtr> marks;
  for (const auto& [d, id] : used_on) marks.push_back(stream_of(d, id).mark());
  std::thread([marks = std::move(marks), release] {
    for (const auto& m : marks) m->wait();
    release();
  }).detach();
}

class PinnedAllocator final : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(std::size_t n) override { return make(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(std::size_t n) const override { return make(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  static c10::DataPtr make(std::size_t n) {
    auto* block = new PinnedBlock();
    block->size = std::max<std::size_t>(n, 1);
    block->data = std::aligned_alloc(64, (block->size + 63) / 64 * 64);
    TORCH_CHECK(block->data != nullptr, "test device: out of pinned memory");
    {
      const std::lock_guard<std::mutex> lock(g_ranges_mutex);
      ranges()[reinterpret_cast<std::uintptr_t>(block->data)] = {block->size, block};
    }
    return {block->data, block, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
};
PinnedAllocator g_pinned_allocator;

// A copy from page-locked host memory was issued on `stream`: the pinned allocator's block (if
// it is one) is not freed before the stream passes this point.
void note_pinned_use(const void* p, std::size_t n, int device, std::int64_t stream) {
  PinnedBlock* block = nullptr;
  {
    const std::lock_guard<std::mutex> lock(g_ranges_mutex);
    if (const HostRange* r = find_range(p, std::max<std::size_t>(n, 1))) block = r->block;
  }
  if (block == nullptr) return;
  const std::lock_guard<std::mutex> lock(block->mutex);
  block->used_on.insert({device, stream});
}

// ------------------------------------------------------------------------------------------
// Device memory.

struct DeviceBlock {
  void* data = nullptr;
  std::size_t size = 0;
  int device = 0;
  std::int64_t stream = 0;  // allocated for work on this stream
  std::mutex mutex;
  std::set<std::int64_t> recorded;  // record_stream's streams
};

// Freed in stream order: after the stream it was allocated on (and every stream it was recorded
// on) has run what was queued before the free.
void free_device(void* context) {
  auto* block = static_cast<DeviceBlock*>(context);
  std::vector<MarkPtr> marks;
  {
    const std::lock_guard<std::mutex> lock(block->mutex);
    for (const auto id : block->recorded) {
      if (id != block->stream) marks.push_back(stream_of(block->device, id).mark());
    }
  }
  stream_of(block->device, block->stream).enqueue([block, marks = std::move(marks)] {
    for (const auto& m : marks) m->wait();
    g_memory_used.at(block->device).fetch_sub(static_cast<std::int64_t>(block->size));
    std::free(block->data);
    delete block;
  });
}

class DeviceAllocator final : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(std::size_t n) override { return make(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(std::size_t n) const override { return make(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  static c10::DataPtr make(std::size_t n) {
    auto* block = new DeviceBlock();
    block->size = n;
    block->device = t_device;
    block->stream = t_stream.at(t_device);
    block->data = std::aligned_alloc(64, std::max<std::size_t>((n + 63) / 64 * 64, 64));
    TORCH_CHECK(block->data != nullptr, "test device: out of memory");
    std::memset(block->data, 0xA5, n);  // what no copy wrote shows
    g_memory_used.at(block->device).fetch_add(static_cast<std::int64_t>(n));
    return {block->data, block, &free_device, c10::Device(kType, block->device)};
  }
};
DeviceAllocator g_device_allocator;

// Makes `device` the calling thread's current device while it lives.
class OnDevice {
 public:
  explicit OnDevice(int device) : previous_(t_device) {
    TORCH_CHECK(device >= 0 && device < kDevices, "test device: no device ", device);
    t_device = device;
  }
  ~OnDevice() { t_device = previous_; }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_;
};

// ------------------------------------------------------------------------------------------
// The device guard: devices, streams and events, as c10 asks for them.

struct Event {
  MarkPtr mark;  // of the latest record(); null before the first
};

class Guard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, static_cast<c10::DeviceIndex>(t_device)}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType && d.index() >= 0 && d.index() < kDevices,
                "test device: cannot set device ", d);
    t_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < kDevices) t_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    const int index = d.has_index() ? d.index() : t_device;
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, static_cast<c10::DeviceIndex>(index)),
                       t_stream.at(static_cast<std::size_t>(index)));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, 1 + g_next_pool.fetch_add(1) % kPoolStreams);
  }
#if TORCH_VERSION_MAJOR >= 2
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, g_next_new.fetch_add(1));
  }
#endif
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const c10::Stream old = getStream(s.device());
    t_stream.at(static_cast<std::size_t>(s.device_index())) = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }

  void record(void** event,
              const c10::Stream& stream,
              const c10::DeviceIndex,
              const c10::EventFlag) const override {
    auto* e = static_cast<Event*>(*event);
    if (e == nullptr) {
      e = new Event();
      g_live_events.fetch_add(1);
      *event = e;
    }
    e->mark = stream_of(stream).mark();
  }
  void block(void* event, const c10::Stream& stream) const override {
    const auto* e = static_cast<const Event*>(event);
    if (e == nullptr || !e->mark) return;
    stream_of(stream).enqueue([m = e->mark] { m->wait(); });
  }
  bool queryEvent(void* event) const override {
    const auto* e = static_cast<const Event*>(event);
    return e == nullptr || !e->mark || e->mark->query();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event == nullptr) return;
    delete static_cast<Event*>(event);
    g_live_events.fetch_sub(1);
  }
  bool queryStream(const c10::Stream& stream) const override { return stream_of(stream).idle(); }
  void synchronizeStream(const c10::Stream& stream) const override {
    stream_of(stream).synchronize();
  }
#if TORCH_VERSION_MAJOR >= 2
  void synchronizeEvent(void* event) const override {
    const auto* e = static_cast<const Event*>(event);
    if (e != nullptr && e->mark) e->mark->wait();
  }
  void synchronizeDevice(const c10::DeviceIndex) const override { synchronize(); }
#endif
  void recordDataPtrOnStream(const c10::DataPtr& data, const c10::Stream& stream) const override {
    if (data.get_deleter() != &free_device) return;
    auto* block = static_cast<DeviceBlock*>(data.get_context());
    const std::lock_guard<std::mutex> lock(block->mutex);
    block->recorded.insert(stream.id());
  }
};

// ------------------------------------------------------------------------------------------
// Kernels.

bool on_device(const at::Tensor& t) { return t.device().type() == kType; }

// FNV-1a over a host range.
std::uint64_t checksum(const unsigned char* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

// A CPU tensor over `t`'s memory (same sizes, strides and offset) that owns nothing.
at::Tensor host_view(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                       at::TensorOptions().dtype(t.dtype()).device(c10::kCPU));
}

std::size_t span_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  std::size_t elements = 1;
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    elements += static_cast<std::size_t>((t.size(d) - 1) * std::abs(t.stride(d)));
  }
  return elements * t.element_size();
}

at::Tensor empty_memory_format(at::IntArrayRef size,
                               c10::optional<at::ScalarType> dtype,
                               c10::optional<at::Layout>,
                               c10::optional<at::Device> device,
                               c10::optional<bool>,
                               c10::optional<at::MemoryFormat> memory_format) {
  const OnDevice on(device_index_of(device));
  return at::detail::empty_generic(size, &g_device_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size,
                         at::IntArrayRef stride,
                         c10::optional<at::ScalarType> dtype,
                         c10::optional<at::Layout>,
                         c10::optional<at::Device> device,
                         c10::optional<bool>) {
  const OnDevice on(device_index_of(device));
  return at::detail::empty_strided_generic(size, stride, &g_device_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// Every copy to, from or on the device. `self` is the source.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  const bool from_device = on_device(self);
  const bool to_device = on_device(dst);
  TORCH_CHECK(from_device || to_device, "test device: _copy_from between two other devices");
  if (!from_device) {
    // Host to device, on the destination's current stream.
    const int device = dst.device().index();
    const std::int64_t stream_id = t_stream.at(static_cast<std::size_t>(device));
    Stream& stream = stream_of(device, stream_id);
    const std::int64_t delay = g_copy_delay_us.load();
    const std::size_t bytes = span_bytes(self);
    const bool pinned_source = self.is_cpu() && host_pinned(self.data_ptr(), bytes);
    if (non_blocking && pinned_source) {
      // Read when the stream gets there, as a DMA engine would: nothing keeps the source alive
      // but whoever handed it to the copy. Its bytes must be the same then as now: a source
      // unlocked or rewritten in between (a segment back with its worker) is a race, counted.
      note_pinned_use(self.data_ptr(), bytes, device, stream_id);
      const auto* first = static_cast<const unsigned char*>(self.data_ptr());
      stream.enqueue([source = host_view(self), target = host_view(dst), keep = dst.storage(),
                      delay, bytes, issued = checksum(first, bytes)] {
        if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
        const auto* bytes_now = static_cast<const unsigned char*>(source.data_ptr());
        const char* race = !host_pinned(bytes_now, bytes)            ? "unlocked"
                           : checksum(bytes_now, bytes) != issued ? "rewritten"
                                                                  : nullptr;
        if (race != nullptr) {
          g_raced_copies.fetch_add(1);
          std::fprintf(stderr,
                       "test device: a copy's page-locked source (%zu bytes at %p) was %s "
                       "between the copy's issue and its run\n",
                       bytes, source.data_ptr(), race);
          if (race[0] == 'u') {  // it may be unmapped too: not read
            std::memset(target.data_ptr(), 0xEE, span_bytes(target));
            return;
          }
        }
        target.copy_(source);
      });
      return dst;
    }
    // Pageable (or a blocking copy): staged now, so the source may go as soon as this returns.
    at::Tensor staged = self.clone();
    stream.enqueue([staged, target = host_view(dst), keep = dst.storage(), delay] {
      if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      target.copy_(staged);
    });
    if (!non_blocking) stream.synchronize();
    return dst;
  }
  if (!to_device) {
    // Device to host, on the source's current stream; into pinned memory it may stay queued.
    Stream& stream = current_stream(self.device().index());
    const bool pinned_target = host_pinned(dst.data_ptr(), span_bytes(dst));
    if (non_blocking && pinned_target) {
      stream.enqueue([source = host_view(self), target = host_view(dst), keep = self.storage()] {
        target.copy_(source);
      });
      return dst;
    }
    stream.enqueue([source = host_view(self), target = host_view(dst), keep = self.storage()] {
      target.copy_(source);
    });
    stream.synchronize();
    return dst;
  }
  // Device to device: after the source's device has run its queued work (another device), on
  // the destination's current stream.
  if (self.device().index() != dst.device().index()) {
    current_stream(self.device().index()).synchronize();
  }
  Stream& stream = current_stream(dst.device().index());
  stream.enqueue([source = host_view(self), target = host_view(dst), keep_source = self.storage(),
                  keep_target = dst.storage()] { target.copy_(source); });
  if (!non_blocking) stream.synchronize();
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  TORCH_CHECK(dst.sizes() == self.sizes(), "test device: copying ", self.sizes(), " into ",
              dst.sizes(), " needs a resize, which the test device does not do");
  return copy_from(self, dst, false);
}

const at::Tensor& resize(const at::Tensor& self,
                         at::IntArrayRef size,
                         c10::optional<at::MemoryFormat>) {
  TORCH_CHECK(self.sizes() == size, "test device: resize_ from ", self.sizes(), " to ", size,
              " is not supported");
  return self;
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  c10::impl::getDeviceGuardImpl(kType)->recordDataPtrOnStream(self.storage().data_ptr(), stream);
}

// Every other op: LibTorch's CPU fallback (inputs copied to the host, the CPU kernel, results
// copied back), through the copies above, so it respects stream order.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack);
}

#if TORCH_VERSION_MAJOR < 2
// LibTorch 1.13 routes Tensor::is_pinned(device) and pin_memory(device) for a CPU tensor to the
// device's kernels.
bool is_pinned_kernel(const at::Tensor& self, c10::optional<at::Device>) {
  return is_pinned(self);
}
#endif

at::Tensor pinned_copy(const at::Tensor& t) {
  std::vector<std::int64_t> strides = t.strides().vec();
  if (!t.is_non_overlapping_and_dense()) {  // contiguous instead
    std::int64_t step = 1;
    for (std::int64_t d = t.dim() - 1; d >= 0; --d) {
      strides[static_cast<std::size_t>(d)] = step;
      step *= std::max<std::int64_t>(t.size(d), 1);
    }
  }
  const std::size_t bytes = at::detail::computeStorageNbytes(t.sizes(), strides, t.element_size());
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, g_pinned_allocator.allocate(bytes),
                       &g_pinned_allocator, /*resizable=*/false);
  at::Tensor out = at::empty({0}, t.options().device(c10::kCPU)).set_(storage, 0, t.sizes(), strides);
  out.copy_(t);
  return out;
}

#if TORCH_VERSION_MAJOR < 2
at::Tensor pin_memory_kernel(const at::Tensor& self, c10::optional<at::Device>) {
  return pinned_copy(self);
}
#endif

#if TORCH_VERSION_MAJOR >= 2
// LibTorch 2.x asks these of a PrivateUse1 backend (pinned host memory for non_blocking copies
// to the host, and whether a pointer is pinned).
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isPinnedPtr(const void* data) const override { return host_pinned(data, 1); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
};
#endif

// ------------------------------------------------------------------------------------------
// ferry's side: the accelerator the device stage uses.

class TestAccelerator final : public device::Accelerator {
 public:
  c10::DeviceType type() const noexcept override { return kType; }
  std::string unavailable_reason() const override { return ""; }
  device::HostRegistration page_lock(void* data, std::size_t size, int) const override {
    const auto start = reinterpret_cast<std::uintptr_t>(data);
    {
      const std::lock_guard<std::mutex> lock(g_ranges_mutex);
      TORCH_CHECK(find_range(data, 1) == nullptr, "test device: ", data, " is page-locked already");
      ranges()[start] = {size, nullptr};
      ++g_registered;
    }
    return device::HostRegistration([start]() noexcept {
      const std::lock_guard<std::mutex> lock(g_ranges_mutex);
      if (ranges().erase(start) == 1) --g_registered;
    });
  }
  std::vector<int> devices_in_use() const override {
    std::vector<int> used;
    const std::lock_guard<std::mutex> lock(g_streams_mutex);
    for (const auto& [key, stream] : streams()) {
      if (used.empty() || used.back() != key.first) used.push_back(key.first);
    }
    return used;
  }
  bool is_pinned(const torch::Tensor& t) const override { return test_device::is_pinned(t); }
  torch::Tensor pinned_copy(const torch::Tensor& t) const override {
    return test_device::pinned_copy(t);
  }
};

}  // namespace

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static c10::impl::DeviceGuardImplRegistrar guard(kType, new Guard());
    c10::SetAllocator(kType, &g_device_allocator);
    auto* kernels = new torch::Library(torch::Library::IMPL, "aten",
                                       c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    kernels->impl("empty.memory_format", TORCH_FN(empty_memory_format));
    kernels->impl("empty_strided", TORCH_FN(empty_strided));
    kernels->impl("_copy_from", TORCH_FN(copy_from));
    kernels->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
    kernels->impl("view", TORCH_FN(at::native::view));
    kernels->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
    kernels->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
    kernels->impl("resize_", TORCH_FN(resize));
    kernels->impl("record_stream", TORCH_FN(record_stream));
#if TORCH_VERSION_MAJOR < 2
    kernels->impl("is_pinned", TORCH_FN(is_pinned_kernel));
    kernels->impl("_pin_memory", TORCH_FN(pin_memory_kernel));
#else
    at::RegisterPrivateUse1HooksInterface(new Hooks());
#endif
    auto* rest = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1,
                                    __FILE__, __LINE__);
    rest->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
    device::register_accelerator(std::make_unique<TestAccelerator>());
  });
}

torch::Device device(int index) { return {kType, static_cast<c10::DeviceIndex>(index)}; }

void set_copy_delay(std::chrono::microseconds delay) { g_copy_delay_us = delay.count(); }

void queue_busy(std::chrono::microseconds duration, int index) {
  current_stream(index).enqueue([duration] { std::this_thread::sleep_for(duration); });
}

void synchronize() {
  std::vector<Stream*> all;
  {
    const std::lock_guard<std::mutex> lock(g_streams_mutex);
    for (const auto& [key, stream] : streams()) all.push_back(stream);
  }
  // Twice: work a stream ran may have queued more (a deferred free) on another.
  for (int round = 0; round < 2; ++round) {
    for (Stream* s : all) s->synchronize();
  }
}

bool is_pinned(const torch::Tensor& t) {
  return t.defined() && t.is_cpu() && host_pinned(t.data_ptr(), span_bytes(t));
}

std::int64_t memory_used(int index) { return g_memory_used.at(static_cast<std::size_t>(index)).load(); }

std::size_t live_events() { return g_live_events.load(); }

std::size_t locked_ranges() {
  const std::lock_guard<std::mutex> lock(g_ranges_mutex);
  return g_registered;
}

std::size_t raced_copies() { return g_raced_copies.load(); }

}  // namespace ferry::testing::test_device
