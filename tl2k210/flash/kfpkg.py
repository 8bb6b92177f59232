"""``.kfpkg`` packages and ``FILE@ADDR`` image arguments.

A kfpkg is a ZIP with ``flash-list.json`` plus the referenced binaries (docs/flash-protocol.md#kfpkg). The reader is
tolerant of real manifests (hex literals such as ``"address": 0x300000,``, which kflash accepts)
and safe: it rejects path traversal, duplicate or overlapping ranges, images beyond the flash
and absurd sizes. The writer emits what kflash's line-based regex reader also accepts:
pretty-printed JSON, one key per line, ``address`` first, decimal addresses.
"""
import io
import json
import os
import posixpath
import re
import zipfile
from dataclasses import dataclass

from tl2k210.flash import image as fw_image
from tl2k210.flash.boards import FLASH_SIZE_16M
from tl2k210.fileio import atomic_write
from tl2k210.flash.errors import KfpkgError
from tl2k210.tables import printable

MANIFEST = "flash-list.json"
MAX_MANIFEST_BYTES = 1024 * 1024
MAX_ENTRIES = 64
_HEX_VALUE_RE = re.compile(r'(:\s*)(0[xX][0-9a-fA-F]+)(\s*[,}\n])')


@dataclass
class FlashImage:
    """One thing to write: ``data`` at flash ``address``; ``envelope`` wraps it for the ROM."""
    address: int
    data: bytes
    envelope: bool
    name: str = ""
    source: str = ""

    def flash_bytes(self) -> bytes:
        return fw_image.wrap(self.data) if self.envelope else bytes(self.data)

    @property
    def flash_size(self) -> int:
        return len(self.data) + (fw_image.ENVELOPE_OVERHEAD if self.envelope else 0)

    @property
    def end(self) -> int:
        return self.address + self.flash_size


def parse_address(text) -> int:
    if isinstance(text, bool):
        raise KfpkgError(f"address {text!r} is not a number")
    if isinstance(text, int):
        value = text
    else:
        try:
            value = int(str(text).strip(), 0)
        except ValueError:
            raise KfpkgError(f"address {text!r} is not a number (use decimal or 0x-hex, "
                             "e.g. 0x300000)") from None
    if value < 0:
        raise KfpkgError(f"address {text!r} is negative")
    return value


def check_layout(images, flash_size=FLASH_SIZE_16M, where="images"):
    """Reject empty images, images beyond the flash and overlapping ranges."""
    for img in images:
        if img.flash_size == 0:
            raise KfpkgError(f"{img.name or img.source}: empty image")
        if img.end > flash_size:
            raise KfpkgError(
                f"{img.name or img.source}: 0x{img.address:x}..0x{img.end:x} ends beyond the "
                f"{flash_size // (1024 * 1024)} MiB flash (0x{flash_size:x}); pick a lower address")
    ordered = sorted(images, key=lambda i: i.address)
    for a, b in zip(ordered, ordered[1:]):
        if b.address < a.end:
            raise KfpkgError(
                f"{where}: {a.name or a.source} (0x{a.address:x}..0x{a.end:x}) overlaps "
                f"{b.name or b.source} (0x{b.address:x}..0x{b.end:x}); move one of them (pick "
                f"an address from 0x{-(-a.end // 4096) * 4096:x} for {b.name or b.source})")


def parse_manifest(text: str):
    """Parse flash-list.json text into a list of dicts with an int ``address``."""
    try:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            try:
                doc = json.loads(_HEX_VALUE_RE.sub(
                    lambda m: f'{m.group(1)}"{m.group(2)}"{m.group(3)}', text))
            except json.JSONDecodeError as exc:
                raise KfpkgError(f"{MANIFEST} is not valid JSON: {exc}") from None
    except RecursionError:
        raise KfpkgError(f"{MANIFEST} is nested too deeply to be a kfpkg manifest (a list of "
                         '{"address", "bin"} objects); the package is corrupt: download or rebuild it') from None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        raise KfpkgError(f'{MANIFEST} must be an object with a "files" list')
    files = doc["files"]
    if not files:
        raise KfpkgError(f"{MANIFEST} lists no files")
    if len(files) > MAX_ENTRIES:
        raise KfpkgError(f"{MANIFEST} lists {len(files)} files; at most {MAX_ENTRIES} are accepted")
    out = []
    for i, f in enumerate(files):
        if not isinstance(f, dict) or "bin" not in f or "address" not in f:
            raise KfpkgError(f'{MANIFEST}: files[{i}] needs "address" and "bin"')
        name = f["bin"]
        if not isinstance(name, str) or not name:
            raise KfpkgError(f"{MANIFEST}: files[{i}].bin must be a file name")
        prefix = f.get("sha256Prefix", False)
        if not isinstance(prefix, bool):
            raise KfpkgError(f"{MANIFEST}: files[{i}].sha256Prefix must be true or false")
        out.append({"address": parse_address(f["address"]), "bin": name, "sha256Prefix": prefix,
                    "reverse4Bytes": bool(f.get("reverse4Bytes", False))})
    return out


