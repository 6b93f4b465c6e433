// Little-endian integers in file headers (the blob's, a .ptd's), read byte by
// byte: no alignment or host byte order assumed.
#pragma once

#include <cstdint>

namespace et_trt {

inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

inline uint64_t load_u64(const uint8_t* p) { return uint64_t(load_u32(p)) | uint64_t(load_u32(p + 4)) << 32; }

}  // namespace et_trt
