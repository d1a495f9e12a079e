#pragma once

// The forkserver start method: a single-threaded server process, forked by ferry::init before
// any thread pool exists (or spawned as a fresh copy of the program later), forks each worker
// on request. Workers are made with clone(CLONE_PARENT), so they are children of the loader's
// process, like fork's and spawn's: it waits for them, gets their exit status and sees them die
// through a pidfd, with no help from the server.

#include <sys/types.h>

#include "ipc/channel.h"

namespace ferry::workers {

// The server's loop: one request (the worker's two channel ends) at a time; answers the
// worker's pid. Exits when the loader's process closes the control channel or dies.
[[noreturn]] void run_forkserver(ipc::Channel control, pid_t parent);

// Forks the server now, from ferry::init, if this process is still single-threaded;
// otherwise the first forkserver loader spawns a fresh one.
void start_forkserver_now();

}  // namespace ferry::workers
