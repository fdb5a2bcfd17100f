"""Every Triton kernel variant the ops launch on the op table's arguments compiles for sm_90 with the
installed Triton, without a GPU (.ci/compile_check.py, in a process of its own: under
TRITON_INTERPRET=1 the kernels are interpreted, not compiled)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_kernel_variant_compiles_for_hopper():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(ROOT / ".ci" / "compile_check.py")], capture_output=True, text=True,
                          env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
