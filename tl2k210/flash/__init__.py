"""Deployment to Kendryte K210 boards: SLIP/ISP protocol, board presets, .kfpkg packages,
the serial flasher and an emulated board for tests.

Layering (protocol != transport != board):
  slip.py      byte stuffing, nothing else
  isp.py       the ROM (stage 1) and stub (stage 2) packet formats: opcodes, reasons, CRC
  image.py     the address-0 firmware envelope (flag, length, payload, SHA-256)
  boards.py    DTR/RTS reset sequences and flash sizes per board, as data
  stub.py      loads the stage-2 flash program from the installed ``kflash`` package
  kfpkg.py     .kfpkg read (tolerant, safe) and write (kflash-compatible)
  transport.py opening ports, the DTR/RTS line shim used with emulated boards
  flasher.py   Flasher / flash_images() with retries, resync, progress and verification
  emulated_board.py  bootrom + stub + 16 MiB flash file behind a pty (or an in-process
               LoopbackPort), with line throttling and seeded fault injection
  trials.py    side-by-side runs of tl2k210 and stock kflash on emulated boards (tests, bench)
  cli.py       the verbs flash, package, deploy, board
  shim/        sitecustomize.py routing an unmodified subprocess's DTR/RTS to an emulated board
"""
