// ferry::init: in a process ferry started (a spawned worker, a spawned forkserver), serve and
// never return; in the program itself, remember that init ran and fork the forkserver.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "ferry/registry.h"

#include "workers/forker.h"
#include "workers/forkserver.h"
#include "workers/spawn.h"

namespace ferry::workers {

namespace {

std::atomic<bool> g_init_called{false};

int parse_fd(const char* s) {
  int v = -1;
  const std::string_view text(s);
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  return (r.ec == std::errc() && r.ptr == text.data() + text.size()) ? v : -1;
}

}  // namespace

bool init_called() noexcept { return g_init_called.load(); }

void ignore_sigint() {
  ::signal(SIGINT, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  ::sigprocmask(SIG_UNBLOCK, &mask, nullptr);  // a Ctrl-C that came meanwhile is dropped
}

void init_process(int argc, char** argv, bool start_forkserver) {
  if (argc >= 2 && std::strcmp(argv[1], kSpawnedWorkerFlag) == 0) {
    const int index_fd = argc == 6 ? parse_fd(argv[2]) : -1;
    const int data_fd = argc == 6 ? parse_fd(argv[3]) : -1;
    const int status_fd = argc == 6 ? parse_fd(argv[4]) : -1;
    ignore_sigint();
    if (index_fd < 0 || data_fd < 0 || status_fd < 0) {
      exit_with_message(
          "bad arguments for a spawned DataLoader worker (is this program, or ferry-worker, "
          "from another build of ferry than the program that started it?)");
    }
    follow_parent(static_cast<pid_t>(std::atoll(argv[5])));
    serve_setup(Registry::global(), ipc::Channel(ipc::UniqueFd(index_fd)),
                ipc::Channel(ipc::UniqueFd(data_fd)), ipc::UniqueFd(status_fd));
  }
  if (argc >= 4 && std::strcmp(argv[1], kForkserverFlag) == 0) {
    const int control_fd = parse_fd(argv[2]);
    ignore_sigint();
    if (control_fd < 0) exit_with_message("bad arguments for a ferry forkserver");
    const auto parent = static_cast<pid_t>(std::atoll(argv[3]));
    follow_parent(parent);
    run_forkserver(ipc::Channel(ipc::UniqueFd(control_fd)), parent);
  }
  g_init_called = true;
  if (start_forkserver) start_forkserver_now();
}

}  // namespace ferry::workers

namespace ferry::detail {
void init_process(int argc, char** argv, bool start_forkserver) {
  workers::init_process(argc, argv, start_forkserver);
}
bool init_called() noexcept { return workers::init_called(); }
}  // namespace ferry::detail
