# MaixPy style transfer (tl2k210 zoo `style_transfer`, 128x128 -> 128x128 RGB): copy to the
# board's /flash/main.py and flash style_transfer.kfpkg (the model at 0x300000).
# On a PC: `tl2k210 demo style-transfer --image photo.jpg --out stylised.png`.
#
# The kmodel's output is the stylised image as 3 x 128 x 128 float32 values in [0, 1], planar
# (all R, then all G, then all B). MaixPy has no call that turns such an fmap into an RGB image,
# so the script builds one with image.Image(size=...) + set_pixel, reading the fmap a row at a
# time (the full fmap[:] list of 49152 boxed floats can exhaust MicroPython's GC heap): 16384
# set_pixel calls in MicroPython are the slow part of a frame on the board (the model itself,
# KPU + CPU kernels, is estimated at ~23 ms).
import sensor, image, lcd, time
import KPU as kpu

S = 128
N = S * S

lcd.init()
sensor.reset()
sensor.set_pixformat(sensor.RGB565)
sensor.set_framesize(sensor.QVGA)
sensor.set_windowing((240, 240))    # a 240x240 square of the frame (top-left on an OV2640) ...
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
        for y in range(S):              # planar R, G, B: read one row of each plane at a time
            i = y * S                   # (3 x 128 floats, not the whole 49152-float list)
            r, g, b = fmap[i:i + S], fmap[N + i:N + i + S], fmap[2 * N + i:2 * N + i + S]
            for x in range(S):
                out.set_pixel(x, y, (to8(r[x]), to8(g[x]), to8(b[x])))
        lcd.display(out)
        print("%.2f fps" % clock.fps())
finally:
    kpu.deinit(task)
