#include "host_tensor.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

namespace et_trt::runner {
namespace {

struct NpyType {
  const char* descr;
  ScalarType dtype;
};
// numpy has no bfloat16; bf16 inputs come as float32 files.
constexpr NpyType kNpyTypes[] = {
    {"<f4", ScalarType::Float}, {"<f8", ScalarType::Double}, {"<f2", ScalarType::Half},
    {"<i8", ScalarType::Long},  {"<i4", ScalarType::Int},    {"<i2", ScalarType::Short},
    {"|i1", ScalarType::Char},  {"|u1", ScalarType::Byte},   {"|b1", ScalarType::Bool},
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

// Value of `key` in the header dict text, up to the next top-level comma.
bool dict_value(const std::string& header, const std::string& key, std::string* value) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) return false;
  size_t p = header.find(':', k);
  if (p == std::string::npos) return false;
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  if (p >= header.size()) return false;
  if (header[p] == '(') {
    const size_t close = header.find(')', p);
    if (close == std::string::npos) return false;
    *value = header.substr(p, close - p + 1);
  } else {
    const size_t end = header.find_first_of(",}", p);
    if (end == std::string::npos) return false;
    *value = header.substr(p, end - p);
  }
  return true;
}

double element_as_double(const HostTensor& t, int64_t i) {
  const uint8_t* p = t.data.data() + i * element_size(t.dtype);
  switch (t.dtype) {
    case ScalarType::Float: { float v; std::memcpy(&v, p, 4); return v; }
    case ScalarType::Double: { double v; std::memcpy(&v, p, 8); return v; }
    case ScalarType::Half: { uint16_t v; std::memcpy(&v, p, 2); return fp16_to_float(v); }
    case ScalarType::BFloat16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_to_float(v); }
    case ScalarType::Long: { int64_t v; std::memcpy(&v, p, 8); return double(v); }
    case ScalarType::Int: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case ScalarType::Short: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case ScalarType::Char: return int8_t(*p);
    case ScalarType::Byte: case ScalarType::Bool: return *p;
    default: return std::nan("");
  }
}

}  // namespace

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t element_size(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Byte: case ScalarType::Char: case ScalarType::Bool: return 1;
    case ScalarType::Short: case ScalarType::Half: case ScalarType::BFloat16: return 2;
    case ScalarType::Int: case ScalarType::Float: return 4;
    case ScalarType::Long: case ScalarType::Double: return 8;
    default: return 0;
  }
}

const char* dtype_name(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Bool: return "bool";
    case ScalarType::Short: return "int16";
    case ScalarType::Half: return "fp16";
    case ScalarType::BFloat16: return "bf16";
    case ScalarType::Int: return "int32";
    case ScalarType::Float: return "fp32";
    case ScalarType::Long: return "int64";
    case ScalarType::Double: return "fp64";
    default: return "unsupported dtype";
  }
}

float bf16_to_float(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if (std::isnan(value)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return uint16_t(u >> 16);
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float magnitude;
  if (exp == 0) {
    magnitude = std::ldexp(float(mant), -24);
  } else if (exp == 31) {
    magnitude = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    magnitude = std::ldexp(float(mant | 0x400), exp - 25);
  }
  uint32_t u;
  std::memcpy(&u, &magnitude, 4);
  u |= sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_fp16(float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  float a = std::fabs(value);
  if (std::isnan(value)) return 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {          // subnormal: multiples of 2^-24
    return sign | uint16_t(std::nearbyint(a * std::ldexp(1.0f, 24)));
  }
  int exp;
  const float m = std::frexp(a, &exp);  // a = m * 2^exp, m in [0.5, 1)
  const uint32_t mant = uint32_t(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  const uint32_t bits = (uint32_t(exp + 14) << 10) + mant;  // a carry into the exponent is correct
  return sign | uint16_t(bits);
}

std::string parse_npy(const std::vector<uint8_t>& bytes, HostTensor* out) {
  static const uint8_t kMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) return "not a .npy file (bad magic)";
  const int major = bytes[6];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = bytes[8] | size_t(bytes[9]) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return ".npy header truncated";
    header_len = bytes[8] | size_t(bytes[9]) << 8 | size_t(bytes[10]) << 16 | size_t(bytes[11]) << 24;
    header_start = 12;
  } else {
    return ".npy format version " + std::to_string(major) + " is not supported (1-3 are)";
  }
  if (header_len > bytes.size() - header_start) return ".npy header truncated";
  const std::string header(reinterpret_cast<const char*>(bytes.data() + header_start), header_len);
  std::string descr, fortran, shape_text_value;
  if (!dict_value(header, "descr", &descr) || !dict_value(header, "fortran_order", &fortran) ||
      !dict_value(header, "shape", &shape_text_value)) {
    return ".npy header lacks descr, fortran_order or shape";
  }
  if (fortran != "False") return ".npy array is in Fortran order; save it C-contiguous (np.ascontiguousarray)";
  if (descr.size() < 2) return ".npy descr " + descr + " is not understood";
  descr = descr.substr(1, descr.size() - 2);  // strip quotes
  bool known = false;
  for (const NpyType& t : kNpyTypes) {
    if (descr == t.descr) {
      out->dtype = t.dtype;
      known = true;
    }
  }
  if (!known) return ".npy dtype '" + descr + "' is not supported (little-endian numbers and bool are)";
  out->shape.clear();
  std::string dims = shape_text_value.substr(1, shape_text_value.size() - 2);
  std::stringstream ss(dims);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    char* end = nullptr;
    const long long d = std::strtoll(item.c_str() + b, &end, 10);
    if (end == item.c_str() + b || d < 0 || d > (1LL << 40)) return ".npy shape " + shape_text_value + " is not understood";
    out->shape.push_back(d);
  }
  const size_t data_start = header_start + header_len;
  // Overflow-safe: each dim <= 2^40 and the product is checked against the file size as it grows.
  size_t expected = element_size(out->dtype);
  for (int64_t d : out->shape) {
    if (d != 0 && expected > (bytes.size() / size_t(d)) + 1) return ".npy data is shorter than its shape says";
    expected *= size_t(d);
  }
  if (bytes.size() - data_start != expected) {
    return ".npy holds " + std::to_string(bytes.size() - data_start) + " data bytes, shape " +
           shape_text(out->shape) + " of " + dtype_name(out->dtype) + " needs " + std::to_string(expected);
  }
  out->data.assign(bytes.begin() + data_start, bytes.end());
  return "";
}

