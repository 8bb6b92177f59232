# MaixPy face detection (Sipeed Maix Bit/Dock/Go/Amigo...): copy to the board's /flash/main.py.
# Needs the face-detection kmodel flashed at 0x300000 (face_detect.kfpkg or MaixPy's
# face_model_at_0x300000.kfpkg). On a PC: `tl2k210 demo face-detect --image photo.jpg`.
import sensor, image, lcd, time
import KPU as kpu

lcd.init()
sensor.reset()
sensor.set_pixformat(sensor.RGB565)
sensor.set_framesize(sensor.QVGA)   # 320x240: the model's input size
sensor.run(1)

task = kpu.load(0x300000)           # or kpu.load("/sd/face_detect.kmodel")
# the detector's anchors: MaixPy's face model's here; `tl2k210 zoo build` (NAME_main.py) and
# `tl2k210 demo` put the zoo detector's in their place (its metadata: models/face_detect/recipe.toml)
anchor = (1.889, 2.5245, 2.9465, 3.94056, 3.99987, 5.3658, 5.155437, 6.92275, 6.718375, 9.01025)
kpu.init_yolo2(task, 0.5, 0.3, 5, anchor)
clock = time.clock()

try:
    while True:
        clock.tick()
        img = sensor.snapshot()
        faces = kpu.run_yolo2(task, img)   # a list, or None when nothing is found
        n = 0
        if faces:
            n = len(faces)
            for f in faces:
                img.draw_rectangle(f.rect(), color=(255, 0, 0), thickness=2)
                img.draw_string(f.x(), max(0, f.y() - 12), "face %.2f" % f.value(), color=(255, 0, 0))
                print("face x=%d y=%d w=%d h=%d value=%.3f" % (f.x(), f.y(), f.w(), f.h(), f.value()))
        print("faces: %d" % n)
        img.draw_string(2, 224, "%d face(s) %.1f fps" % (n, clock.fps()), color=(255, 255, 255))
        lcd.display(img)
finally:
    kpu.deinit(task)
