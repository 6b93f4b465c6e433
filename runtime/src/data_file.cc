// et_trt::verify_data_file: ExecuTorch's FlatTensor layout (a .ptd) is
//   [0, 8)          the flatbuffer's root offset and identifier "FT01"
//   [8, 48)         the FlatTensorHeader: "FH01", its length, then four u64:
//                   flatbuffer offset and size, segment base offset, segment data size
//   [0, fb_end)     the flatbuffer (header inside it), fb_end = flatbuffer offset + size
//   [base, base + data size)  the segments, each at base + its offset
// (executorch/extension/flat_tensor/serialize/: flat_tensor.fbs, serialize.py,
// flat_tensor_header.h). flat_tensor_generated.h is flatc's code for the
// wheel's flat_tensor.fbs (cmake/flat_tensor_schema.cmake).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "data_file_check.h"
#include "et_trt/data_file.h"
#include "flat_tensor_generated.h"
#include "little_endian.h"
#include "utf8.h"

namespace et_trt {
namespace {

constexpr char kHeaderMagic[4] = {'F', 'H', '0', '1'};
constexpr size_t kHeaderOffset = 8;
constexpr uint32_t kHeaderLength = 40;

bool fail(std::string* problem, const std::string& what) {
  *problem = what;
  return false;
}

// [offset, offset + size) lies inside [0, limit), without overflow.
bool inside(uint64_t offset, uint64_t size, uint64_t limit) { return offset <= limit && size <= limit - offset; }

bool check_named_data(const flat_tensor_flatbuffer::FlatTensor& root, uint64_t segment_data_size,
                      std::string* problem) {
  const auto& segments = *root.segments();
  for (flatbuffers::uoffset_t i = 0; i < segments.size(); ++i) {
    const auto* segment = segments.Get(i);
    if (!inside(segment->offset(), segment->size(), segment_data_size)) {
      return fail(problem, "segment " + std::to_string(i) + " (" + std::to_string(segment->size()) +
                               " bytes at offset " + std::to_string(segment->offset()) +
                               ") ends past the segment data (" + std::to_string(segment_data_size) + " bytes)");
    }
  }
  const auto& named = *root.named_data();
  // ExecuTorch refuses a key seen twice, blaming the program (.pte): say here that the data file holds it.
  std::unordered_map<std::string_view, flatbuffers::uoffset_t> first_with_key;
  for (flatbuffers::uoffset_t i = 0; i < named.size(); ++i) {
    const auto* entry = named.Get(i);
    // Named by index: a key's text may hold anything, line breaks included.
    const std::string which = "named data " + std::to_string(i);
    if (entry->key() == nullptr) return fail(problem, which + " has no key");
    // Keys reach ExecuTorch's log, whose Python sink aborts on text that is not UTF-8.
    if (!is_utf8(entry->key()->string_view())) return fail(problem, which + "'s key is not UTF-8 text");
    const auto [first, added] = first_with_key.emplace(entry->key()->string_view(), i);
    if (!added) {
      return fail(problem, which + " repeats the key of named data " + std::to_string(first->second) +
                               " (each key names one tensor)");
    }
    if (entry->segment_index() >= segments.size()) {
      return fail(problem, which + " points at segment " + std::to_string(entry->segment_index()) + " of " +
                               std::to_string(segments.size()));
    }
    // ExecuTorch reads as many dim_order entries as there are sizes.
    if (const auto* layout = entry->tensor_layout()) {
      if (layout->sizes() == nullptr || layout->dim_order() == nullptr ||
          layout->sizes()->size() != layout->dim_order()->size()) {
        return fail(problem, which + " has a tensor layout whose sizes and dim_order differ in length");
      }
    }
  }
  return true;
}

}  // namespace

bool check_data_file(const uint8_t* data, size_t size, std::string* problem) {
  if (size < kDataFileHeadBytes) {
    return fail(problem, std::to_string(size) + " bytes, too short for an ExecuTorch data file (.ptd), which starts "
                                                "with a " + std::to_string(kDataFileHeadBytes) + "-byte header");
  }
  if (std::memcmp(data + 4, "ET", 2) == 0) {
    return fail(problem, "an ExecuTorch program (.pte), not a data file (.ptd): pass the .ptd exported with it");
  }
  if (!flat_tensor_flatbuffer::FlatTensorBufferHasIdentifier(data) ||
      std::memcmp(data + kHeaderOffset, kHeaderMagic, sizeof(kHeaderMagic)) != 0) {
    return fail(problem, "not an ExecuTorch data file (.ptd): no 'FT01' identifier and 'FH01' header at bytes 4-12");
  }
  const uint8_t* header = data + kHeaderOffset;
  if (load_u32(header + 4) < kHeaderLength) {
    return fail(problem, "its header is " + std::to_string(load_u32(header + 4)) + " bytes long, less than the " +
                             std::to_string(kHeaderLength) + " it must hold");
  }
  const uint64_t flatbuffer_offset = load_u64(header + 8), flatbuffer_size = load_u64(header + 16);
  const uint64_t segment_base = load_u64(header + 24), segment_data_size = load_u64(header + 32);
  if (!inside(flatbuffer_offset, flatbuffer_size, size)) {
    return fail(problem, "its header announces a flatbuffer of " + std::to_string(flatbuffer_size) +
                             " bytes at offset " + std::to_string(flatbuffer_offset) + ", past the file's end (" +
                             std::to_string(size) + " bytes): truncated?");
  }
  const uint64_t flatbuffer_end = flatbuffer_offset + flatbuffer_size;
  if (!inside(segment_base, segment_data_size, size)) {
    return fail(problem, "its header announces " + std::to_string(segment_data_size) + " bytes of data at offset " +
                             std::to_string(segment_base) + ", past the file's end (" + std::to_string(size) +
                             " bytes): truncated?");
  }
  if (segment_data_size > 0 && segment_base < flatbuffer_end) {
    return fail(problem, "its header puts the data at offset " + std::to_string(segment_base) +
                             ", inside its flatbuffer (which ends at " + std::to_string(flatbuffer_end) + ")");
  }
  if (flatbuffer_end >= FLATBUFFERS_MAX_BUFFER_SIZE) {
    return fail(problem, "its header announces a flatbuffer of " + std::to_string(flatbuffer_end) +
                             " bytes, more than a flatbuffer can hold");
  }
  flatbuffers::Verifier verifier(data, static_cast<size_t>(flatbuffer_end));
  if (!flat_tensor_flatbuffer::VerifyFlatTensorBuffer(verifier)) {
    return fail(problem, "its flatbuffer (the key table, " + std::to_string(flatbuffer_end) +
                             " bytes) fails the flatbuffers Verifier");
  }
  const auto* root = flat_tensor_flatbuffer::GetFlatTensor(data);
  if (root->version() > kDataFileSchemaVersion) {
    return fail(problem, "its schema version " + std::to_string(root->version()) + " is newer than ExecuTorch " +
                             "reads here (" + std::to_string(kDataFileSchemaVersion) + ")");
  }
  if (root->segments() == nullptr || root->named_data() == nullptr) {
    return fail(problem, "its flatbuffer has no segment or named data table");
  }
  return check_named_data(*root, segment_data_size, problem);
}

bool verify_data_file(const std::string& path, std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  const std::string name = valid_utf8(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat info {};
  if (fd < 0 || ::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    const std::string reason = fd < 0 ? std::strerror(errno) : "not a regular file";
    if (fd >= 0) ::close(fd);
    *error = "cannot open data file " + name + " (" + reason + ")";
    return false;
  }
  const size_t size = static_cast<size_t>(info.st_size);
  std::string problem;
  bool ok = false;
  if (size < kDataFileHeadBytes) {
    ok = check_data_file(nullptr, size, &problem);  // refuses by size alone
  } else {
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      problem = std::string("cannot map it into memory (") + std::strerror(errno) + ")";
    } else {
      ok = check_data_file(static_cast<const uint8_t*>(mapped), size, &problem);
      ::munmap(mapped, size);
    }
  }
  ::close(fd);
  if (!ok) *error = name + ": " + problem + "; copy the file again or re-export it (et-trt export --external-data)";
  return ok;
}

}  // namespace et_trt
