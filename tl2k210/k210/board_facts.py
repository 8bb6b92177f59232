"""THE single source of K210 board facts beyond the KPU (hardware.py holds the KPU's): the SoC's
SRAM, the boards' SPI flash and the map MaixPy lays on it, and the serial rates the ROM and the
REPL start at. The flasher, the package writer, the emulated boards, the host MaixPy and the
compiler's budgets read them here; no second copy of these numbers anywhere.

Described in docs/flash-protocol.md#maixpy-flash-map, #baud-rates, #maixpy-repl and docs/kpu.md#memories.
"""
MIB = 1024 * 1024

# memories of the K210
SRAM_BYTES = 8 * MIB                  # 6 MiB general SRAM + 2 MiB AI (KPU) SRAM
SRAM_START = 0x8000_0000
GENERAL_SRAM_BYTES = 6 * MIB          # what the ROM copies a firmware to, and what the CPU allocates from

# the SPI flash of every Sipeed K210 board (Maix Bit/Dock/Go, Maixduino, M5StickV)
FLASH_BYTES = 16 * MIB
FLASH_SECTOR = 4096                   # the erase unit: a write erases whole sectors

# MaixPy's map of that flash
FIRMWARE_REGION_END = 0x200000        # the firmware lives below this
MAIXPY_MODEL_AREA = 0x300000          # where MaixPy's examples and packages put a kmodel
SPIFFS_START = 0xD00000               # the /flash filesystem (CONFIG_SPIFFS_START_ADDR)
SPIFFS_SIZE = 0x300000

# serial rates
ROM_BAUD = 115200                     # the ROM ISP always starts at 115200 8N1
REPL_BAUD = 115200                    # MaixPy's REPL on UARTHS at power-on
UART_DEFAULT_BAUD = 115200            # machine.UART(...) without a baudrate
