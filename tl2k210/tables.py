"""Plain-text tables for the CLI reports (inspect, convert receipt, zoo list), and `printable`
for any text from a file that they show."""
import re


def text_table(cols, rows, rule: bool = True) -> list[str]:
    """Left-aligned columns two spaces apart; an underline of dashes under the header if `rule`."""
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]

    def line(row):
        return "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()
    return [line(cols)] + ([line(["-" * w for w in widths])] if rule else []) + [line(r) for r in rows]


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text) -> str:
    """Text that came from a file (a label, a package member's name), safe to print: control
    characters -- terminal escape sequences, newlines, bidi overrides -- are shown escaped, as
    Python writes them (\\x1b, \\n, \\u202e)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))
