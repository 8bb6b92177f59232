"""`tl2k210 package`: a kflash-compatible .kfpkg from images, with each kmodel's metadata."""
from tl2k210.cli.flash import collect_images, warn
from tl2k210.deploy import metadata_members
from tl2k210.flash.layout import address_warnings


def add_package_parser(sub):
    p = sub.add_parser("package", help="build a .kfpkg from images (kflash-compatible)",
                       description="Build a .kfpkg from FILE@ADDR images. A kmodel's metadata "
                       "(MODEL.kmodel.json beside it) travels in the package, unflashed.")
    p.add_argument("images", nargs="+", metavar="FILE[@ADDR]",
                   help="e.g. model.kmodel@0x300000 firmware.bin@0")
    p.add_argument("-o", "--output", required=True, help="output .kfpkg path")
    p.set_defaults(func=cmd_package)


def cmd_package(args):
    from tl2k210.fileio import check_outputs
    from tl2k210.flash.kfpkg import image_arg_path, write_kfpkg

    check_outputs([("-o", args.output)], [image_arg_path(a) for a in args.images])
    images = collect_images(args.images)
    warn(address_warnings(images))
    write_kfpkg(images, args.output, extras=metadata_members(images))
    for i in images:
        print(f"{i.name} at 0x{i.address:06x} ({len(i.data)} bytes"
              f"{', firmware envelope' if i.envelope else ''})")
    print(f"wrote {args.output}")
    return 0
