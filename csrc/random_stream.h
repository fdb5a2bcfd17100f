// The counter-based random stream of the sampling ops, keyed by (seed, position, token index).
// torch_sampling_ops/sampling.py implements the same function in Triton and
// torch_sampling_ops/reference.py in torch integer arithmetic (the definition): every step is a
// 32-bit integer operation (wrapping multiplies, xor, logical shifts), so all three compute the
// same bits; the uniform is exact in float32 and only the logs may round differently.
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

// Gumbel noise -log(-log(u)), in float32: a block's noise (below) less log 4, up to rounding.
inline float stream_gumbel(uint32_t bits) { return -std::log(-std::log(stream_uniform(bits))); }

// Token j's noise comes from its block of 4 tokens, b = j >> 2: the block's bits are those of
// counter kBlockCounter | b (at least 2**31: no token index, nor rejection_sample's acceptance
// counter 2**31 - 1), their low 2 bits the block's first arrival pos, their uniform the block's
// W = -log(u) / 4 (an Exp(4): the least of 4 iid Exp(1)). Token pos has E = W, every other token
// E = W + an Exp(1) of its own bits, and noise -log(E): iid standard Gumbel over the tokens of a
// block (memorylessness), at most -log(W) (E >= W; float addition and log are monotone), token pos
// exactly -log(W).
constexpr uint32_t kBlockCounter = 0x80000000u;

// The bits of the block of token j.
inline uint32_t block_bits(uint32_t key, int64_t j) {
  return stream_bits(key, kBlockCounter | static_cast<uint32_t>(j >> 2));
}

// W of a block's bits, in float32 (the multiplication by 1/4 is exact).
inline float block_exponential(uint32_t block) { return -std::log(stream_uniform(block)) * 0.25f; }

// The noise of token j of the stream `key`, given its block's bits and their W.
inline float token_noise_in_block(uint32_t key, int64_t j, uint32_t block, float w) {
  if ((static_cast<uint32_t>(j) & 3u) == (block & 3u)) return -std::log(w);
  return -std::log(w + -std::log(stream_uniform(stream_bits(key, static_cast<uint32_t>(j)))));
}

// The Gumbel noise of token j (a vocabulary index) of the stream `key`: what every exact score
// adds.
inline float token_noise(uint32_t key, int64_t j) {
  const uint32_t block = block_bits(key, j);
  return token_noise_in_block(key, j, block, block_exponential(block));
}

}  // namespace tso
