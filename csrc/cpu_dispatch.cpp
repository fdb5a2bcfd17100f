// The CPU kernels of the sampling ops, registered for the CPU dispatch key in C++, so that a call
// does not enter Python: the argument checks are Python functions (torch_sampling_ops/_checks.py,
// shared with the CUDA and fake implementations), run for a call whose argument metadata has not
// passed them yet, or on every call while debug checks are on. Metadata that passed is remembered
// as one key per call: each tensor's dtype, device, requires-grad under grad mode, sizes and
// strides, and each scalar's value (what the checks read). Then every tensor the op writes in place
// gets its version counter bumped, as PyTorch's in-place ops do, and the kernel runs.
//
// torch_sampling_ops._registry hands each op's checks and written arguments over
// (`register_cpu_checks`); a call before that raises.
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "draw.h"
#include "ops.h"
#include "signature.h"

namespace tso {

namespace py = pybind11;

namespace {

constexpr size_t kMaxSignatures = 4096;  // remembered per op (then forgotten at once)

struct OpChecks {
  py::object checks;         // checks(*args): raises TypeError / ValueError
  std::vector<int> written;  // arguments written in place
  std::unordered_set<std::string> passed;
  std::mutex mutex;  // `passed` is shared by calls from several threads
};

std::atomic<bool> g_debug{false};

// Never destroyed: it holds Python objects, which must not be released after the interpreter.
std::unordered_map<std::string, OpChecks>& registry() {
  static auto* ops = new std::unordered_map<std::string, OpChecks>();
  return *ops;
}

// The key bytes of signature.h; false for what they cannot describe: checked every call.
bool append_arg(std::string& key, const at::Tensor& t) {
  return append_tensor_key(key, t, at::GradMode::is_enabled());
}

bool append_arg(std::string& key, const std::optional<at::Tensor>& t) {
  if (!t.has_value()) {
    key += 'N';
    return true;
  }
  return append_arg(key, *t);
}

bool append_arg(std::string& key, int64_t v) {
  append_int_key(key, v);
  return true;
}

const at::Tensor* tensor_of(const at::Tensor& t) { return &t; }
const at::Tensor* tensor_of(const std::optional<at::Tensor>& t) {
  return t.has_value() ? &*t : nullptr;
}
template <typename V>
const at::Tensor* tensor_of(const V&) {
  return nullptr;
}

// Runs the Python checks; their TypeError / ValueError reach the caller as such.
template <typename... Args>
void run_python_checks(const char* name, const py::object& checks, const Args&... args) {
  py::gil_scoped_acquire gil;
  if (!checks) {
    TORCH_CHECK(false, "torch_sampling_ops: the checks of sampling::", name,
                " are not registered (import torch_sampling_ops)");
  }
  try {
    checks(args...);
  } catch (py::error_already_set& e) {
    const std::string message = py::str(e.value());
    if (e.matches(PyExc_TypeError)) TORCH_CHECK_TYPE(false, message);
    if (e.matches(PyExc_ValueError)) TORCH_CHECK_VALUE(false, message);
    throw;
  }
}

// The checks of op `name` for these arguments (skipped for metadata that passed them), then the
// version bump of the tensors it writes.
template <typename... Args>
void check_and_bump(const char* name, const Args&... args) {
  OpChecks& op = registry().at(name);  // every op has an entry from its registration below
  std::string key;
  key.reserve(sizeof...(Args) * 40);
  const bool keyed = (append_arg(key, args) && ...);
  bool known = false;
  if (keyed && !g_debug.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(op.mutex);
    known = op.passed.count(key) > 0;
  }
  if (!known) {
    run_python_checks(name, op.checks, args...);
    if (keyed) {
      std::lock_guard<std::mutex> lock(op.mutex);
      if (op.passed.size() >= kMaxSignatures) op.passed.clear();
      op.passed.insert(std::move(key));
    }
  }
  const std::array<const at::Tensor*, sizeof...(Args)> tensors{tensor_of(args)...};
  for (const int i : op.written) {
    const at::Tensor* t = tensors[static_cast<size_t>(i)];
    if (t != nullptr && !t->is_inference()) torch::autograd::impl::bump_version(*t);
  }
}

// The registered kernel of an op: its checks, then the C++ kernel.
template <auto Kernel>
struct Checked;

template <typename Ret, typename... Args, Ret (*Kernel)(Args...)>
struct Checked<Kernel> {
  template <const char* Name>
  static Ret call(Args... args) {
    check_and_bump(Name, args...);
    return Kernel(args...);
  }
};

// `sample` and `rejection_sample` take the draw's tolerance, which the ops do not expose.
at::Tensor sample_op(const at::Tensor& logits, const at::Tensor& idx_mapping,
                     const at::Tensor& temperature, const at::Tensor& top_k,
                     const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& seeds,
                     const at::Tensor& output_lens) {
  return sample(logits, idx_mapping, temperature, top_k, top_p, min_p, seeds, output_lens,
                kGumbelApproxTol);
}

std::tuple<at::Tensor, at::Tensor> rejection_sample_op(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& cu_num_draft,
    const at::Tensor& temperature, const at::Tensor& seeds, const at::Tensor& output_lens,
    int64_t max_spec_len) {
  return rejection_sample(target_logits, draft_token_ids, draft_probs, cu_num_draft, temperature,
                          seeds, output_lens, max_spec_len, kGumbelApproxTol);
}

constexpr char kLogitBias[] = "logit_bias";
constexpr char kApplyTokenBitmask[] = "apply_token_bitmask";
constexpr char kTemperature[] = "temperature";
constexpr char kMinP[] = "min_p";
constexpr char kTopKTopP[] = "top_k_top_p";
constexpr char kPenalties[] = "penalties";
constexpr char kUpdateOutputCounts[] = "update_output_counts";
constexpr char kBadWords[] = "bad_words";
constexpr char kLogprobs[] = "logprobs";
constexpr char kSample[] = "sample";
constexpr char kRejectionSample[] = "rejection_sample";

}  // namespace

void register_cpu_checks(const std::string& name, py::object checks, std::vector<int> written) {
  auto& ops = registry();
  auto found = ops.find(name);
  TORCH_CHECK(found != ops.end(), "torch_sampling_ops: no C++ CPU kernel for sampling::", name);
  OpChecks& op = found->second;
  std::lock_guard<std::mutex> lock(op.mutex);
  op.checks = std::move(checks);
  op.written = std::move(written);
  op.passed.clear();
}

void set_debug_checks(bool enabled) { g_debug.store(enabled, std::memory_order_relaxed); }

}  // namespace tso

