#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ferry/batch.h"

#include "ipc/protocol.h"

namespace ferry::detail {

// A worker's "batch ready" message turned into a batch over shared memory, trusting nothing in
// it: every field is checked against the segment this process mapped and measured itself
// (`base`, `size`). The tensors point into the segment and each holds `owner`, which keeps the
// mapping alive. Throws ferry::Error naming `who` (the worker) and the field for a dtype or kind
// out of range, a negative size, an element count or byte count that overflows, a byte count
// that is not the tensor's extent, an offset that wraps, is misaligned or leaves the segment.
// Moves the message's strings and indices into the batch.
Batch open_batch(ipc::BatchReadyMessage& message,
                 std::byte* base,
                 std::size_t size,
                 const std::shared_ptr<void>& owner,
                 const std::string& who);

}  // namespace ferry::detail
