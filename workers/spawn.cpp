#include "workers/spawn.h"

#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ferry/error.h"

#include "ipc/protocol.h"
#include "workers/forker.h"
#include "workers/worker_loop.h"

extern char** environ;

namespace ferry::workers {

void exit_with_message(const std::string& message) {
  std::fprintf(stderr, "ferry: %s\n", message.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

std::string self_program() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("ferry: cannot read /proc/self/exe to spawn workers: " + ec.message());
  return path.string();
}

std::optional<std::string> find_ferry_worker(std::vector<std::string>& tried) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("FERRY_WORKER_PROGRAM"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  } else {
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) candidates.push_back((self.parent_path() / "ferry-worker").string());
#ifdef FERRY_BUILD_TREE_WORKER
    candidates.emplace_back(FERRY_BUILD_TREE_WORKER);
#endif
#ifdef FERRY_INSTALLED_WORKER
    candidates.emplace_back(FERRY_INSTALLED_WORKER);
#endif
  }
  for (const auto& c : candidates) {
    tried.push_back(c);
    if (::access(c.c_str(), X_OK) == 0) return c;
  }
  return std::nullopt;
}

pid_t spawn_process(const std::string& program,
                    const char* flag,
                    std::span<const int> fds,
                    const char* what,
                    int stderr_fd) {
  return start_on_forker_thread([&]() -> pid_t {
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawnattr_init(&attr);
    const std::string argv0 = program.empty() ? self_program() : program;
    std::vector<std::string> args{argv0, flag};
    // First, so that no later dup2 onto 3 and up has overwritten it yet.
    if (stderr_fd >= 0) ::posix_spawn_file_actions_adddup2(&actions, stderr_fd, STDERR_FILENO);
    // Each descriptor goes to the lowest number from 3 that is none of `fds` and not taken yet,
    // so no dup2 overwrites a descriptor still to be moved.
    int target = 2;
    for (const int fd : fds) {
      do {
        ++target;
      } while (std::find(fds.begin(), fds.end(), target) != fds.end());
      ::posix_spawn_file_actions_adddup2(&actions, fd, target);
      args.push_back(std::to_string(target));
    }
    args.push_back(std::to_string(::getpid()));
    sigset_t mask, all;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);   // blocked until ferry::init ignores it (see ignore_sigint)
    sigaddset(&mask, SIGUSR1);  // blocked until the worker can report (not killed by it)
    sigfillset(&all);
    ::posix_spawnattr_setsigmask(&attr, &mask);
    ::posix_spawnattr_setsigdefault(&attr, &all);  // no ignored SIGPIPE or SIGINT inherited
    ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // This process's own program is run as /proc/self/exe: the same file, even if its path
    // was replaced or deleted since the program started.
    const char* path = program.empty() ? "/proc/self/exe" : program.c_str();
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, path, &actions, &attr, argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      throw Error(detail::str(
          "could not start ", what, ": posix_spawn(", argv0, ") failed: ", std::strerror(rc),
          rc == ENOENT || rc == EACCES ? "; check that the program exists and is executable" : ""));
    }
    return pid;
  });
}

pid_t spawn_worker(
    const std::string& program, int index_fd, int data_fd, int status_fd, int stderr_fd) {
  const int fds[3] = {index_fd, data_fd, status_fd};
  return spawn_process(program, kSpawnedWorkerFlag, fds, "a DataLoader worker", stderr_fd);
}

ipc::SetupMessage setup_message(const WorkerSpec& spec,
                                std::string dataset_config,
                                std::string collate_config) {
  ipc::SetupMessage setup;
  setup.worker_id = spec.worker_id;
  setup.num_workers = spec.num_workers;
  setup.base_seed = spec.base_seed;
  setup.torch_seed = spec.torch_seed;
  setup.batch_size = spec.batch_size;
  setup.drop_last = spec.drop_last;
  setup.keep_free_segments = spec.keep_free_segments;
  setup.spin = spec.spin;
  setup.sample_timeout_ms = static_cast<std::uint64_t>(spec.sample_timeout.count());
  setup.worker_threads = spec.worker_threads;
  setup.skip_errors = spec.skip_errors;
  setup.parent_pid = spec.parent_pid;
  setup.trace = spec.trace;
  setup.cpus.assign(spec.cpus.begin(), spec.cpus.end());
  setup.dataset_config = std::move(dataset_config);
  setup.collate_config = std::move(collate_config);
  return setup;
}

