// Declarations of the CPU kernels; cpu_dispatch.cpp registers them for the CPU dispatch key of the
// sampling ops, bindings.cpp also exposes them to Python (tests call them directly).
#pragma once

#include "common.h"

namespace tso {

void logit_bias(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& output_lens,
                const at::Tensor& allowed_ids, const at::Tensor& num_allowed,
                const at::Tensor& bias_ids, const at::Tensor& bias_values,
                const at::Tensor& num_bias, const at::Tensor& stop_ids, const at::Tensor& num_stop,
                const at::Tensor& min_tokens);

void apply_token_bitmask(at::Tensor logits, const at::Tensor& bitmask,
                         const std::optional<at::Tensor>& idx_mapping);

void temperature(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& temperature);

void min_p(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& min_p);

void top_k_top_p(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& top_k,
                 const at::Tensor& top_p);

// A float32 buffer of at least V floats that the calling thread owns, kept from call to call (no
// allocation once the thread has seen a row as long); top_k_top_p_threshold keeps its own.
float* thread_row_buffer(int64_t V);

// The threshold of top_k_top_p on one float32 row without NaN whose max is row_max: it keeps the
// tokens at least the threshold (-inf: every token; the filters off or no logit above -inf).
float top_k_top_p_threshold(const float* x, int64_t V, float row_max, int64_t k, float p);

void penalties(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& prompt_mask,
               const at::Tensor& output_mask, const at::Tensor& output_counts,
               const at::Tensor& repetition_penalty, const at::Tensor& frequency_penalty,
               const at::Tensor& presence_penalty);

void update_output_counts(at::Tensor output_counts, at::Tensor output_mask,
                          const at::Tensor& idx_mapping, const at::Tensor& token_ids);

void bad_words(at::Tensor logits, const at::Tensor& idx_mapping, const at::Tensor& bad_word_ids,
               const at::Tensor& bad_word_offsets, const at::Tensor& num_bad_words,
               const at::Tensor& history, const at::Tensor& history_lens);

// (exact, approximate) -log(-log u) of stream bits (a block's noise less log 4): the approximation
// is the CPU twin of the Triton draw's, checked against the exact noise by the tests.
std::tuple<at::Tensor, at::Tensor> gumbel_noise(const at::Tensor& bits);
// (stream_bits(key, token), token_noise(key, token)) of each (seed, position, token).
std::tuple<at::Tensor, at::Tensor> random_stream(const at::Tensor& seeds,
                                                 const at::Tensor& positions,
                                                 const at::Tensor& tokens);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs(const at::Tensor& logits,
                                                                    const at::Tensor& token_ids,
                                                                    int64_t num_logprobs);

// tol: the margin of the draws' skip test (kGumbelApproxTol in draw.h by default; the draws are
// exact whatever it is, a larger one only scores more tokens: a huge one, as tests force, every
// live token of finite logits well below it).
at::Tensor sample(const at::Tensor& logits, const at::Tensor& idx_mapping,
                  const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                  const at::Tensor& min_p, const at::Tensor& seeds, const at::Tensor& output_lens,
                  double tol);

std::tuple<at::Tensor, at::Tensor> rejection_sample(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& cu_num_draft,
    const at::Tensor& temperature, const at::Tensor& seeds, const at::Tensor& output_lens,
    int64_t max_spec_len, double tol);

}  // namespace tso
