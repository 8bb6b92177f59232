"""Memoisation for pure functions the compiler asks again and again (fit.choose_forms lowers a
model tens of times, each time with the same weights and ranges)."""
from __future__ import annotations

import copy
import functools

MEMO_SIZE = 4096      # entries kept per function; the dict is cleared when it is full


def memoised(key):
    """f memoised on key(*args) (hashable, holding everything f reads); callers get a deep copy,
    theirs to keep or change."""
    def wrap(f):
        memo = {}

        @functools.wraps(f)
        def cached(*args):
            k = key(*args)
            if k not in memo:
                if len(memo) >= MEMO_SIZE:
                    memo.clear()
                memo[k] = f(*args)
            return copy.deepcopy(memo[k])
        return cached
    return wrap
