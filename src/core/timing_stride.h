#pragma once

// Which events to time when they come too fast for a clock read each. The stats are on by
// default, and a CLOCK_MONOTONIC read costs about 20 ns: a few of them are under 1% of an event
// (a batch the loop takes, a batch a worker makes) that lasts kFastNs or more, so such events are
// all timed. Faster than that, one event in `stride` is timed (the stride doubling up to
// kMaxStride while events stay fast) and stands for the events since the previous timed one; an
// event or a stretch between timed ones that is slow on average goes back to timing every event.
// Sums and quantiles are then estimates from the timed events (sums never more than the time that
// passed: a timed event that was slow, preempted on a busy machine, is not taken for every fast
// one before it); counts stay exact.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ferry::detail {

class TimingStride {
 public:
  static constexpr std::uint64_t kFastNs = 10'000;  // 100,000 events a second
  static constexpr std::uint32_t kMaxStride = 64;

  // Whether to time the event about to begin (call once per event).
  bool due() noexcept {
    if (countdown_ > 1) {
      --countdown_;
      return false;
    }
    return true;
  }

  // The event that due() chose ran from `start_ns` to `end_ns` (CLOCK_MONOTONIC). Returns how
  // many events it stands for: itself and those since the previous timed one.
  std::uint32_t timed(std::uint64_t start_ns, std::uint64_t end_ns) noexcept {
    const std::uint32_t weight = stride_;
    const std::uint64_t event = end_ns - std::min(end_ns, start_ns);
    // The stretch since the previous timed event ended holds `weight` events and what the caller
    // did between them; unknown (and not held against a faster stride) for the first.
    const std::uint64_t stretch = last_end_ns_ == 0 ? 0 : end_ns - std::min(end_ns, last_end_ns_);
    const bool fast = event < kFastNs && stretch < std::uint64_t{weight} * kFastNs;
    // The events it stands for took no longer in all than the stretch they lie in.
    scale_ = weight;
    tile_ = weight;
    if (stretch > 0 && event > 0) {
      tile_ = static_cast<double>(stretch) / static_cast<double>(event);
      scale_ = std::min(scale_, tile_);
    }
    stride_ = fast ? std::min(stride_ * 2, kMaxStride) : 1;
    countdown_ = stride_;
    last_end_ns_ = end_ns;
    return weight;
  }

  // A duration measured in the event timed() last took (the whole of it, or a part), estimated
  // for all the events it stands for: times their number, but never more in all than the
  // stretch since the previous timed one (a timed event that was slow, preempted on a busy
  // machine, is not taken for every fast one before it).
  std::uint64_t scaled(std::uint64_t ns) const noexcept {
    return static_cast<std::uint64_t>(std::llround(static_cast<double>(ns) * scale_));
  }

  // The same for events that fill the time between them end to end (a worker's batches, each
  // from the previous one's send to its own): together they took the stretch exactly, shared out
  // as the timed event was. A busy machine that preempts the untimed ones between timed ones
  // then costs the estimate nothing.
  std::uint64_t tiled(std::uint64_t ns) const noexcept {
    return static_cast<std::uint64_t>(std::llround(static_cast<double>(ns) * tile_));
  }

  std::uint32_t stride() const noexcept { return stride_; }

 private:
  std::uint32_t stride_ = 1;
  std::uint32_t countdown_ = 1;
  std::uint64_t last_end_ns_ = 0;
  double scale_ = 1;  // scaled()'s factor for the event timed() last took
  double tile_ = 1;   // tiled()'s
};

}  // namespace ferry::detail
