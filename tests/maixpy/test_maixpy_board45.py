"""Departures of the host MaixPy from a v0.6.2 board fixed in round 45: what sensor.reset()
prints while it probes the camera, interleaved sleeping threads, MicroPython's dir(),
sys.stdin reads. Each test names the firmware source it checks against."""
from test_maixpy_runtime import PROBE, photo, run  # noqa: F401  (the runner and the photo fixture)


def test_sensor_reset_prints_the_probe_of_each_camera(tmp_path, photo):
    """sensor.c (v0.6.2) sensor_init_dvp: cambus_init -> sccb_i2c_init prints "init i2c2\\r\\n"
    (sensor_load_config's default bus 2); sensro_ov_detect prints the chip, sensor_init_dvp
    "find ov sensor"; a GC0328 is found by sensro_gc_detect, which prints its id (%x) first."""
    body = "import sensor\nsensor.reset()\nprint('ok')\n"
    res = run(tmp_path, body, images=[photo])
    assert res.stdout == "init i2c2\r\n[MAIXPY]: find ov2640\n[MAIXPY]: find ov sensor\nok\n"
    assert run(tmp_path, body, camera="ov7740").lines == [
        "init i2c2", "[MAIXPY]: find ov7740", "[MAIXPY]: find ov sensor", "ok"]
    assert run(tmp_path, body, camera="gc0328").lines == [
        "init i2c2", "[MAIXPY]: sensor id = 9d", "[MAIXPY]: find gc0328", "ok"]


def test_sensor_reset_choice_that_excludes_the_camera_fails(tmp_path):
    """choice=2 probes GC sensors only: an OV2640 board prints "no sensor" and py_sensor_reset's
    PY_ASSERT_FALSE_MSG raises OSError("Reset Failed"); snapshot() then says "Not init!"."""
    res = run(tmp_path, """
import sensor
try:
    sensor.reset(choice=2)
except OSError as e:
    print(e)
sensor.reset(choice=1)
""")
    assert res.error is None, res.traceback
    assert res.lines == ["init i2c2", "[MAIXPY]: no sensor", "Reset Failed"] + PROBE


def test_sensor_probe_bus_follows_config_json(tmp_path):
    """sensor_load_config reads the "sensor" dict of /flash/config.json: i2c_num -2 (the DVP's
    SCCB) makes sccb_i2c_init silent."""
    fs = tmp_path / "flash"
    fs.mkdir()
    (fs / "config.json").write_text('{"type": "dock", "sensor": {"i2c_num": -2}}')
    res = run(tmp_path, "import sensor\nsensor.reset()\n", fs=fs)
    assert res.lines == PROBE[1:]
