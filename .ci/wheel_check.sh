#!/usr/bin/env bash
# Install tl2k210 like a library and use it there: build the wheel, install it (--no-deps) into a
# fresh venv OUTSIDE the checkout whose dependencies are the lock's (the checkout's .venv
# site-packages layered underneath through a .pth file: no download, no minutes of unpacking),
# then run `zoo list`, `zoo build face_detect` and `demo face-detect` from an unrelated folder
# and check what they print. Usage: .ci/wheel_check.sh [PYTHON of the locked venv]
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${1:-$REPO/.venv/bin/python}
# the installed zoo reads recipes' testdata: files (mobilenet's weights) from the checkout's test data
TL2K210_TESTDATA=$(PYTHONPATH=$REPO "$PY" -c "from tl2k210 import paths; print(paths.testdata_dir() or '')")
export TL2K210_TESTDATA
unset PYTHONPATH TL2K210_CACHE        # nothing of the checkout may leak into the installed one
export PYTHONNOUSERSITE=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tl2k210-wheel-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() { echo "wheel check FAILED: $*" >&2; exit 1; }

echo "== wheel: build (from a copy of the tracked and unignored files: no stale build/ folder)"
"$PY" -c '
import os, shutil, subprocess, sys
files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True,
                       check=True).stdout.decode().split("\0")
for rel in filter(os.path.isfile, filter(None, files)):
    os.makedirs(os.path.join(sys.argv[1], os.path.dirname(rel)), exist_ok=True)
    shutil.copy2(rel, os.path.join(sys.argv[1], rel))' "$WORK/src"
(cd "$WORK/src" && "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" .) >"$WORK/wheel.log" 2>&1 \
    || { cat "$WORK/wheel.log"; fail "pip wheel"; }
WHEEL=$(ls "$WORK"/dist/tl2k210-*.whl) || fail "pip wheel wrote no wheel"
LIST=$("$PY" -m zipfile -l "$WHEEL")
for f in tl2k210/data/models/face_detect/recipe.toml tl2k210/data/models/face_detect/weights.npz \
         tl2k210/data/models/face_detect/network.py tl2k210/data/firmware/face_detect.py \
         tl2k210/data/models/mobilenet_v1/recipe.toml tl2k210/flash/shim/sitecustomize.py; do
    grep -q " *$f " <<<"$LIST" || fail "$f is not in $(basename "$WHEEL")"
done
! grep -q "__pycache__\|\.pyc " <<<"$LIST" || fail "the wheel carries __pycache__ files"
echo "$(basename "$WHEEL"): $(grep -c 'tl2k210/data/' <<<"$LIST") files under tl2k210/data/"

echo "== wheel: install into a fresh venv outside the checkout"
"$PY" -m venv --without-pip "$WORK/venv"
LOCK_SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
NEW_SITE=$("$WORK/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$LOCK_SITE" > "$NEW_SITE/_tl2k210_locked_deps.pth"    # appended after the venv's own
"$PY" -m pip --python "$WORK/venv/bin/python" install -q --no-deps --no-index "$WHEEL"
mkdir "$WORK/user" && cd "$WORK/user"
export XDG_CACHE_HOME="$WORK/cache"
TL="$WORK/venv/bin/tl2k210"
where=$("$WORK/venv/bin/python" -c "import tl2k210; print(tl2k210.__file__)")
[[ $where == "$NEW_SITE"/* ]] || fail "tl2k210 imported from $where, not the installed wheel"

echo "== wheel: tl2k210 zoo list"
out=$("$TL" zoo list)
echo "$out"
for m in face_detect face_recognition mobilenet_v1 style_transfer; do
    grep -q "^$m " <<<"$out" || fail "zoo list does not list $m"
done
grep -q "^face_detect .* yes " <<<"$out" || fail "zoo list does not find face_detect's weights"

echo "== wheel: tl2k210 zoo build face_detect"
"$TL" zoo build face_detect >"$WORK/build.out" 2>"$WORK/build.err" || { cat "$WORK/build.err"; fail "zoo build"; }
tail -3 "$WORK/build.out"
ZOO="$XDG_CACHE_HOME/tl2k210/zoo"
for f in face_detect.kmodel face_detect.kmodel.json face_detect.kfpkg face_detect_main.py; do
    [ -s "$ZOO/$f" ] || fail "zoo build did not write $ZOO/$f"
done
grep -q "wrote $ZOO/face_detect.kmodel" "$WORK/build.out" || fail "zoo build does not say where it wrote"
if grep -v '^\[[1-6]/6\] ' "$WORK/build.err"; then fail "zoo build printed more than its progress lines (above)"; fi
"$WORK/venv/bin/python" -m zipfile -l "$ZOO/face_detect.kfpkg" | grep -q "face_detect.kmodel.json" \
    || fail "the kfpkg does not carry the metadata"

echo "== wheel: tl2k210 demo face-detect --image astronaut.png"
"$WORK/venv/bin/python" -c "from skimage import data; from PIL import Image; Image.fromarray(data.astronaut()).save('astronaut.png')"
out=$("$TL" demo face-detect --image astronaut.png --out lcd.png)
echo "$out"
grep -q "^\[host\] $NEW_SITE/tl2k210/data/firmware/face_detect.py " <<<"$out" \
    || fail "demo did not run the wheel's firmware/face_detect.py"
grep -q "^\[host\] model: face_detect.kmodel (yolo2, 320x240 input, made by tl2k210" <<<"$out" \
    || fail "demo did not use the built zoo model"
grep -q "^faces: 1$" <<<"$out" || fail "demo did not find exactly one face"
python_box=$(grep "^face x=" <<<"$out") || fail "no face line"
[ -s lcd.png ] || fail "no LCD png"
echo "== wheel check passed: ${python_box}"
