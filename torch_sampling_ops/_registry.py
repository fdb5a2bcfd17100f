"""The one helper every op is registered through.

`define_op` is a decorator on an op's typed public function. The function's signature is the op's
one definition: the schema is inferred from it (`torch.library.infer_schema`), and the decorator
returns a function of that signature and docstring that calls `torch.ops.sampling.<name>`. It
registers, for `sampling::<name>`:

- CUDA: argument checks, then the Triton launcher. Registered as a plain dispatcher kernel, which
  keeps the eager cost of a call close to a raw Triton launch. A call whose metadata repeats an
  earlier one's replays that call's launches without running the launcher (`_call_cache`).
- CPU: the C++ kernel of the same name from csrc/, registered for the CPU key in C++
  (csrc/cpu_dispatch.cpp): a call does not enter Python once its argument metadata passed the
  checks, which it gets from here. Without the extension, a Python kernel that says it is missing.
- fake (meta): argument checks, then the outputs' shapes (nothing for ops that return nothing), for
  torch.compile and export.
Every implementation also checks what no op supports: an input that requires grad under grad mode
(the ops are not differentiable: a silent wrong gradient otherwise), and a mutated tensor whose rows
share memory (`expand`, overlapping strides: a kernel would process them several times). The CPU
and CUDA ones bump the version counter of every mutated tensor, as PyTorch's in-place ops do. These
checks sit in the kernels rather than in an Autograd kernel of their own, which would cost every
eager call one more trip through the dispatcher. The CPU and CUDA ones remember the argument
metadata that passed (the same key: `_C.arg_signature` for CUDA, its C++ twin for CPU) and skip
the checks for a call that repeats it.

Under torch.compile the CUDA body is also traced into the graph as Triton kernel nodes, as
`torch.library.triton_op` does: a FunctionalTensorMode rule runs the launcher with `wrap_triton`,
so Inductor sees (and can place and reinplace) the kernels instead of an opaque call. On other
devices, and for torch.export, the op stays one opaque node.

Triton launchers call `launch(kernel, grid, ...)`, never `kernel[grid](...)`, so that one body
serves both the eager path and the traced path. Their Python bodies are also reachable through
`triton_impl(name)`, which the tests use to run the kernels on CPU tensors under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence

import torch
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.library import wrap_triton

from . import _call_cache, _checks, _launch

LIB = torch.library.Library("sampling", "DEF")

_TRITON_IMPLS: dict[str, Callable] = {}
_trace_triton = False


def launch(kernel, grid, *args, **meta) -> None:
    """Launches a Triton kernel, as a traceable graph node while torch.compile traces the op; in eager
    mode through the launcher cache of `_launch`, which binds each kernel specialisation once."""
    if _trace_triton:
        wrap_triton(kernel)[grid](*args, **meta)
    else:
        _launch.launch(kernel, grid, args, meta)


@contextlib.contextmanager
def _tracing_triton():
    global _trace_triton
    previous, _trace_triton = _trace_triton, True
    try:
        yield
    finally:
        _trace_triton = previous


def _inline_under_compile(op, args) -> bool:
    """Whether torch.compile traces the op's kernels (CUDA) or keeps the op as one node. A call with
    a tensor at a nonzero storage offset stays one node: Inductor's mutation analysis flags every
    kernel argument whose loaded values address a store (index lists, counts, slots), and Inductor
    (2.11) clones such an argument through its base storage read from the view's own data pointer,
    so a view that does not start its storage would be given, and written back, another part of it."""
    from torch.export._trace import custom_triton_ops_decomposition_disabled

    first = args[0]
    return (isinstance(first, torch.Tensor) and first.device.type == "cuda"
            and not custom_triton_ops_decomposition_disabled()
            and not any(isinstance(a, torch.Tensor) and a.storage_offset() != 0 for a in args))


def _functional_rule(mode, op, types, args, kwargs):
    if _inline_under_compile(op, args):
        with mode, _tracing_triton():
            return _TRITON_IMPLS[op._opname](*args, **kwargs)
    return mode.__torch_dispatch__(op, types, args, kwargs)


# The checks read only metadata: the arguments' types, the tensors' dtypes, devices, sizes and
# strides, whether they require grad under grad mode, and the other arguments' values. A call
# whose metadata (`_C.arg_signature`, one bytes key) matches one already checked skips them; they
# cost more than a small call's kernel. Plain tensors and Python scalars only (a tensor subclass,
# a FakeTensor, any other argument gives no key and is checked every time).
_MAX_SIGNATURES = 4096  # signatures remembered an op (then forgotten at once)


def _no_signature(args) -> None:
    return None


def _load_arg_signature() -> Callable:
    try:
        from ._C import arg_signature
    except ImportError:  # the extension is not built: every call is checked
        return _no_signature
    return arg_signature


_arg_signature = _load_arg_signature()


def _load_cpu_registration() -> Callable | None:
    """`_C.register_cpu_checks` when the extension is built: its C++ CPU kernels are then registered
    for the CPU dispatch key in C++ (csrc/cpu_dispatch.cpp) and get their Python checks from here."""
    try:
        from ._C import register_cpu_checks
    except ImportError:
        return None
    return register_cpu_checks


_register_cpu_checks = _load_cpu_registration()
_cpu_checks: dict[str, Callable] = {}  # the checks each op's C++ CPU kernel runs


def _cpu_kernel(name: str) -> Callable:
    kernel = None  # the C++ function, looked up on the first call (the extension may be missing)

    def run(*args, **kwargs):
        nonlocal kernel
        if kernel is None:
            try:
                from . import _C
            except ImportError as e:
                raise RuntimeError(
                    "torch_sampling_ops: the C++ CPU kernels are not built; reinstall with "
                    "`pip install --no-build-isolation -e .`") from e
            kernel = getattr(_C, name)
        return kernel(*args, **kwargs)

    run.__name__ = "cpu"
    return run


def define_op(
    *,
    mutates_args: Sequence[str],
    check: Callable[..., None],
    triton: Callable,
    fake: Callable | None = None,
    check_values: Callable[..., None] | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator: defines `sampling::<fn.__name__>` from the typed signature of `fn` and registers
    its implementations; returns the public function, which calls the op.

    mutates_args: the names of the tensors the op writes in place.
    check(*args): metadata checks, raising TypeError/ValueError before anything runs.
    triton(*args): the Triton launcher, called after `check`. The CPU kernel is the C++
        `sampling::<name>` kernel of csrc/cpu_dispatch.cpp, which calls `check` itself.
    fake(*args): outputs for fake tensors; omit for ops that return nothing.
    check_values(*args): value checks run on real tensors when debug checks are on
        (TORCH_SAMPLING_OPS_DEBUG=1 at import, or `set_debug_checks(True)`).
    """

    def register(fn: Callable) -> Callable:
        name = fn.__name__
        LIB.define(name + torch.library.infer_schema(fn, mutates_args=mutates_args))
        op = getattr(torch.ops.sampling, name).default
        arg_names = [a.name for a in op._schema.arguments]
        mutated = [i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]

        passed: set[bytes] = set()  # argument signatures (`_arg_signature`) whose checks passed

        def metadata_checks(args) -> None:
            _checks.check_no_grad(name, arg_names, args)
            check(*args)
            for i in mutated:
                _checks.check_rows_do_not_overlap(name, arg_names[i], args[i])

        def checked(body: Callable | None, real: bool, calls: _call_cache.Cache | None = None) -> Callable:
            def run(*args, **kwargs):
                if kwargs:  # positional from here on, in the schema's order
                    args = (*args, *(kwargs[n] for n in arg_names[len(args):]))
                key = _arg_signature(args) if real else None
                if key is None or key not in passed:
                    metadata_checks(args)
                    if key is not None:
                        if len(passed) >= _MAX_SIGNATURES:
                            passed.clear()
                        passed.add(key)
                if real:
                    if check_values is not None and _checks._DEBUG:
                        check_values(*args)
                    # As PyTorch's in-place ops do: autograd and views see that the tensor changed.
                    for i in mutated:
                        if not args[i].is_inference():  # an inference tensor has no version counter
                            torch.autograd.graph.increment_version(args[i])
                    if calls is not None and key is not None and _call_cache.enabled():
                        return calls.call(body, args, key)
                return body(*args) if body is not None else None

            run.__name__ = f"{name}_{getattr(body, '__name__', 'fake')}"
            return run

        def cpu_checks(*args):
            """The checks of a CPU call, run by its C++ kernel for metadata not seen yet (and on every
            call with debug checks on); the kernel bumps the version counters itself."""
            metadata_checks(args)
            if check_values is not None and _checks._DEBUG:
                check_values(*args)

        _TRITON_IMPLS[name] = checked(triton, real=False)
        LIB.impl(name, checked(triton, real=True, calls=_call_cache.Cache()), "CUDA")
        if _register_cpu_checks is not None:
            _cpu_checks[name] = cpu_checks
            _register_cpu_checks(name, cpu_checks, mutated)
        else:  # the extension is not built: a CPU call says so
            LIB.impl(name, checked(_cpu_kernel(name), real=True), "CPU")
        torch.library.register_fake(f"sampling::{name}", checked(fake, real=False), lib=LIB)
        torch.library.register_torch_dispatch(f"sampling::{name}", FunctionalTensorMode, _functional_rule, lib=LIB)

        @functools.wraps(fn)
        def public(*args, **kwargs):
            return op(*args, **kwargs)

        return public

    return register


def triton_impl(name: str) -> Callable:
    """The checked Triton body of op `name`, callable on CPU tensors under TRITON_INTERPRET=1."""
    return _TRITON_IMPLS[name]
