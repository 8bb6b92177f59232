"""The host `ulab` is the one full MaixPy v1 builds carry: micropython-ulab 0.262 (the Neutree fork
at c315a57, sipeed/MaixPy-v1's submodule). The expected lines are the outputs printed in that
version's own manual (docs/manual/source/ulab.rst) for the same snippets."""
from test_maixpy_runtime import run  # noqa: F401  (the board-script runner)


def test_the_manuals_snippets_print_what_the_manual_shows(tmp_path):
    res = run(tmp_path, """
import ulab as np
a = np.array([1, 2, 3, 4], dtype=np.int8)
print("a:\\n", a)
print("shape of a:", a.shape())
b = np.array([[1, 2], [3, 4]], dtype=np.int8)
print("b:\\n", b)
print("shape of b:", b.shape())
a = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]], dtype=np.uint8)
print('a (2 by 8):', a.reshape((2, 8)))
print('a (1 by 16):', a.reshape((1, 16)))
a = np.array(range(10), dtype=np.uint8)
print("a:", a, a[0], a[-1], a[1], a[-2])
a = np.array(range(9), dtype=np.float)
print("a < 5:", a[a < 5])
a = np.array(range(9), dtype=np.uint8)
b = np.array([4, 4, 4, 3, 3, 3, 13, 13, 13], dtype=np.uint8)
print("a**2:", a*a)
print("100*sin(b):", np.sin(b)*100.0)
print("a[a*a > np.sin(b)*100.0]:", a[a*a > np.sin(b)*100.0])
a = np.array([1, 2, 3, 4], dtype=np.uint8)
b = np.array([1, 2, 3, 4], dtype=np.int8)
c = np.array([1, 2, 3, 4], dtype=np.float)
print("a+b:", a+b, "a*c:", a*c, "a+12:", a+12)
try:
    print(12+a)
except TypeError as e:
    print(e)
""")
    assert res.error is None, res.traceback
    assert res.lines == [
        "a:", " array([1, 2, 3, 4], dtype=int8)", "shape of a: (1, 4)",
        "b:", " array([[1, 2],", "\t [3, 4]], dtype=int8)", "shape of b: (2, 2)",
        "a (2 by 8): array([[1, 2, 3, 4, 5, 6, 7, 8],", "\t [9, 10, 11, 12, 13, 14, 15, 16]], dtype=uint8)",
        "a (1 by 16): array([1, 2, 3, ..., 14, 15, 16], dtype=uint8)",
        "a: array([0, 1, 2, ..., 7, 8, 9], dtype=uint8) 0 9 1 8",
        "a < 5: array([0.0, 1.0, 2.0, 3.0, 4.0], dtype=float)",
        "a**2: array([0, 1, 4, 9, 16, 25, 36, 49, 64], dtype=uint8)",
        "100*sin(b): array([-75.68025, -75.68025, -75.68025, 14.112, 14.112, 14.112, 42.01671, 42.01671, "
        "42.01671], dtype=float)",
        "a[a*a > np.sin(b)*100.0]: array([0, 1, 2, 4, 5, 7, 8], dtype=uint8)",
        "a+b: array([2, 4, 6, 8], dtype=int16) a*c: array([1.0, 4.0, 9.0, 16.0], dtype=float) "
        "a+12: array([13, 14, 15, 16], dtype=uint8)",
        "unsupported types for __add__: 'int', 'ndarray'"]


def test_what_ulab_0262_lacks_fails_as_on_the_board(tmp_path):
    """Scripts written for numpy or a later ulab ran on the host only: ulab 0.262 has no
    submodules, `shape` is a method, `**` is unsupported, `dot` is a matrix product, an integer
    array takes no floats; reductions and items are MicroPython numbers (brownie's self-learning
    classifier sends them as JSON)."""
    res = run(tmp_path, """
import ulab as np, ujson
a = np.array([1.5, 2, 3])
print(ujson.dumps({"d": np.sum(a * a), "m": np.max(a), "i": np.argmax(a), "x": a[1]}), np.mean(a))
print(np.dot(np.array([[1, 2], [3, 4]]), np.array([[1], [1]])), np.__version__)
for bad in ("np.numerical.mean(a)", "a.shape[0]", "a ** 2", "np.dot(a, a)", "np.array([1.5], dtype=np.uint8)"):
    try:
        eval(bad)
    except Exception as e:
        print(type(e).__name__, e)
""")
    assert res.error is None, res.traceback
    assert res.lines == ['{"d": 15.25, "m": 3.0, "i": 2, "x": 2.0} 2.166667', "array([3.0, 7.0], dtype=float) 0.262",
                         "AttributeError 'module' object has no attribute 'numerical'",
                         "TypeError 'method' object isn't subscriptable",
                         "TypeError unsupported types for __pow__: 'ndarray', 'int'",
                         "ValueError matrix dimensions do not match",
                         "TypeError can't convert float to int"]
