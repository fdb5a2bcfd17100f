// The bytes of the key that stands for the metadata an op's argument checks read
// (torch_sampling_ops/_registry.py): built from Python objects by arg_signature.cpp (CUDA calls)
// and from typed arguments by cpu_dispatch.cpp (CPU calls), with the same bytes for the same
// metadata. A tensor gives 'T', its dtype, device type and index, whether it requires grad under
// grad mode, its rank, sizes and strides; an int 'I' and its value, a bool 'b'/'B', a float 'F'
// and its bits, None 'N'.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace tso {

template <typename V>
inline void append_bytes(std::string& key, V value) {
  char bytes[sizeof(V)];
  std::memcpy(bytes, &value, sizeof(V));
  key.append(bytes, sizeof(V));
}

// False for a tensor the key cannot describe (undefined, or a layout without strides).
inline bool append_tensor_key(std::string& key, const at::Tensor& t, bool grad_mode) {
  if (!t.defined() || t.layout() != at::kStrided) return false;
  key += 'T';
  key += static_cast<char>(t.scalar_type());
  key += static_cast<char>(t.device().type());
  key += static_cast<char>(t.device().index());
  key += static_cast<char>(grad_mode && t.requires_grad());
  key += static_cast<char>(t.dim());
  for (const int64_t s : t.sizes()) append_bytes(key, s);
  for (const int64_t s : t.strides()) append_bytes(key, s);
  return true;
}

inline void append_int_key(std::string& key, int64_t v) {
  key += 'I';
  append_bytes(key, v);
}

inline void append_float_key(std::string& key, double v) {
  key += 'F';
  append_bytes(key, v);
}

}  // namespace tso
