"""Where images may go in a MaixPy board's flash: the rules `flash`, `package`, `deploy` and the
package reader apply, written once. The addresses themselves are board facts
(tl2k210.k210.board_facts)."""
from tl2k210.errors import Tl2k210Error
from tl2k210.k210.board_facts import FIRMWARE_REGION_END, FLASH_SECTOR, MAIXPY_MODEL_AREA, SPIFFS_SIZE, SPIFFS_START

FIRMWARE_MARK = b"MaixPy"       # in the banner and the module names of every MaixPy build


def in_firmware_region(address) -> bool:
    return address < FIRMWARE_REGION_END


def overlaps_spiffs(address, end) -> bool:
    return end > SPIFFS_START and address < SPIFFS_START + SPIFFS_SIZE


def address_warnings(images):
    """Warnings for raw images where MaixPy users lose data: inside the firmware region, in the
    SPIFFS /flash filesystem, or not 4 KiB aligned (the erase unit; kflash's erase and Sipeed's
    kflash fork require it, docs/flash-protocol.md#flash-write-chunking). A package whose image at
    0 is another firmware (LoBo MicroPython, a standalone-SDK program: no "MaixPy" in it) lays out
    the flash its own way: only the alignment is checked."""
    out = []
    other = any(i.address == 0 and FIRMWARE_MARK not in bytes(i.data) for i in images)
    for i in images:
        if i.envelope and i.address == 0:
            continue                        # the firmware itself
        if other:
            pass
        elif in_firmware_region(i.address):
            out.append(f"{i.name} at 0x{i.address:x} is inside the MaixPy firmware region "
                       f"(0..0x{FIRMWARE_REGION_END:x}) and will overwrite the firmware; models "
                       f"usually go at 0x{MAIXPY_MODEL_AREA:x}")
        elif overlaps_spiffs(i.address, i.end):
            out.append(f"{i.name} (0x{i.address:x}..0x{i.end:x}) overlaps the SPIFFS /flash "
                       f"filesystem at 0x{SPIFFS_START:x}; MaixPy may reformat it (and lose the "
                       "image) or the image destroys /flash")
        if i.address % FLASH_SECTOR:
            out.append(f"{i.name} at 0x{i.address:x} is not 4 KiB aligned: the flash erases whole "
                       f"4 KiB sectors, so the bytes from 0x{i.address - i.address % FLASH_SECTOR:x} "
                       "before it are erased too, and kflash's erase / Sipeed's kflash need aligned "
                       "addresses")
    return out


def check_model_address(address, size, force):
    """Refuse addresses that would overwrite MaixPy's firmware or its /flash filesystem."""
    if in_firmware_region(address) and not force:
        raise Tl2k210Error(f"address 0x{address:x} is inside the MaixPy firmware region "
                           f"(0..0x{FIRMWARE_REGION_END:x}); use 0x{MAIXPY_MODEL_AREA:x} (MaixPy's model area) "
                           "or pass --force if you really mean it")
    if overlaps_spiffs(address, address + size) and not force:
        raise Tl2k210Error(f"the model (0x{address:x}..0x{address + size:x}) runs into the SPIFFS "
                           f"/flash filesystem at 0x{SPIFFS_START:x}; pick a lower address or "
                           "pass --force")
