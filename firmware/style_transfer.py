# MaixPy style transfer (tl2k210 zoo `style_transfer`, 128x128 -> 128x128 RGB): copy to the
# board's /flash/main.py and flash style_transfer.kfpkg (the model at 0x300000).
# On a PC: `tl2k210 demo style-transfer --image photo.jpg --out stylised.png`.
#
# The kmodel's output is the stylised image as 3 x 128 x 128 float32 values in [0, 1], planar
# (all R, then all G, then all B). MaixPy has no call that turns such an fmap into an RGB image,
# so the script builds one with image.Image(size=...) + set_pixel: 16384 pixels in MicroPython,
# the slow part of a frame on the board (the KPU + CPU kernels of the model take ~25 ms).
import sensor, image, lcd, time
import KPU as kpu

S = 128
N = S * S

lcd.init()
sensor.reset()
sensor.set_pixformat(sensor.RGB565)
sensor.set_framesize(sensor.QVGA)
sensor.set_windowing((240, 240))    # centre square of the 320x240 frame ...
sensor.run(1)

task = kpu.load(0x300000)           # or kpu.load("/sd/style_transfer.kmodel")
out = image.Image(size=(S, S))


def to8(t):                         # [0, 1] -> 0..255, clamped
    return 0 if t <= 0 else (255 if t >= 1 else int(t * 255 + 0.5))


clock = time.clock()

try:
    while True:
        clock.tick()
        img = sensor.snapshot()
        small = img.resize(S, S)        # ... scaled to the model's 128x128 input
        small.pix_to_ai()               # resize does not fill the KPU's planar RGB888 buffer
        fmap = kpu.forward(task, small)
        v = fmap[:]                     # 49152 floats: R plane, G plane, B plane
        for y in range(S):
            row = y * S
            for x in range(S):
                i = row + x
                out.set_pixel(x, y, (to8(v[i]), to8(v[N + i]), to8(v[2 * N + i])))
        lcd.display(out)
        print("%.2f fps" % clock.fps())
finally:
    kpu.deinit(task)
