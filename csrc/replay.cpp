// The launches of a recorded eager call (torch_sampling_ops/_call_cache.py), replayed through the
// CUDA driver's cuLaunchKernelEx in one call from Python: Triton's launcher parses every argument
// of every launch from a Python tuple, which costs more than the launch itself for a kernel with
// twenty arguments.
//
// The extension builds without the CUDA toolkit (the CPU kernels need none): the few driver types
// used here are declared below as cuda.h lays them out (CUDA 12 and 13), and libcuda.so.1 is opened
// at the first replay, as Triton's launcher does.
#include <dlfcn.h>
#include <torch/extension.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace tso {

namespace py = pybind11;

namespace {

using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using CUcontext = void*;

// CUlaunchAttribute: the attribute's id, padding to 8 bytes, a 64-byte value union.
struct LaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    unsigned int flag;
    struct {
      unsigned int x, y, z;
    } cluster;
    int policy;
  } value;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");

// CUlaunchConfig
struct LaunchConfig {
  unsigned int grid_x, grid_y, grid_z;
  unsigned int block_x, block_y, block_z;
  unsigned int shared_bytes;
  CUstream stream;
  LaunchAttribute* attrs;
  unsigned int num_attrs;
};

// CUlaunchAttributeID values and CU_CLUSTER_SCHEDULING_POLICY_SPREAD (cuda.h).
constexpr int kAttrCooperative = 2;
constexpr int kAttrClusterDimension = 4;
constexpr int kAttrClusterSchedulingPolicy = 5;
constexpr int kAttrProgrammaticStreamSerialization = 6;
constexpr int kClusterSchedulingSpread = 1;

using LaunchKernelExFn = CUresult (*)(const LaunchConfig*, CUfunction, void**, void**);
using CtxGetCurrentFn = CUresult (*)(CUcontext*);
using GetErrorStringFn = CUresult (*)(CUresult, const char**);

struct Driver {
  LaunchKernelExFn launch = nullptr;
  CtxGetCurrentFn ctx_get_current = nullptr;
  GetErrorStringFn error_string = nullptr;
};

// The driver's entry points, or a Driver of null pointers where libcuda is missing.
const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) return;
    d.launch = reinterpret_cast<LaunchKernelExFn>(dlsym(lib, "cuLaunchKernelEx"));
    d.ctx_get_current = reinterpret_cast<CtxGetCurrentFn>(dlsym(lib, "cuCtxGetCurrent"));
    d.error_string = reinterpret_cast<GetErrorStringFn>(dlsym(lib, "cuGetErrorString"));
    if (d.ctx_get_current == nullptr || d.error_string == nullptr) d.launch = nullptr;
  });
  return d;
}

struct Launch {
  uint64_t function;
  unsigned int grid[3];
  unsigned int block;
  unsigned int shared_bytes;
  unsigned int num_ctas;
  bool pdl;
  bool cooperative;
  // Per kernel parameter: the index of its value in the replay's pool, or -1: a constant, whose
  // bits (little-endian, the parameter's size taken from the front) are in `constants`.
  std::vector<int64_t> sources;
  std::vector<uint64_t> constants;
};

// A tensor a replay allocates and returns (an output of the call): its pool index, shape, dtype and
// device. Allocated here, so that a replay makes no call from Python for its outputs.
struct Output {
  int64_t value = -1;  // its index among the values the launches read, or -1: none reads it
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  at::Device device;
};

// A recorded call's launches, each as (function, grid x, y, z, threads a block, shared bytes, CTAs
// a cluster, PDL, cooperative, sources, constant bits), see Launch, and the call's outputs, each as
// (pool index, shape, dtype, device), see Output.
class LaunchPlan {
 public:
  LaunchPlan(const py::list& launches, const py::list& outputs) {
    for (const py::handle& item : launches) {
      const auto t = item.cast<py::tuple>();
      if (t.size() != 11) throw std::invalid_argument("LaunchPlan: a launch is an 11-tuple");
      Launch l;
      l.function = t[0].cast<uint64_t>();
      for (int j = 0; j < 3; ++j) l.grid[j] = t[1 + j].cast<unsigned int>();
      l.block = t[4].cast<unsigned int>();
      l.shared_bytes = t[5].cast<unsigned int>();
      l.num_ctas = t[6].cast<unsigned int>();
      l.pdl = t[7].cast<bool>();
      l.cooperative = t[8].cast<bool>();
      l.sources = t[9].cast<std::vector<int64_t>>();
      l.constants = t[10].cast<std::vector<uint64_t>>();
      if (l.sources.size() != l.constants.size()) {
        throw std::invalid_argument("LaunchPlan: one constant slot per parameter");
      }
      // Pool indices become indices into the values a replay reads (only those it uses).
      for (int64_t& s : l.sources) {
        if (s < 0) continue;
        size_t k = 0;
        while (k < used_.size() && used_[k] != s) ++k;
        if (k == used_.size()) used_.push_back(s);
        s = static_cast<int64_t>(k);
      }
      max_params_ = std::max(max_params_, l.sources.size());
      launches_.push_back(std::move(l));
    }
    for (const py::handle& item : outputs) {
      const auto t = item.cast<py::tuple>();
      if (t.size() != 4) throw std::invalid_argument("LaunchPlan: an output is a 4-tuple");
      const auto index = t[0].cast<int64_t>();
      Output o{-1, t[1].cast<std::vector<int64_t>>(), t[2].cast<at::ScalarType>(),
               t[3].cast<at::Device>()};
      for (size_t k = 0; k < used_.size(); ++k) {
        if (used_[k] == index) o.value = static_cast<int64_t>(k);
      }
      outputs_.push_back(std::move(o));
    }
  }