std::vector<uint8_t> to_npy(const HostTensor& tensor) {
  const char* descr = "<f4";
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
  HostTensor converted;
  const HostTensor* t = &tensor;
  if (tensor.dtype == ScalarType::BFloat16) {  // numpy cannot hold bf16: write float32
    converted.dtype = ScalarType::Float;
    converted.shape = tensor.shape;
    converted.data.resize(tensor.numel() * 4);
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      const float v = float(element_as_double(tensor, i));
      std::memcpy(converted.data.data() + 4 * i, &v, 4);
    }
    t = &converted;
  }
  for (const NpyType& n : kNpyTypes) {
    if (n.dtype == t->dtype) descr = n.descr;
  }
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (";
  for (int64_t d : t->shape) header += std::to_string(d) + ", ";
  header += "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  out[8] = uint8_t(header.size() & 0xff);
  out[9] = uint8_t(header.size() >> 8);
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), t->data.begin(), t->data.end());
  return out;
}

std::string load_input(const std::string& file, size_t index, ScalarType dtype, const std::vector<int64_t>& shape,
                       HostTensor* out) {
  const std::string where = "input " + std::to_string(index) + " (" + file + "): ";
  std::ifstream in(file, std::ios::binary);
  if (!in) return where + "cannot open the file";
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const bool is_npy = file.size() >= 4 && file.compare(file.size() - 4, 4, ".npy") == 0;
  if (!is_npy) {
    out->dtype = dtype;
    out->shape = shape;
    const size_t expected = out->numel() * element_size(dtype);
    if (bytes.size() != expected) {
      return where + "raw file holds " + std::to_string(bytes.size()) + " bytes, the input " + dtype_name(dtype) +
             shape_text(shape) + " needs " + std::to_string(expected) + " (or give a .npy file)";
    }
    out->data = std::move(bytes);
    return "";
  }
  HostTensor npy;
  const std::string problem = parse_npy(bytes, &npy);
  if (!problem.empty()) return where + problem;
  if (npy.shape.size() != shape.size()) {
    return where + "shape " + shape_text(npy.shape) + " has rank " + std::to_string(npy.shape.size()) +
           ", the method's input has rank " + std::to_string(shape.size()) + " " + shape_text(shape);
  }
  const bool narrow = npy.dtype == ScalarType::Float && (dtype == ScalarType::BFloat16 || dtype == ScalarType::Half);
  if (npy.dtype != dtype && !narrow) {
    return where + "dtype " + dtype_name(npy.dtype) + ", the method's input is " + dtype_name(dtype);
  }
  out->dtype = dtype;
  out->shape = npy.shape;
  if (!narrow) {
    out->data = std::move(npy.data);
    return "";
  }
  out->data.resize(npy.numel() * 2);
  for (int64_t i = 0; i < npy.numel(); ++i) {
    float v;
    std::memcpy(&v, npy.data.data() + 4 * i, 4);
    const uint16_t h = dtype == ScalarType::BFloat16 ? float_to_bf16(v) : float_to_fp16(v);
    std::memcpy(out->data.data() + 2 * i, &h, 2);
  }
  return "";
}

HostTensor random_tensor(ScalarType dtype, const std::vector<int64_t>& shape, uint64_t seed) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.data.resize(t.numel() * element_size(dtype));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint8_t* p = t.data.data() + i * element_size(dtype);
    const float f = uniform(rng);
    const int64_t n = int64_t(rng() % 8);
    switch (dtype) {
      case ScalarType::Float: std::memcpy(p, &f, 4); break;
      case ScalarType::Double: { const double d = f; std::memcpy(p, &d, 8); break; }
      case ScalarType::Half: { const uint16_t h = float_to_fp16(f); std::memcpy(p, &h, 2); break; }
      case ScalarType::BFloat16: { const uint16_t h = float_to_bf16(f); std::memcpy(p, &h, 2); break; }
      case ScalarType::Long: std::memcpy(p, &n, 8); break;
      case ScalarType::Int: { const int32_t v = int32_t(n); std::memcpy(p, &v, 4); break; }
      case ScalarType::Short: { const int16_t v = int16_t(n); std::memcpy(p, &v, 2); break; }
      case ScalarType::Char: case ScalarType::Byte: *p = uint8_t(n); break;
      case ScalarType::Bool: *p = uint8_t(n & 1); break;
      default: break;
    }
  }
  return t;
}

std::string summarize(const HostTensor& t) {
  std::ostringstream out;
  out << dtype_name(t.dtype) << shape_text(t.shape);
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  int64_t finite = 0, nonfinite = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = element_as_double(t, i);
    if (!std::isfinite(v)) {
      ++nonfinite;
      continue;
    }
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
    ++finite;
  }
  if (finite > 0) out << " min " << lo << " mean " << sum / double(finite) << " max " << hi;
  if (nonfinite > 0) out << " non-finite " << nonfinite;
  return out.str();
}

}  // namespace et_trt::runner
