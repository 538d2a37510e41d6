// The interpreter's global memory: every buffer a kernel may touch is registered with
// its size and an initialised-byte map (XLA's buffers for the span of an FFI call, the
// interpreted device's allocations until freed). A kernel's access outside every
// registered buffer, or a read of bytes never written, stops the kernel with a report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace oxijax::interp {

// Registers [p, p + bytes); uninitialised buffers are filled with 0xff (NaN in every
// float dtype) so that a read that escapes the checks still shows.
void register_buffer(void* p, size_t bytes, std::string label, bool initialized);
void unregister_buffer(void* p);

// Device memory of the interpreted device: registered, uninitialised, between redzones.
void* device_alloc(size_t bytes, std::string label);
void device_free(void* p);
size_t device_bytes_in_use();

// Host-side accesses (memset, copies): false with a reason when [p, p + bytes) is not
// inside one registered buffer (or, with require_init, holds bytes never written).
bool host_access(const void* p, size_t bytes, bool write, bool require_init, std::string& why);

}  // namespace oxijax::interp
