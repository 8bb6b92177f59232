"""argparse types for numeric and list flags: a bad value is an argparse error (usage line,
exit 2) that names the flag, the accepted range and an example; never a traceback later."""
from __future__ import annotations

import argparse
import math


def _number(text, kind, example):
    try:
        v = kind(str(text).strip(), 0) if kind is int else kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. {example})") from None
    if kind is float and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number (e.g. {example})")
    return v


def int_range(lo=None, hi=None, example=None):
    example = example if example is not None else (lo if lo is not None else 0)

    def parse(text):
        v = _number(text, int, example)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is out of range: use {_span(lo, hi)} (e.g. {example})")
        return v
    parse.__name__ = "integer"
    return parse


def float_range(lo=None, hi=None, example=None, lo_open=False, hi_open=False):
    example = example if example is not None else (lo if lo is not None else 0)

    def parse(text):
        v = _number(text, float, example)
        low = lo is not None and (v < lo or (lo_open and v == lo))
        high = hi is not None and (v > hi or (hi_open and v == hi))
        if low or high:
            parts = ([f"{'>' if lo_open else '>='} {lo}"] if lo is not None else []) + \
                    ([f"{'<' if hi_open else '<='} {hi}"] if hi is not None else [])
            span = _span(lo, hi) if not (lo_open or hi_open) else " and ".join(parts)
            raise argparse.ArgumentTypeError(f"{text} is out of range: use {span} (e.g. {example})")
        return v
    parse.__name__ = "number"
    return parse


def _span(lo, hi):
    if lo is not None and hi is not None:
        return f"{lo}..{hi}"
    return f">= {lo}" if lo is not None else f"<= {hi}"


probability = float_range(0.0, 1.0, example=0.5)


def address(text):
    """A flash address: decimal or 0x-hex, >= 0."""
    v = _number(text, int, "0x300000")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; flash addresses start at 0 (e.g. 0x300000)")
    return v


def floats(positive=False, count=None, example="0.5,1.0"):
    """Comma-separated finite numbers (all > 0 with `positive`)."""
    def parse(text):
        try:
            vals = tuple(float(v) for v in str(text).split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated numbers, e.g. {example}") from None
        if not all(math.isfinite(v) for v in vals):
            raise argparse.ArgumentTypeError(f"{text!r}: numbers must be finite (e.g. {example})")
        if positive and any(v <= 0 for v in vals):
            raise argparse.ArgumentTypeError(f"{text!r}: values must be positive (e.g. {example})")
        if count is not None and len(vals) not in count:
            raise argparse.ArgumentTypeError(f"{text!r}: give {' or '.join(map(str, count))} values "
                                             f"(e.g. {example})")
        return vals
    parse.__name__ = "numbers"
    return parse


def shape(text):
    """N,C,H,W (or any rank) of positive integers."""
    try:
        dims = tuple(int(v) for v in str(text).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 1,3,224,224") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"{text!r}: every dimension must be a positive integer "
                                         "(e.g. 1,3,224,224)")
    return dims


def choices_list(allowed, example):
    """Comma-separated names, each one of `allowed`."""
    def parse(text):
        names = tuple(n.strip() for n in str(text).split(",") if n.strip())
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)} "
                                             f"(e.g. {example})")
        return names
    parse.__name__ = "list"
    return parse
