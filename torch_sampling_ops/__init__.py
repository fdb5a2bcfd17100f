"""LLM sampling steps as torch.library custom ops (namespace ``sampling``).

Each op is callable as ``torch.ops.sampling.<name>`` and through the wrapper of the same name
here; CUDA runs Triton kernels, CPU runs the C++ kernels of csrc/, and every op has a fake
implementation for torch.compile. ``torch_sampling_ops.reference`` holds the float64 semantics.
"""
from . import reference, state
from ._checks import set_debug_checks
from ._warmup import precompile, warmup
from .constraints import apply_token_bitmask, logit_bias
from .filtering import min_p, temperature
from .history import bad_words, penalties, update_output_counts
from .sampler import Sampler, SamplerOutput, SamplingParams
from .sampling import logprobs, sample
from .speculative import rejection_sample
from .truncation import top_k_top_p

__all__ = [
    "Sampler", "SamplerOutput", "SamplingParams", "apply_token_bitmask", "bad_words", "logit_bias", "logprobs",
    "min_p", "penalties", "precompile", "reference", "rejection_sample", "sample", "set_debug_checks", "state",
    "temperature", "top_k_top_p", "update_output_counts", "warmup",
]
__version__ = "0.1.0"