def _safe_member(name: str) -> str:
    norm = posixpath.normpath(name.replace("\\", "/"))
    if (name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or norm.startswith("../")
            or norm == ".." or "/../" in f"/{norm}/"):
        raise KfpkgError(f"{MANIFEST} names {name!r}, which points outside the package "
                         "(path traversal); refusing it")
    return norm


def _swap32(data: bytes) -> bytes:
    data = bytes(data) + bytes(-len(data) % 4)
    out = bytearray(len(data))
    out[0::4], out[1::4], out[2::4], out[3::4] = data[3::4], data[2::4], data[1::4], data[0::4]
    return bytes(out)


def _read_member(zf, info, limit, path):
    """At most `limit` + 1 bytes of a member; zip-level damage becomes a KfpkgError naming it."""
    name = info.filename
    try:
        with zf.open(info) as fh:
            return fh.read(limit + 1)
    except NotImplementedError:
        raise KfpkgError(f"{path}: {printable(name)} uses ZIP compression method {info.compress_type}, which "
                         "kflash (Python's zipfile) cannot read; repack it with deflate or stored "
                         "(tl2k210 package)") from None
    except RuntimeError as exc:           # zipfile: "File ... is encrypted, password required"
        raise KfpkgError(f"{path}: {printable(name)} is encrypted ({exc}); kflash cannot read encrypted "
                         "packages either: repack it without a password (tl2k210 package)") from None
    except Exception as exc:  # BadZipFile (bad CRC), zlib.error, EOFError, OSError, ValueError...
        raise KfpkgError(f"{path}: {printable(name)} is corrupt inside the package ({exc}); download or "
                         "rebuild the package (tl2k210 package)") from None


def read_kfpkg(path, flash_size=FLASH_SIZE_16M):
    """Read a package into a list of FlashImage, validated against ``flash_size``."""
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise KfpkgError(f"{path}: no such file; check the path") from None
    except IsADirectoryError:
        raise KfpkgError(f"{path} is a folder, not a .kfpkg file") from None
    except Exception as exc:  # BadZipFile, OSError, ValueError, EOFError from a damaged archive
        raise KfpkgError(f"{path}: not a readable kfpkg (ZIP) file: {exc}; check the path, or "
                         "rebuild it (tl2k210 package)") from None
    with zf:
        infos = {}
        for info in zf.infolist():
            infos[posixpath.normpath(info.filename.replace("\\", "/"))] = info
        if MANIFEST not in infos:
            raise KfpkgError(f"{path}: no {MANIFEST} at the root of the package")
        raw = _read_member(zf, infos[MANIFEST], MAX_MANIFEST_BYTES, path)
        if infos[MANIFEST].file_size > MAX_MANIFEST_BYTES or len(raw) > MAX_MANIFEST_BYTES:
            raise KfpkgError(f"{path}: {MANIFEST} is absurdly large (over "
                             f"{MAX_MANIFEST_BYTES // 1024} KiB); the package is corrupt: download "
                             "or rebuild it")
        try:
            entries = parse_manifest(raw.decode("utf-8-sig", "replace"))   # a BOM, as kflash reads it
        except KfpkgError as exc:
            raise KfpkgError(f"{path}: {exc}") from None
        read = {}           # a member listed at two addresses (a boot config and its backup): read once
        images = []
        total = 0
        for e in entries:
            member = _safe_member(e["bin"])
            info = infos.get(member)
            if info is None:
                raise KfpkgError(f"{path}: {MANIFEST} lists {printable(member)}, which is not in the package")
            total += info.file_size
            if info.file_size > flash_size or total > flash_size:
                raise KfpkgError(f"{path}: {printable(member)} claims {info.file_size} bytes; the images add "
                                 f"up to more than the whole flash ({flash_size}): the package is "
                                 "corrupt: download or rebuild it")
            data = read[member] if member in read else _read_member(zf, info, flash_size, path)
            read[member] = data
            if len(data) > flash_size:
                raise KfpkgError(f"{path}: {printable(member)} is larger than the flash")
            if len(data) != info.file_size:
                raise KfpkgError(f"{path}: {printable(member)} holds {len(data)} bytes but the package says "
                                 f"{info.file_size}: it is corrupt; download or rebuild it")
            if e["reverse4Bytes"]:
                data = _swap32(data)
            images.append(FlashImage(e["address"], data, e["sha256Prefix"], name=member,
                                     source=f"{path}:{member}"))
    if len({i.address for i in images}) != len(images):
        raise KfpkgError(f"{path}: two files at the same address")
    check_layout(images, flash_size, where=str(path))
    return images