TORCH_LIBRARY_IMPL(sampling, CPU, m) {
  using namespace tso;
  for (const char* name :
       {kLogitBias, kApplyTokenBitmask, kTemperature, kMinP, kTopKTopP, kPenalties,
        kUpdateOutputCounts, kBadWords, kLogprobs, kSample, kRejectionSample}) {
    registry()[name];
  }
  m.impl(kLogitBias, TORCH_FN(Checked<&logit_bias>::call<kLogitBias>));
  m.impl(kApplyTokenBitmask, TORCH_FN(Checked<&apply_token_bitmask>::call<kApplyTokenBitmask>));
  m.impl(kTemperature, TORCH_FN(Checked<&temperature>::call<kTemperature>));
  m.impl(kMinP, TORCH_FN(Checked<&min_p>::call<kMinP>));
  m.impl(kTopKTopP, TORCH_FN(Checked<&top_k_top_p>::call<kTopKTopP>));
  m.impl(kPenalties, TORCH_FN(Checked<&penalties>::call<kPenalties>));
  m.impl(kUpdateOutputCounts, TORCH_FN(Checked<&update_output_counts>::call<kUpdateOutputCounts>));
  m.impl(kBadWords, TORCH_FN(Checked<&bad_words>::call<kBadWords>));
  m.impl(kLogprobs, TORCH_FN(Checked<&logprobs>::call<kLogprobs>));
  m.impl(kSample, TORCH_FN(Checked<&sample_op>::call<kSample>));
  m.impl(kRejectionSample, TORCH_FN(Checked<&rejection_sample_op>::call<kRejectionSample>));
}
