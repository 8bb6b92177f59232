"""What `deploy` puts on a board besides the kmodel, as a library: the kmodel for a model file
(converted when it is none), the metadata members a package carries, and the two MaixPy scripts
(the lines that load a flashed model, the main.py that runs an uploaded one). Every name a
script embeds is quoted with repr()."""
from __future__ import annotations

import os

from tl2k210 import metadata
from tl2k210.errors import Tl2k210Error
from tl2k210.k210.emulator import Emulator
from tl2k210.tables import printable


def kmodel_for(model, workdir, dataset=None):
    """`model` itself when it is a .kmodel, else the kmodel converted from it into `workdir`."""
    if model.lower().endswith(".kmodel"):
        return model
    try:
        from tl2k210.compiler import convert_file
    except ImportError:
        raise Tl2k210Error(f"{model} is not a .kmodel and model conversion is not available in "
                           "this install; convert it first (`tl2k210 convert`) and pass the "
                           ".kmodel") from None
    out = os.path.join(workdir, os.path.splitext(os.path.basename(model))[0] + ".kmodel")
    try:
        result = convert_file(model, out, dataset=dataset)
    except Tl2k210Error:
        raise
    except Exception as exc:     # the compiler's own failure, reported with the model's name
        raise Tl2k210Error(f"converting {model} to a kmodel failed: {exc}; convert it with "
                           "`tl2k210 convert` to see the details, then deploy the .kmodel") from exc
    return result if isinstance(result, (str, os.PathLike)) and os.path.exists(result) else out


def metadata_members(images):
    """{NAME.kmodel.json: bytes} for the kmodel images that have metadata beside them."""
    out = {}
    for img in images:
        if img.source.lower().endswith(".kmodel") and os.path.isfile(img.source):
            meta = metadata.load_for(img.source, img.data)
            if meta is not None:
                out[os.path.basename(img.source) + metadata.SUFFIX] = meta.to_json().encode()
    return out


def maixpy_snippet(address, meta=None):
    """The MaixPy lines that load the model; with its metadata, also the task's setup (the
    anchors and labels copied by hand are a top cause of region_layer_init errors)."""
    lines = ["import KPU as kpu", f"task = kpu.load(0x{address:x})"]
    task = meta.task if meta is not None else None
    if meta is not None and meta.labels and len(meta.labels) <= 100:
        lines.append(f"labels = {meta.labels!r}")
    if task == "yolo2" and meta.anchors:
        d = meta.decode
        lines += [f"anchor = ({', '.join(str(v) for v in meta.anchors)})",
                  f"kpu.init_yolo2(task, {d.get('threshold', 0.5)}, {d.get('nms', 0.3)}, "
                  f"{len(meta.anchors) // 2}, anchor)",
                  "# objects = kpu.run_yolo2(task, img)    # img: sensor.snapshot(), "
                  f"{meta.input['shape'][-1]}x{meta.input['shape'][-2]}"]
    elif task == "classify":
        lines.append("# plist = kpu.forward(task, img)[:]; best = plist.index(max(plist))")
    else:
        lines.append("# fmap = kpu.forward(task, img)      # or kpu.run_yolo2(task, img) after init_yolo2")
    lines.append("kpu.deinit(task)")
    return "\n".join(lines)


# ---- deploy --via repl ---------------------------------------------------------------------------
def main_py(model_file, model, labels_file=None, anchors=None, threshold=0.5, nms=0.3):
    """A MaixPy main.py that runs `model_file` (a board path) on the camera and prints what it
    finds: YOLOv2 boxes with --anchors, else the top class (labels), else output statistics."""
    shape, _ = Emulator(model).input_spec()
    if len(shape) == 4:
        shape = shape[1:]
    if len(shape) != 3:
        raise Tl2k210Error(f"{model_file}: the model takes a vector of {shape[0]} values, not an "
                           "image; deploy --via repl writes camera scripts only (upload your own "
                           "main.py with `tl2k210 repl put`)")
    c, h, w = shape
    fs = "QVGA" if w <= 320 and h <= 240 else "VGA"
    # every name and value is embedded as a Python literal (repr): a file name is never code
    lines = [f"# main.py written by `tl2k210 deploy --via repl` for {printable(model_file)}",
             "import sensor, lcd, time", "import KPU as kpu", "", "lcd.init()", "sensor.reset()",
             f"sensor.set_pixformat(sensor.{'GRAYSCALE' if c == 1 else 'RGB565'})",
             f"sensor.set_framesize(sensor.{fs})"]
    if (w, h) not in ((320, 240), (640, 480)):
        lines.append(f"sensor.set_windowing(({w}, {h}))   # the model's input size")
    lines += ["sensor.run(1)", "", f"task = kpu.load({model_file!r})"]
    if model.version == 4:
        for i, o in enumerate(model.outputs):
            lines.append(f"kpu.set_outputs(task, {i}, {o[3] // 4}, 1, 1)")
    if labels_file:
        lines.append(f"labels = [l.strip() for l in open({labels_file!r}) if l.strip()]")
    if anchors:
        lines += [f"anchor = {tuple(anchors)!r}",
                  f"kpu.init_yolo2(task, {threshold}, {nms}, {len(anchors) // 2}, anchor)"]
    lines += ["clock = time.clock()", "while True:", "    clock.tick()", "    img = sensor.snapshot()"]
    if anchors:
        name = "labels[o.classid()]" if labels_file else "o.classid()"
        lines += ["    objs = kpu.run_yolo2(task, img)",
                  "    for o in objs or []:",
                  "        img.draw_rectangle(o.rect())",
                  f"        print('%s %.3f at %s' % ({name}, o.value(), o.rect()))",
                  "    print('%d found, %.1f fps' % (len(objs or []), clock.fps()))"]
    else:
        lines += ["    p = kpu.forward(task, img)[:]", "    i = p.index(max(p))"]
        name = "labels[i] if i < len(labels) else i" if labels_file else "i"
        lines += [f"    print('class %s %.3f, %.1f fps' % ({name}, p[i], clock.fps()))"]
    lines += ["    lcd.display(img)", ""]
    return "\n".join(lines)