WorkerSpec worker_spec(const ipc::SetupMessage& setup) {
  WorkerSpec spec;
  spec.worker_id = setup.worker_id;
  spec.num_workers = setup.num_workers;
  spec.base_seed = setup.base_seed;
  spec.torch_seed = setup.torch_seed;
  spec.batch_size = setup.batch_size;
  spec.drop_last = setup.drop_last;
  spec.keep_free_segments = setup.keep_free_segments;
  spec.spin = setup.spin;
  spec.sample_timeout = std::chrono::milliseconds(setup.sample_timeout_ms);
  spec.worker_threads = static_cast<std::size_t>(setup.worker_threads);
  spec.skip_errors = setup.skip_errors;
  spec.parent_pid = static_cast<pid_t>(setup.parent_pid);
  spec.trace = setup.trace;
  spec.cpus.assign(setup.cpus.begin(), setup.cpus.end());
  return spec;
}

void serve_setup(const Registry& registry,
                 ipc::Channel index,
                 ipc::Channel data,
                 ipc::UniqueFd status) {
  std::vector<std::byte> bytes;
  std::vector<ipc::UniqueFd> fds;
  ipc::SetupMessage setup;
  try {
    if (!index.receive(bytes, fds)) ::_exit(0);  // the loader went away before we started
    auto message = ipc::decode_index(bytes);
    auto* s = std::get_if<ipc::SetupMessage>(&message);
    if (s == nullptr)
      exit_with_message("a spawned DataLoader worker expected its setup message first");
    setup = std::move(*s);
  } catch (...) {
    exit_with_message("a spawned DataLoader worker could not read its setup: " +
                      current_exception_message());
  }

  WorkerSpec spec = worker_spec(setup);
  spec.status = map_status_page(std::move(status));
  prepare_worker_process(spec);

  ipc::WorkerReadyMessage ready;
  ready.pid = ::getpid();
  const char* stage = "rebuilding the dataset from its configuration";
  try {
    AnyDataset any = registry.make_any_dataset(Config::parse_text(setup.dataset_config));
    if (auto* map = std::get_if<std::shared_ptr<Dataset>>(&any)) {
      ready.dataset_hash = (*map)->spec()->hash;
      ready.dataset_size = static_cast<std::int64_t>((*map)->size());
      spec.dataset = std::move(*map);
    } else {
      auto& iterable = std::get<std::shared_ptr<IterableDataset>>(any);
      ready.dataset_hash = iterable->spec()->hash;
      spec.iterable = std::move(iterable);
    }
    if (!setup.collate_config.empty()) {
      stage = "rebuilding the collate function from its configuration";
      spec.collate_fn = registry.make_collate(Config::parse_text(setup.collate_config));
      ready.collate_hash = collate_spec(spec.collate_fn)->hash;
    }
  } catch (...) {
    ipc::WorkerErrorMessage error;
    error.type_name = current_exception_type_name();
    error.message = std::string(stage) + " failed: " + current_exception_message();
    (void)data.send(ipc::encode(ipc::DataMessage(std::move(error))), {},
                    ipc::Clock::now() + std::chrono::seconds(5));
    std::fflush(stderr);
    ::_exit(1);
  }
  if (data.send(ipc::encode(ipc::DataMessage(ready))) != ipc::Channel::SendResult::kSent) {
    ::_exit(0);
  }
  run_worker(spec, std::move(index), std::move(data));
}

}  // namespace ferry::workers
