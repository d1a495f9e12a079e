#pragma once

#include "ferry/registry.h"
#if defined(FERRY_HAS_VISION)
#include "ferry/vision.h"
#endif

namespace ferry {

/// Registers every type ferry was built with (the core types now; the image types when built
/// with OpenCV) into `registry`. Idempotent.
inline void register_builtins(Registry& registry = Registry::global()) {
  register_core_types(registry);
#if defined(FERRY_HAS_VISION)
  vision::register_vision_types(registry);
#endif
}

namespace detail {
void init_process(int argc, char** argv, bool start_forkserver);
bool init_called() noexcept;
}  // namespace detail

/// Call first thing in `main`, after registering your own types, when any loader may use
/// `start_method = spawn` or `forkserver`:
///
///   int main(int argc, char** argv) {
///     ferry::Registry::global().add_dataset(...);  // your types, if any
///     ferry::init(argc, argv);
///     ...
///   }
///
/// A spawned worker is a fresh copy of this program: in it, this call rebuilds the dataset from
/// the registry, runs the worker and never returns. In the program itself it registers ferry's
/// built-in types and forks the forkserver while the process is still single-threaded (if
/// threads already run, a forkserver loader spawns a fresh server instead). Code before this
/// call runs in every spawned worker too, so keep it to registrations.
inline void init(int argc, char** argv) {
  register_builtins(Registry::global());
  detail::init_process(argc, argv, /*start_forkserver=*/true);
}

/// True once ferry::init ran in this process.
inline bool initialized() noexcept { return detail::init_called(); }

}  // namespace ferry
