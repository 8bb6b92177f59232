"""Build hook (the project is configured in pyproject.toml): the wheel carries the top-level
`models/` (zoo recipes, networks, weights) and `firmware/` (MaixPy scripts) folders inside the
package as `tl2k210/data/models` and `tl2k210/data/firmware`, so `pip install tl2k210` gets the
zoo and the demos. The checkout keeps one copy of each; `tl2k210/paths.py` finds either."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = ("models", "firmware")


def bundled_files():
    for name in BUNDLED:
        for src in sorted((ROOT / name).rglob("*")):
            rel = src.relative_to(ROOT)
            if src.is_file() and "__pycache__" not in rel.parts and src.suffix not in (".pyc", ".pyo"):
                yield src, rel


class build_py_with_bundled_data(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return          # an editable install reads models/ and firmware/ from the checkout
        data = Path(self.build_lib) / "tl2k210" / "data"
        shutil.rmtree(data, ignore_errors=True)     # a stale build/ must not ship deleted files
        for src, rel in bundled_files():
            dst = data / rel
            self.mkpath(str(dst.parent))
            self.copy_file(str(src), str(dst))


setup(cmdclass={"build_py": build_py_with_bundled_data})
