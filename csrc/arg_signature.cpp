// The metadata an op's argument checks read (torch_sampling_ops/_registry.py), as one bytes key, so
// that a call whose arguments match ones already checked skips the Python checks: those cost more
// than a small call's kernel.
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>

#include "signature.h"

namespace tso {

namespace py = pybind11;

// Per argument, the bytes of signature.h. Returns None for anything else (a tensor subclass or
// another layout, an int beyond 64 bits, another type): the caller then runs its checks.
py::object arg_signature(const py::tuple& args) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args.ptr());
  const bool grad_mode = at::GradMode::is_enabled();
  std::string key;
  key.reserve(static_cast<size_t>(n) * 40);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PyTuple_GET_ITEM(args.ptr(), i);
    if (THPVariable_CheckExact(a)) {
      // sparse, nested: no strides to read
      if (!append_tensor_key(key, THPVariable_Unpack(a), grad_mode)) return py::none();
    } else if (PyBool_Check(a)) {
      key += a == Py_True ? 'b' : 'B';
    } else if (PyLong_CheckExact(a)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
      if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
      if (overflow != 0) return py::none();
      append_int_key(key, static_cast<int64_t>(v));
    } else if (PyFloat_CheckExact(a)) {
      append_float_key(key, PyFloat_AS_DOUBLE(a));
    } else if (a == Py_None) {
      key += 'N';
    } else {
      return py::none();
    }
  }
  return py::bytes(key);
}

}  // namespace tso
