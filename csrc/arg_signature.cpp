// The metadata an op's argument checks read (torch_sampling_ops/_registry.py), as one bytes key, so
// that a call whose arguments match ones already checked skips the Python checks: those cost more
// than a small call's kernel.
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace tso {

namespace py = pybind11;

namespace {

template <typename V>
void append(std::string& key, V value) {
  char bytes[sizeof(V)];
  std::memcpy(bytes, &value, sizeof(V));
  key.append(bytes, sizeof(V));
}

}  // namespace

// Per argument: a plain strided tensor gives 'T', its dtype, device type and index, whether it
// requires grad under grad mode, its rank, sizes and strides; an int 'I' and its value, a bool
// 'B' and its value, a float 'F' and its bits, None 'N'. Returns None for anything else (a tensor
// subclass or another layout, an int beyond 64 bits, another type): the caller then runs its
// checks.
py::object arg_signature(const py::tuple& args) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args.ptr());
  const bool grad_mode = at::GradMode::is_enabled();
  std::string key;
  key.reserve(static_cast<size_t>(n) * 40);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PyTuple_GET_ITEM(args.ptr(), i);
    if (THPVariable_CheckExact(a)) {
      const at::Tensor& t = THPVariable_Unpack(a);
      if (t.layout() != at::kStrided) return py::none();  // sparse, nested: no strides to read
      const int64_t dim = t.dim();
      key += 'T';
      key += static_cast<char>(t.scalar_type());
      key += static_cast<char>(t.device().type());
      key += static_cast<char>(t.device().index());
      key += static_cast<char>(grad_mode && t.requires_grad());
      key += static_cast<char>(dim);
      for (const int64_t s : t.sizes()) append(key, s);
      for (const int64_t s : t.strides()) append(key, s);
    } else if (PyBool_Check(a)) {
      key += a == Py_True ? 'b' : 'B';
    } else if (PyLong_CheckExact(a)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
      if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
      if (overflow != 0) return py::none();
      key += 'I';
      append(key, static_cast<int64_t>(v));
    } else if (PyFloat_CheckExact(a)) {
      key += 'F';
      append(key, PyFloat_AS_DOUBLE(a));
    } else if (a == Py_None) {
      key += 'N';
    } else {
      return py::none();
    }
  }
  return py::bytes(key);
}

}  // namespace tso