def manifest_text(images) -> str:
    """kflash-compatible manifest: pretty-printed, ``address`` first and decimal."""
    files = [{"address": int(i.address), "bin": i.name, "sha256Prefix": bool(i.envelope)}
             for i in images]
    return json.dumps({"version": "0.1.0", "files": files}, indent=4) + "\n"


def write_kfpkg(images, out_path, flash_size=FLASH_SIZE_16M, extras=None):
    """Write a package atomically (temp file + rename, see tl2k210.fileio). `extras` ({name:
    bytes}) are carried in the ZIP but not flashed (not in the manifest; kflash ignores them),
    e.g. the kmodel's MODEL.kmodel.json metadata."""
    images = list(images)
    extras = dict(extras or {})
    names = set(extras)
    for img in images:
        base = img.name or os.path.basename(img.source) or f"image_0x{img.address:x}.bin"
        base = base.replace("\\", "/").split("/")[-1]
        stem, ext = os.path.splitext(base)
        cand, k = base, 1
        while cand in names or cand == MANIFEST:
            cand = f"{stem}_{k}{ext}"
            k += 1
        names.add(cand)
        img.name = cand
    check_layout(images, flash_size, where=str(out_path))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MANIFEST, manifest_text(images))
        for img in images:
            zf.writestr(img.name, bytes(img.data))
        for name, data in extras.items():
            zf.writestr(name, bytes(data))
    atomic_write(out_path, buf.getvalue(), "package")
    return out_path


def image_arg_path(arg: str) -> str:
    """The file of a ``FILE[@ADDR]`` argument."""
    return arg.rsplit("@", 1)[0] if "@" in arg and not os.path.exists(arg) else arg


def parse_image_arg(arg: str, flash_size=FLASH_SIZE_16M):
    """``FILE[@ADDR]`` -> list of FlashImage (a .kfpkg expands to its entries). Address 0 gets
    the firmware envelope, other addresses raw bytes. A file without ``@`` goes to 0, except a
    .kmodel, which needs an explicit address."""
    if "@" in arg and not os.path.exists(arg):
        path, addr_text = arg.rsplit("@", 1)
        address = parse_address(addr_text)
    else:
        path, address = arg, None
    if path.lower().endswith(".kfpkg"):
        if address is not None:
            raise KfpkgError(f"{arg}: a .kfpkg carries its own addresses; drop the @ADDR")
        return read_kfpkg(path, flash_size)
    if address is None:
        if path.lower().endswith(".kmodel"):
            raise KfpkgError(f"{path}: say where the model goes, e.g. {path}@0x300000 "
                             "(MaixPy's model area usually starts at 0x300000)")
        address = 0
    try:
        with open(path, "rb") as fh:
            data = fh.read(flash_size + 1)
    except IsADirectoryError:
        raise KfpkgError(f"{path} is a folder, not an image file") from None
    except OSError as exc:
        raise KfpkgError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > flash_size:
        raise KfpkgError(f"{path} is larger than the {flash_size // 2**20} MiB flash")
    return [FlashImage(address, data, envelope=(address == 0), name=os.path.basename(path),
                       source=path)]


