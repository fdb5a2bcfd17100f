// The counter-based random stream of the sampling ops, keyed by (seed, position, token index).
// torch_sampling_ops/sampling.py implements the same function in Triton and
// torch_sampling_ops/reference.py in torch integer arithmetic (the definition): every step is a
// 32-bit integer operation (wrapping multiplies, xor, logical shifts), so all three compute the
// same bits; the uniform is exact in float32 and only the two logs may round differently.
#pragma once

#include <cmath>
#include <cstdint>

namespace tso {

// The finalizer of murmur3: a bijection of uint32 with full avalanche.
inline uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// The key of one row's stream: the four 32-bit words of (seed, position), low word first.
inline uint32_t stream_key(int64_t seed, int64_t position) {
  const uint64_t s = static_cast<uint64_t>(seed), p = static_cast<uint64_t>(position);
  uint32_t k = mix32(static_cast<uint32_t>(s) ^ 0x9E3779B9u);
  k = mix32(k ^ static_cast<uint32_t>(s >> 32));
  k = mix32(k ^ static_cast<uint32_t>(p));
  return mix32(k ^ static_cast<uint32_t>(p >> 32));
}

// The 32 random bits of token `token` (in [0, 2**31)) of the stream `key`.
inline uint32_t stream_bits(uint32_t key, uint32_t token) {
  return mix32(mix32(key ^ token) + 0x6A09E667u);
}

// A uniform in (0, 1) from the top 23 bits: (2m + 1) / 2**24, exact in float32, never 0 or 1.
inline float stream_uniform(uint32_t bits) {
  return (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

// Gumbel noise -log(-log(u)), in float32.
inline float stream_gumbel(uint32_t bits) { return -std::log(-std::log(stream_uniform(bits))); }

// The Gumbel noise of token j (a vocabulary index) of the stream `key`: what every exact score
// adds.
inline float token_noise(uint32_t key, int64_t j) {
  return stream_gumbel(stream_bits(key, static_cast<uint32_t>(j)));
}

}  // namespace tso
