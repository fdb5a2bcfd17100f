#include "draw.h"
#include "ops.h"

namespace tso {
pybind11::object bind_launch_args(const pybind11::tuple& args);  // launch_args.cpp
pybind11::object arg_signature(const pybind11::tuple& args);     // arg_signature.cpp
void register_cpu_checks(const std::string& name, pybind11::object checks,
                         std::vector<int> written);  // cpu_dispatch.cpp
void set_debug_checks(bool enabled);                 // cpu_dispatch.cpp
void bind_launch_plan(pybind11::module_& m);         // replay.cpp
}  // namespace tso

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CPU kernels of torch_sampling_ops";
  m.def("logit_bias", &tso::logit_bias);
  m.def("apply_token_bitmask", &tso::apply_token_bitmask, pybind11::arg("logits"),
        pybind11::arg("bitmask"), pybind11::arg("idx_mapping") = pybind11::none());
  m.def("temperature", &tso::temperature);
  m.def("min_p", &tso::min_p);
  m.def("top_k_top_p", &tso::top_k_top_p);
  m.def("penalties", &tso::penalties);
  m.def("update_output_counts", &tso::update_output_counts);
  m.def("bad_words", &tso::bad_words);
  m.def("random_stream", &tso::random_stream);
  m.def("gumbel_noise", &tso::gumbel_noise);
  m.def(
      "noise_upper",
      [](const at::Tensor& bits) {
        const at::Tensor words = bits.to(at::kInt).contiguous();
        const int64_t n = words.numel();
        at::Tensor upper = at::empty({n}, words.options().dtype(at::kFloat));
        const int32_t* w = words.data_ptr<int32_t>();
        float* out = upper.data_ptr<float>();
        int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX2)
        for (; i + 8 <= n; i += 8) {
          _mm256_storeu_ps(out + i, tso::block_noise_upper_x8(_mm256_loadu_si256(
                                        reinterpret_cast<const __m256i*>(w + i))));
        }
#endif
        for (; i < n; ++i) out[i] = tso::block_noise_upper(static_cast<uint32_t>(w[i]));
        return upper;
      },
      "The upper bounds of a block's float32 noise -log(-log(u) / 4) of stream bits that the CPU "
      "draws skip blocks by (in AVX2 builds 8 at a time as the vectorized scan computes them).");
  m.def("logprobs", &tso::logprobs);
  namespace py = pybind11;
  m.def("sample", &tso::sample, py::arg("logits"), py::arg("idx_mapping"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("seeds"),
        py::arg("output_lens"), py::arg("tol") = tso::kGumbelApproxTol);
  m.attr("GUMBEL_APPROX_TOL") = tso::kGumbelApproxTol;
  m.def("rejection_sample", &tso::rejection_sample, py::arg("target_logits"),
        py::arg("draft_token_ids"), py::arg("draft_probs"), py::arg("cu_num_draft"),
        py::arg("temperature"), py::arg("seeds"), py::arg("output_lens"), py::arg("max_spec_len"),
        py::arg("tol") = tso::kGumbelApproxTol);
  m.def("bind_launch_args", &tso::bind_launch_args);
  m.def("arg_signature", &tso::arg_signature);
  tso::bind_launch_plan(m);
  m.def("register_cpu_checks", &tso::register_cpu_checks,
        "Hands the C++ CPU kernel of sampling::<name> its Python checks and the indices of the "
        "arguments it writes in place.");
  m.def("set_debug_checks", &tso::set_debug_checks,
        "Whether the C++ CPU kernels run the checks (with the value checks) on every call.");
}
