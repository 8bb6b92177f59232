# MaixPy ImageNet classifier (tl2k210 zoo `mobilenet_v1`, 224x224): copy to the board's
# /flash/main.py; flash mobilenet_v1.kfpkg (the model at 0x300000) and put labels.txt (1000
# ImageNet class names, one a line) on the SD card or in /flash.
# On a PC: `tl2k210 demo mobilenet-v1 --image photo.jpg`.
import sensor, image, lcd, time
import KPU as kpu

lcd.init()
sensor.reset()
sensor.set_pixformat(sensor.RGB565)
sensor.set_framesize(sensor.QVGA)
sensor.set_windowing((224, 224))    # 224x224 of the frame (top-left on an OV2640): the model input
sensor.run(1)

labels = None
for name in ("/sd/labels.txt", "/flash/labels.txt"):
    try:
        with open(name) as f:
            labels = [line.strip() for line in f]
        break
    except OSError:
        pass

task = kpu.load(0x300000)
clock = time.clock()

try:
    while True:
        clock.tick()
        img = sensor.snapshot()
        fmap = kpu.forward(task, img)
        plist = fmap[:]
        top = sorted(range(len(plist)), key=lambda i: -plist[i])[:5]
        best = top[0]
        name = labels[best].split(",")[0] if labels else "class %d" % best
        img.draw_string(2, 2, "%.2f: %s" % (plist[best], name), color=(255, 0, 0), scale=2)
        lcd.display(img)
        print("top-5:")
        for i in top:
            print("  %.3f %d %s" % (plist[i], i, labels[i] if labels else ""))
        print("%.1f fps" % clock.fps())
finally:
    kpu.deinit(task)