  // Allocates the outputs and launches every recorded kernel on `stream` with the pool's values (a
  // list; the entries the launches read are Python ints: data pointers; an output's entry is a
  // placeholder) in its parameters; returns the outputs, a tuple in the plan's order. Returns None,
  // having allocated and launched nothing, where the driver or a current context is missing (the
  // caller then allocates and launches through Triton's launchers).
  py::object replay(uint64_t stream, const py::list& pool) const {
    const Driver& d = driver();
    if (d.launch == nullptr) return py::none();
    CUcontext ctx = nullptr;
    if (d.ctx_get_current(&ctx) != 0 || ctx == nullptr) return py::none();
    const auto n = static_cast<int64_t>(PyList_GET_SIZE(pool.ptr()));
    std::vector<uint64_t> values(used_.size());
    for (size_t k = 0; k < used_.size(); ++k) {
      if (used_[k] >= n) throw std::out_of_range("LaunchPlan.replay: the pool is too short");
      values[k] = PyLong_AsUnsignedLongLongMask(PyList_GET_ITEM(pool.ptr(), used_[k]));
      if (PyErr_Occurred()) throw py::error_already_set();
    }
    py::tuple allocated(outputs_.size());
    for (size_t i = 0; i < outputs_.size(); ++i) {
      const Output& o = outputs_[i];
      at::Tensor out = at::empty(o.shape, at::TensorOptions().dtype(o.dtype).device(o.device));
      if (o.value >= 0)
        values[static_cast<size_t>(o.value)] = reinterpret_cast<uint64_t>(out.data_ptr());
      allocated[i] = py::cast(std::move(out));
    }
    std::vector<uint64_t> slots(max_params_);
    std::vector<void*> params(max_params_);
    CUresult status = 0;
    {
      py::gil_scoped_release no_gil;
      for (const Launch& l : launches_) {
        const size_t m = l.sources.size();
        for (size_t j = 0; j < m; ++j) {
          const int64_t s = l.sources[j];
          slots[j] = s >= 0 ? values[static_cast<size_t>(s)] : l.constants[j];
          params[j] = &slots[j];
        }
        LaunchAttribute attrs[4] = {};
        unsigned int num_attrs = 0;
        if (l.pdl) {
          attrs[num_attrs].id = kAttrProgrammaticStreamSerialization;
          attrs[num_attrs++].value.flag = 1;
        }
        if (l.cooperative) {
          attrs[num_attrs].id = kAttrCooperative;
          attrs[num_attrs++].value.flag = 1;
        }
        if (l.num_ctas != 1) {
          attrs[num_attrs].id = kAttrClusterDimension;
          attrs[num_attrs].value.cluster.x = l.num_ctas;
          attrs[num_attrs].value.cluster.y = 1;
          attrs[num_attrs++].value.cluster.z = 1;
          attrs[num_attrs].id = kAttrClusterSchedulingPolicy;
          attrs[num_attrs++].value.policy = kClusterSchedulingSpread;
        }
        LaunchConfig config;
        config.grid_x = l.grid[0] * l.num_ctas;
        config.grid_y = l.grid[1];
        config.grid_z = l.grid[2];
        config.block_x = l.block;
        config.block_y = 1;
        config.block_z = 1;
        config.shared_bytes = l.shared_bytes;
        config.stream = reinterpret_cast<CUstream>(stream);
        config.attrs = attrs;
        config.num_attrs = num_attrs;
        if (config.grid_x == 0 || config.grid_y == 0 || config.grid_z == 0) continue;
        status =
            d.launch(&config, reinterpret_cast<CUfunction>(l.function), params.data(), nullptr);
        if (status != 0) break;
      }
    }
    if (status != 0) {
      const char* text = nullptr;
      d.error_string(status, &text);
      throw std::runtime_error(std::string("torch_sampling_ops: cuLaunchKernelEx failed: ") +
                               (text != nullptr ? text : "unknown error"));
    }
    return std::move(allocated);
  }

  size_t size() const { return launches_.size(); }

 private:
  std::vector<Launch> launches_;
  std::vector<Output> outputs_;
  std::vector<int64_t> used_;  // the pool indices the launches read, in first-use order
  size_t max_params_ = 0;
};

}  // namespace

void bind_launch_plan(py::module_& m) {
  py::class_<LaunchPlan>(
      m, "LaunchPlan", "The launches of a recorded eager call, replayed through cuLaunchKernelEx.")
      .def(py::init<const py::list&, const py::list&>(), py::arg("launches"), py::arg("outputs"))
      .def("replay", &LaunchPlan::replay, py::arg("stream"), py::arg("pool"))
      .def("__len__", &LaunchPlan::size);
}

}  // namespace tso
