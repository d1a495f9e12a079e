#!/usr/bin/env bash
# Builds ferry's library, its engine tests (multi-process, resume, fault and respawn) and the
# chaos runs under sanitizers and runs them. Not part of CI (./setup.sh test): a sanitizer build takes longer.
#
#   tests/sanitize.sh address   AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/
#   tests/sanitize.sh thread    ThreadSanitizer, in build-tsan/
#
# Extra arguments go to ctest (for example -R Respawn). Needs what ./setup.sh test installs.
# LibTorch itself is not instrumented: reports inside it are not ferry's, and leak checking is
# off (LibTorch keeps allocations until exit on purpose).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-address}
exclude=()
extra_cmake=()
shift || true
case "$kind" in
  address)
    sanitizers=address,undefined
    dir=build-asan
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    ;;
  thread)
    sanitizers=thread
    dir=build-tsan
    # A fork worker starts threads in a child of a multi-threaded process, which ThreadSanitizer
    # refuses by default (it cannot vouch for the child's locks); ferry's workers reset what they
    # inherit, so let them run.
    # GCC 12's ThreadSanitizer runtime keeps the parent's live threads registered in a fork
    # child; glibc hands their stacks to the child's new threads, so a child that starts and joins
    # a thread (a worker's pool, LibTorch's) dies with "dup thread with used id". LLVM 15 and later
    # forget those threads at fork, so the build links LLVM 16's runtime (Debian's
    # libclang-rt-16-dev) under GCC's instrumentation, which calls the same __tsan_* interface.
    runtime=/usr/lib/llvm-16/lib/clang/16/lib/linux/libclang_rt.tsan-x86_64.so
    if [ ! -e "$runtime" ]; then
      echo "tests/sanitize.sh: installing libclang-rt-16-dev (LLVM 16's ThreadSanitizer runtime)"
      sudo=()
      [ "$(id -u)" -eq 0 ] || sudo=(sudo)
      "${sudo[@]}" apt-get update -qq
      DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        libclang-rt-16-dev
    fi
    extra_cmake=(-DFERRY_TSAN_RUNTIME="$runtime")
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:external_symbolizer_path=/usr/bin/addr2line}
    # The forkserver refuses to fork from a process with more than one thread, and
    # ThreadSanitizer starts a thread of its own in every process: those tests cannot pass here.
    # In a child forked from a multi-threaded process, ThreadSanitizer stops watching and holds
    # back asynchronous signals for good (its handler waits for an intercepted call that never
    # comes): a fork worker's sample_timeout alarm never reaches ferry's handler there. The
    # test's spawn run covers the watchdog under ThreadSanitizer.
    exclude=(-E "[Ff]orkserver|Timeout\.ASampleThatOutrunsSampleTimeoutStopsItsWorker/fork")
    export FERRY_CHAOS_NO_FORKSERVER=1
    echo "tests/sanitize.sh: forkserver tests left out (ThreadSanitizer's own thread makes every" \
      "process multi-threaded, which the forkserver refuses by design), and the fork run of" \
      "the sample_timeout test (ThreadSanitizer holds back signals in a fork child)"
    ;;
  *)
    echo "usage: tests/sanitize.sh address|thread [ctest arguments]" >&2
    exit 2
    ;;
esac
# Time bounds that tests assert (a timeout's detection, a shutdown) are scaled: instrumented
# workers start and run several times slower.
export FERRY_TEST_TIME_SCALE=${FERRY_TEST_TIME_SCALE:-3}
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
mkdir -p "$dir"
cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFERRY_SANITIZE="$sanitizers" -DFERRY_WITH_OPENCV=OFF -DFERRY_BUILD_BENCH=OFF \
  -DFERRY_BUILD_EXAMPLES=OFF "${extra_cmake[@]}" > "$dir/configure.log" 2>&1 ||
  { tail -20 "$dir/configure.log"; exit 1; }
start=$(date +%s)
cmake --build "$dir" -j "$(nproc)" --target ferry_engine_tests ferry_noinit_tests ferry_chaos_tests \
  ferry-worker
echo "tests/sanitize.sh: built with -fsanitize=$sanitizers in $(($(date +%s) - start)) s"
ctest --test-dir "$dir" -L "engine|chaos" "${exclude[@]}" -j "$(nproc)" --timeout 900 \
  --output-on-failure "$@"
