// ferry-worker: a DataLoader worker for start_method=spawn, for programs that did not call
// ferry::init and whose pipeline uses only ferry's built-in types. ferry starts it with its own
// arguments; it rebuilds the dataset from the configuration it is sent.

#include <cstdio>

#include "ferry/init.h"

int main(int argc, char** argv) {
  ferry::register_builtins();
  ferry::detail::init_process(argc, argv, /*start_forkserver=*/false);  // a worker never returns
  std::fprintf(stderr,
               "ferry-worker runs DataLoader workers for start_method=spawn; ferry starts it "
               "with its own arguments. It is not meant to be run by hand.\n");
  return 2;
}
