"""Plain-text tables for the CLI reports (inspect, convert receipt, zoo list)."""


def text_table(cols, rows, rule: bool = True) -> list[str]:
    """Left-aligned columns two spaces apart; an underline of dashes under the header if `rule`."""
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]

    def line(row):
        return "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()
    return [line(cols)] + ([line(["-" * w for w in widths])] if rule else []) + [line(r) for r in rows]
