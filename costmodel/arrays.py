"""Integer arithmetic on float64 arrays. Configuration columns are float64 (see configs.py);
numpy's float `//` and `%` follow Python's semantics through fmod and are an order of
magnitude slower than a division, so the model uses these instead. Exact for the integers
of this domain (far below 2**26): a rounded quotient cannot cross an integer boundary."""

import numpy as np


def floor_div(a, b):
    return np.floor(a / b)


def divides(a, b):
    """True where a > 0 divides b."""
    a = np.asarray(a, dtype=float)
    safe = np.maximum(a, 1.0)
    return (a > 0) & (b == safe * np.floor(b / safe))


def tune_allocator() -> bool:
    """Keep large temporaries on the heap (glibc): a 64k-element float array is 512 KB, above
    glibc's 128 KB mmap threshold, so every temporary of a batch evaluation would otherwise be
    a fresh mmap whose pages fault in one by one -- about 40% of the model's time. Called by
    the bulk entry points (CLI, search, benchmarks), not on import. Returns False off glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 256 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))
    except (OSError, AttributeError):
        return False


def unique_rows(key: np.ndarray):
    """(representatives, inverse) of an int64 key: one index per distinct key and the map back,
    in O(n) through a dense table when the key space is small, else by sorting."""
    size = int(key.max(initial=0)) + 1
    if size > 8 * len(key) + (1 << 20):
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return first, inverse.ravel()
    present = np.zeros(size, dtype=bool)
    present[key] = True
    codes = np.flatnonzero(present)
    lookup = np.empty(size, dtype=np.int64)
    lookup[codes] = np.arange(len(codes))
    inverse = lookup[key]
    first = np.empty(len(codes), dtype=np.int64)
    first[inverse] = np.arange(len(key))  # any member represents its key
    return first, inverse


def blend(cond, a, b):
    """np.where(cond, a, b) by arithmetic: 3x faster on unpredictable masks. Both branches must
    be finite (0 * inf is NaN)."""
    return b + cond * (a - b)


def argmax_masks(arrays):
    """Float masks, one per array, of which array is largest (ties: the earliest)."""
    best = np.maximum.reduce(arrays)
    taken = np.zeros(np.shape(best), dtype=bool)
    masks = []
    for a in arrays:
        mask = (a >= best) & ~taken
        taken |= mask
        masks.append(mask * 1.0)
    return masks


def pick(masks, arrays):
    """The entries of `arrays` that argmax_masks' masks select."""
    return sum(mask * a for mask, a in zip(masks, arrays))
