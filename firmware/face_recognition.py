# MaixPy face recognition (Sipeed Maix Bit/Dock/Go...): copy to the board's /flash/main.py.
# Needs the face detector at 0x300000 (face_detect.kfpkg or MaixPy's face_model_at_0x300000.kfpkg)
# and the face embedder at 0x400000 (face_recognition.kfpkg, `tl2k210 zoo build face_recognition`).
# Press the BOOT key while a face is in view to enroll it ("person1", "person2", ...); known faces
# are then labelled with their name and cosine similarity, others "unknown".
# On a PC: `tl2k210 demo face-recognition --image a.jpg --image b.jpg --press 0`.
import sensor, image, lcd, time, gc
import KPU as kpu
from Maix import GPIO
from fpioa_manager import fm
from board import board_info

THRESHOLD = 0.35         # cosine similarity for "same person" (the recipe's [decode] threshold)
SIZE = 64                # embedder input

lcd.init()
sensor.reset()
sensor.set_pixformat(sensor.RGB565)
sensor.set_framesize(sensor.QVGA)   # 320x240: the detector's input size
sensor.run(1)

fm.register(board_info.BOOT_KEY, fm.fpioa.GPIOHS0)
key = GPIO(GPIO.GPIOHS0, GPIO.IN)

task_fd = kpu.load(0x300000)        # face detector
task_fe = kpu.load(0x400000)        # face embedder (128-d)
# the detector's anchors: MaixPy's face model's here; `tl2k210 zoo build` (NAME_main.py) and
# `tl2k210 demo` put the zoo detector's in their place (its metadata: models/face_detect/recipe.toml)
anchor = (1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025)
kpu.init_yolo2(task_fd, 0.5, 0.3, 5, anchor)

names = []
features = []
clock = time.clock()


def l2_normalise(v):
    n = 0.0
    for a in v:
        n += a * a
    n = n ** 0.5
    if n <= 0:
        n = 1.0
    return [a / n for a in v]


def cosine(a, b):
    s = 0.0
    for i in range(len(a)):
        s += a[i] * b[i]
    return s


def face_box(x, y, w, h):
    s = min(max(w, h), 320, 240)
    x0 = min(max(0, x + w // 2 - s // 2), 320 - s)
    y0 = min(max(0, y + h // 2 - s // 2), 240 - s)
    return x0, y0, s


try:
    while True:
        clock.tick()
        img = sensor.snapshot()
        pressed = key.value() == 0
        faces = kpu.run_yolo2(task_fd, img)
        n = 0
        if faces:
            n = len(faces)
            biggest = max(faces, key=lambda f: f.w() * f.h())
            for f in faces:
                x0, y0, s = face_box(f.x(), f.y(), f.w(), f.h())
                face = img.cut(x0, y0, s, s)
                face64 = face.resize(SIZE, SIZE)
                face64.pix_to_ai()
                fmap = kpu.forward(task_fe, face64)
                feature = l2_normalise(fmap[:])
                del face64
                del face
                best, name = -1.0, "unknown"
                for i in range(len(features)):
                    score = cosine(feature, features[i])
                    if score > best:
                        best = score
                        if score >= THRESHOLD:
                            name = names[i]
                if pressed and f is biggest:
                    name = "person%d" % (len(names) + 1)
                    names.append(name)
                    features.append(feature)
                    best = 1.0
                    print("enrolled %s" % name)
                color = (0, 255, 0) if name != "unknown" else (255, 0, 0)
                img.draw_rectangle(f.rect(), color=color, thickness=2)
                img.draw_string(f.x(), max(0, f.y() - 12), "%s %.2f" % (name, best), color=color)
                print("face x=%d y=%d w=%d h=%d name=%s score=%.3f" % (f.x(), f.y(), f.w(), f.h(), name, best))
        print("faces: %d enrolled: %d" % (n, len(names)))
        img.draw_string(2, 224, "%d face(s) %d enrolled %.1f fps" % (n, len(names), clock.fps()), color=(255, 255, 255))
        lcd.display(img)
        gc.collect()
finally:
    kpu.deinit(task_fe)
    kpu.deinit(task_fd)
