"""Float keys and interval rounds, shared by the selection and the general path.

A float32's key is a uint32 that orders like the value (_float_key), so a range of values is an
interval of keys. An interval round cuts the key interval still holding the answer into at most 16
parts, sums a statistic per part (a count, or a mass relative to the row max) and keeps the one
part holding the answer; the values of a part can then be compacted (_compact_tile). Integer
operations only on the keys: subnormals and ranges past float32 arithmetic keep exact keys.
"""
import triton
import triton.language as tl

from .settings import _SWEEP_GROUP


@triton.jit
def _float_key(x):
    """uint32 keys that order like the float32 values (x not NaN; -0.0 counts as +0.0). Integer
    operations only: subnormals keep their own keys even where float arithmetic flushes them."""
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0
    signed = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (signed ^ -2147483648).to(tl.uint32, bitcast=True)


@triton.jit
def _key_value(key):
    """The float32 whose key is `key` (the inverse of _float_key); NaN patterns give -inf."""
    signed = key.to(tl.int32, bitcast=True) ^ -2147483648
    x = (signed ^ ((signed >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    return tl.where(x == x, x, float("-inf"))


@triton.jit
def _is_finite(x):
    return (x > float("-inf")) & (x < float("inf"))  # NaN is not


@triton.jit
def _in_interval(values, present, low, high):
    """Which values are present with keys in [low, high]."""
    key = _float_key(values)
    return present & (key >= low) & (key <= high)


@triton.jit
def _part_shift(low, high):
    """The shift that cuts the key interval [low, high] into at most 16 parts of 2^shift keys."""
    top = ((high - low).to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127  # rounding up only widens
    return tl.maximum(top - 3, 0).to(tl.uint32)


@triton.jit
def _part_starts(low, high, widen):
    """The keys where a round's 16 parts of [low, high] start ([16] uint32; a part starting at
    high + 1 is empty): 2^shift keys each, the fewest that cover the interval; or, with widen,
    j (j + 8) / 8 sixty-fourths of it for part j, widening from 1/64. A list's candidates crowd
    above its floor: on randn * 3 rows at p = 0.9 the answer's part then holds about 460 of 9 600
    candidates, a tile's worth, against about 2 100 in equal parts."""
    j = tl.arange(0, 16).to(tl.uint32)
    span = high - low  # uint32 throughout: keys stay below 0xFF800001 (+inf), 15 << 28 fits
    size = span + 1
    c = j * (j + 8) // 8
    widening = (size >> 6) * c + (((size & 63) * c) >> 6)  # floor(size * c / 64)
    offset = tl.where(widen, widening, j << _part_shift(low, high))
    return tl.where(offset <= span, low + offset, high + 1)


@triton.jit
def _interval_partials(values, present, low, high, starts, row_max, USE_MASS: tl.constexpr, GROUP: tl.constexpr):
    """For the values whose keys lie in [low, high], in the parts starting at `starts`: per part
    j < 16, the count of those in parts >= j, or with USE_MASS their mass relative to row_max, as
    [16, N / GROUP] sums over GROUP consecutive values each. With GROUP the values a thread holds,
    those sums stay in the thread's registers, so a sweep adds tiles up without any reduction
    across threads."""
    # [16, ...], not [..., 16]: Triton then spreads the values over the lanes as they were loaded
    # and keeps the 16 parts in each lane's registers (the other way round, it copies every value
    # to 16 lanes through shared memory).
    n: tl.constexpr = values.shape[0]
    shape: tl.constexpr = [1, n // GROUP, GROUP]
    at_least = tl.reshape(_float_key(values), shape) >= starts[:, None, None]
    inside = _in_interval(values, present, low, high)
    if USE_MASS:
        mass = tl.where(inside, tl.exp(values - row_max), 0.0)
        return tl.sum(tl.where(at_least, tl.reshape(mass, shape), 0.0), axis=2)
    else:
        return tl.sum((at_least & tl.reshape(inside, shape)).to(tl.int32), axis=2)


@triton.jit
def _interval_stats(values, present, low, high, starts, row_max, USE_MASS: tl.constexpr):
    """_interval_partials summed over all the values: [16]."""
    return tl.sum(_interval_partials(values, present, low, high, starts, row_max, USE_MASS, 1), axis=1)


@triton.jit
def _interval_round(high, starts, above, stat, target):
    """Narrows the key interval [starts[0], high] to its highest part d whose tokens (with those
    above the interval) reach target. Returns the new interval, the stat above it and d."""
    j = tl.arange(0, 16)
    d = tl.max(tl.where(above + stat >= target, j, 0))
    above += tl.sum(tl.where(j == d + 1, stat, 0))
    new_low = tl.sum(tl.where(j == d, starts, 0))
    new_high = tl.where(d == 15, high, tl.sum(tl.where(j == d + 1, starts, 0)) - 1)
    return new_low, new_high, above, d


@triton.jit
def _part_count(counts, d):
    """Tokens in part d, from the counts of the tokens in parts >= j (_interval_stats)."""
    j = tl.arange(0, 16)
    return tl.sum(tl.where(j == d, counts, 0)) - tl.sum(tl.where(j == d + 1, counts, 0))


@triton.jit
def _compact_tile(values, present, low, high, dst_ptr, base, cap):
    """Stores the values of a tile whose keys lie in [low, high] at dst[base:], in order (at most
    cap in all); returns base + how many."""
    # As [threads, the values a thread holds]: a scan within each thread, then one over the
    # threads' counts, in the layout the values were loaded in. (A scan of the [TILE] tile takes a
    # layout of one value a thread, and its store then converts every operand through shared
    # memory, with more instructions and block barriers a tile.)
    n: tl.constexpr = values.shape[0]
    shape: tl.constexpr = [n // _SWEEP_GROUP, _SWEEP_GROUP]
    inside = tl.reshape(_in_interval(values, present, low, high).to(tl.int32), shape)
    per_thread = tl.sum(inside, axis=1)
    slot = (base + tl.cumsum(per_thread, axis=0) - per_thread)[:, None] + tl.cumsum(inside, axis=1) - 1
    tl.store(dst_ptr + slot, tl.reshape(values, shape), mask=(inside != 0) & (slot < cap))
    return base + tl.sum(per_thread, axis=0)

