#include "ipc/unique_fd.h"

#include <unistd.h>

namespace ferry::ipc {

void UniqueFd::reset(int fd) noexcept {
  // Linux closes the descriptor even when close() reports EINTR, so never retry.
  if (fd_ >= 0) (void)::close(fd_);
  fd_ = fd;
}

}  // namespace ferry::ipc
