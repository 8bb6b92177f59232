"""Board presets: how DTR/RTS reach RESET and IO16 (BOOT), as data (docs/flash-protocol.md#board-reset-wiring).

pyserial's ``dtr=True`` / ``rts=True`` means *asserted*: the TTL pin is electrically low. Each
sequence is a list of steps; a step sets lines in the listed order, then holds for ``STEP_S``.
"""
from dataclasses import dataclass

from tl2k210.k210.board_facts import FLASH_BYTES, ROM_BAUD

STEP_S = 0.1                 # kflash holds every state for 100 ms
GREETING_TIMEOUT_S = 0.5     # ROM greeting reply timeout (kflash 1.1.6)
FLASH_SIZE_16M = FLASH_BYTES

# (line, asserted) pairs per step
_DAN_ISP = [[("dtr", False), ("rts", False)], [("dtr", False), ("rts", True)],
            [("rts", False), ("dtr", True)]]
_DAN_BOOT = [[("dtr", False), ("rts", False)], [("dtr", False), ("rts", True)],
             [("rts", False), ("dtr", False)]]
_KD233_ISP = [[("dtr", False), ("rts", False)], [("dtr", True), ("rts", False)],
              [("rts", True), ("dtr", False)]]
_KD233_BOOT = [[("dtr", False), ("rts", False)], [("dtr", True), ("rts", False)],
               [("rts", False), ("dtr", False)]]
_GOD_ISP = [[("dtr", True), ("rts", True)], [("rts", False), ("dtr", True)],
            [("rts", False), ("dtr", True)]]
_GOD_BOOT = [[("dtr", False), ("rts", False)], [("rts", False), ("dtr", True)],
             [("rts", True), ("dtr", True)]]


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    isp_sequence: list
    boot_sequence: list
    reset_line: str = None        # which modem line drives RESET (None: unknown wiring)
    boot_line: str = None         # which drives IO16
    aliases: tuple = ()
    flash_size: int = FLASH_SIZE_16M
    max_baud: int = 2_000_000
    notes: str = ""


BOARDS = {b.name: b for b in [
    Board("dan", "Maix Dock (Dan Dock), Maix Bit without mic (CH340), K210 Trainer",
          _DAN_ISP, _DAN_BOOT, reset_line="rts", boot_line="dtr", aliases=("bit", "trainer")),
    Board("kd233", "Kendryte KD233 (auto-download jumper fitted)",
          _KD233_ISP, _KD233_BOOT, reset_line="dtr", boot_line="rts"),
    Board("bit_mic", "Maix Bit with mic / Bit 2.0 / M1n (CH552)",
          _KD233_ISP, _KD233_BOOT, reset_line="dtr", boot_line="rts", max_baud=1_500_000,
          notes="CH552 bridges are reported unreliable above 1.5 Mbaud"),
    Board("goE", "Maix Go (open-ec / new CMSIS-DAP), Maixduino, M5StickV, Maix Amigo/Cube/Nano",
          _KD233_ISP, _KD233_BOOT, reset_line="dtr", boot_line="rts",
          aliases=("maixduino", "m5stickv", "amigo", "cube", "nano"),
          notes="the K210 UART is usually the second of the two ports"),
    Board("goD", "Maix Go with old CMSIS-DAP firmware (before 2019-02-21)",
          _GOD_ISP, _GOD_BOOT),
    Board("manual", "no auto-reset wiring: hold BOOT (IO16) low and press RESET yourself",
          [], []),
]}

# Baud rates of the stage-2 transfer (-b). The ROM ISP always runs at 115200 8N1 (docs/flash-protocol.md#baud-rates):
# no K210 tool goes below it. Each board's `max_baud` is what its USB-serial bridge is rated for:
# the WCH CH340 does 50 bps..2 Mbps (CH340 datasheet), the CH552 bridge firmware of the Maix Bit
# with mic is reported unreliable above 1.5 Mbaud (docs/flash-protocol.md#baud-rates), and the FT2232 boards are driven
# like the others (kflash's open-ec "super baudrate" mapping, docs/flash-protocol.md#baud-rates, is not implemented).
MIN_BAUD = ROM_BAUD
MAX_BAUD = max(b.max_baud for b in BOARDS.values())

# kflash 1.1.6 auto-detection order (dan -> kd233 -> goD -> kd233)
AUTODETECT_ORDER = ("dan", "kd233", "goD", "kd233")


def board_names():
    names = []
    for b in BOARDS.values():
        names.append(b.name)
        names.extend(b.aliases)
    return names


def get_board(name: str) -> Board:
    """Look a board up by name or alias (case-insensitive)."""
    key = name.strip().lower()
    for b in BOARDS.values():
        if key == b.name.lower() or key in (a.lower() for a in b.aliases):
            return b
    from tl2k210.flash.errors import FlashError
    raise FlashError("unknown board %r; known boards: %s" % (name, ", ".join(board_names())))
