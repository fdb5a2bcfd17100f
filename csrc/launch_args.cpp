// The key and launcher arguments of an eager Triton launch (torch_sampling_ops/_launch.py), in one
// pass over the positional arguments: the Python version of the same loop costs more than the
// launch it prepares.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>

namespace tso {

namespace py = pybind11;

// Per argument, the key gets what Triton specialises on, plus the tensor's device:
//   tensor: 'T', dtype, device type, device index, '1' if the data pointer is 16-byte aligned else
//   '0'; int: 'I', then '1' (== 1), 'i' (int32 range), 'l' (int64 range) or 'u' (uint64 range),
//   then
//        '1' if divisible by 16 else '0';
//   bool 'B', float 'F', None 'N'.
// The launcher gets tensors as their data pointers (Python ints) and the other arguments as they
// are. Returns None for any other argument type (the caller then takes Triton's plain path).
py::object bind_launch_args(const py::tuple& args) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args.ptr());
  std::string key;
  key.reserve(static_cast<size_t>(n) * 6);
  py::tuple call(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PyTuple_GET_ITEM(args.ptr(), i);
    if (THPVariable_CheckExact(a)) {
      const at::Tensor& t = THPVariable_Unpack(a);
      if (!t.has_storage()) return py::none();
      const auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
      key += 'T';
      key += static_cast<char>(t.scalar_type());
      key += static_cast<char>(t.device().type());
      key += static_cast<char>(t.device().index());
      key += (p & 15) == 0 ? '1' : '0';
      PyObject* ptr = PyLong_FromUnsignedLongLong(p);
      if (ptr == nullptr) throw py::error_already_set();
      PyTuple_SET_ITEM(call.ptr(), i, ptr);
      continue;
    }
    if (PyBool_Check(a)) {
      key += 'B';
    } else if (PyLong_CheckExact(a)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
      if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
      key += 'I';
      if (overflow == 0) {
        key += v == 1 ? '1' : (v >= INT32_MIN && v <= INT32_MAX) ? 'i' : 'l';
        key += (v & 15) == 0 ? '1' : '0';
      } else {
        const unsigned long long u = PyLong_AsUnsignedLongLong(a);
        if (PyErr_Occurred()) {  // outside the uint64 range: Triton rejects it on its plain path
          PyErr_Clear();
          return py::none();
        }
        key += 'u';
        key += (u & 15) == 0 ? '1' : '0';
      }
    } else if (a == Py_None) {
      key += 'N';
    } else if (PyFloat_CheckExact(a)) {
      key += 'F';
    } else {
      return py::none();
    }
    Py_INCREF(a);
    PyTuple_SET_ITEM(call.ptr(), i, a);
  }
  return py::make_tuple(py::bytes(key), call);
}

}  // namespace tso
