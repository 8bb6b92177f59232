"""`tl2k210 flash`: images or a .kfpkg onto a K210 board over serial (no TensorFlow). The
image collection and the flashing report are shared with `package` and `deploy`."""
import sys

from tl2k210 import cliargs
from tl2k210.flash.layout import address_warnings
from tl2k210.flash.transport import auto_port


def add_flash_parser(sub):
    p = sub.add_parser("flash", help="write images or a .kfpkg to a K210 board over serial",
                       description="Write FILE[@ADDR] images (address 0 gets the bootable "
                       "firmware envelope, other addresses raw bytes) or a .kfpkg package.")
    p.add_argument("images", nargs="+", metavar="FILE[@ADDR]|PACKAGE.kfpkg")
    cliargs.add_flash_port_args(p)
    p.set_defaults(func=cmd_flash)


# ---- handlers ---------------------------------------------------------------------------
def collect_images(args_images, flash_size=None):
    from tl2k210.flash.boards import FLASH_SIZE_16M
    from tl2k210.flash.kfpkg import check_layout, parse_image_arg

    size = flash_size or FLASH_SIZE_16M
    images = []
    for arg in args_images:
        images.extend(parse_image_arg(arg, size))
    check_layout(images, size)
    return images


def do_flash(args, images):
    from tl2k210.flash.flasher import Progress, flash_images

    show = args.progress if args.progress is not None else sys.stderr.isatty()
    log = (lambda m: print(f"tl2k210: {m}", file=sys.stderr)) if args.verbose else None
    port = args.port or auto_port(args.board)
    report = flash_images(images, url=port, board=args.board, baud=args.baud, stub=args.stub,
                          verify=args.verify, reboot=args.reboot, progress=Progress(show),
                          log=log)
    for img in report.images:
        kind = "firmware envelope" if img["envelope"] else "raw"
        print(f"wrote {img['name']} at 0x{img['address']:06x}: {img['size']} bytes ({kind}), "
              f"sha256 {img['sha256'][:16]}")
    rate = report.data_bytes / report.data_seconds if report.data_seconds else 0
    status = "verified" if report.verified else "NOT verified (--no-verify)"
    print(f"done: {report.data_bytes} bytes in {report.seconds:.1f} s ({rate / 1024:.1f} KiB/s "
          f"at {report.baud} baud, {report.retries} retries), {status}, board {report.board}")
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return report


def warn(lines):
    for w in lines:
        print(f"warning: {w}", file=sys.stderr)


def cmd_flash(args):
    cliargs.check_link_args(args)
    images = collect_images(args.images)
    warn(address_warnings(images))
    do_flash(args, images)
    return 0
