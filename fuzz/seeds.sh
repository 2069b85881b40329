#!/usr/bin/env bash
# Builds the seed corpora under fuzz/corpus/<target>/ at run time from
# ../shared/corpus (read-only; relative to the project root) plus a few
# hand-made inputs. Nothing here is committed (fuzz/.gitignore).
#   fuzz/seeds.sh [SHARED_CORPUS_DIR]
# SEED_MAX_BYTES (default 262144) skips larger images; SEED_EVERY=N keeps
# every Nth corpus file (default 1: all of them).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
shared="${1:-$here/../../shared/corpus}"
out="$here/corpus"
mkdir -p "$out/decode" "$out/wire" "$out/resize" "$out/video"

# decode: 8 header bytes (see decode_one in src/lib.rs) + a corpus image.
# Each image gets one of three headers in turn: RGB + bilinear resize +
# decode() cross-check; RGBA + EXIF orientation + pre-fill compare + Pillow
# bicubic resize; L + pre-fill compare.
max_bytes="${SEED_MAX_BYTES:-262144}"
every="${SEED_EVERY:-1}"
headers=('\x19\x1b\x20\x30\xff\xff\xff\x01' '\xbe\x1a\x40\x40\x00\x00\x00\x00' '\xa0\x1b\x10\x10\x80\x80\x80\x00')
names=(rgb rgba l)
i=0
n=0
if [ -d "$shared" ]; then
  while IFS= read -r -d '' f; do
    i=$((i + 1))
    [ $((i % every)) -eq 0 ] || continue
    [ "$(stat -c %s "$f")" -le "$max_bytes" ] || continue
    k=$((i % 3))
    { printf "${headers[$k]}"; cat "$f"; } > "$out/decode/${names[$k]}-$(basename "$f")"
    n=$((n + 1))
  done < <(find "$shared" -type f ! -name LICENSE ! -name '*.md' -print0 | sort -z)
else
  echo "seeds.sh: $shared not found; hand-made seeds only" >&2
fi

# wire: selector byte + text.
w() { printf '%b' "$2" > "$out/wire/$1"; }
w url        '\x05data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='
w url-ws     '\x05data:image/jpeg;charset=x;base64, aGVs\n bG8 ='
w url-plain  '\x05data:text/plain,hello%20world'
w b64        '\x04aGVsbG8gd29ybGQ='
w b64-nopad  '\x04aGVsbG8gd29ybGQ'
w meta       '\x06b64:eJzLSM3JyVcozy/KSQEAGgsEXQ=='
w meta-bomb  '\x04b64:eNrtwQEBAAAAgJD+r+4ICgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAGoADwAB'
w agent      '\x03nixlSerDes|Agent\x05\x00\x00\x00\x00\x00\x00\x00front|Conns'
w note       '\x00pw1:7:9'
w note-big   '\x00pw1:18446744073709551615:18446744073709551615'
w body       '\x08{"messages":[{"content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,aGVsbG8gd29ybGQ="}},{"data:image/x;base64,QQ==":"DATA:a,b\\"c"}]}],"x":["data:;base64,QUJD",{"k":"data:\\u0041"}]}'
w slot       '\x00pwslot\x00\x02\x03\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x0b\x00\x00\x00\x00\x00\x00\x00'

# resize: 8 header bytes + pixels.
r() { printf '%b' "$2" > "$out/resize/$1"; }
r down-rgb   '\x3f\xff\x02\x07\x1f\x00\x00\x00\x00\x10\x20\x30\x40\x50\x60\x70\x80\x90\xa0\xb0\xc0\xd0\xe0\xf0\xff'
r up-l       '\x03\x03\x00\x3f\xff\x01\x00\x00\x00\xff\x00\xff\x00\xff\x00\xff\x00'
r rgba-pil   '\x1f\x40\x03\x05\x11\x03\x04\x55\x12\x34\x56\x78\x9a\xbc\xde\xf0'
r vfirst     '\x3f\x08\x02\x01\x07\x02\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09'
r c2         '\x10\x21\x01\x05\x80\x01\x00\x00\xff\x00\x7f\x80'
r c5         '\x20\x21\x04\x21\x20\x03\x00\x00\xff\x00\x7f\x80\x01'
# video: 4 header bytes (see video_one in src/video.rs) + a tiny clip made
# with the ffmpeg CLI (`make setup` installs it): 8 frames of 64x64, one
# clip a codec and container. Two headers: one thread, BGR24, 2^20 pixels,
# an hour, frames 0/3/6; two threads, RGB24, frames 5 and 7.
video_headers=('\x3c\x02\x00\x03' '\x3f\x01\x05\x02')
video_clips=(
  "h264.mp4|-c:v libx264 -pix_fmt yuv420p -bf 2 -g 4"
  "hevc.mkv|-c:v libx265 -x265-params log-level=none:bframes=2:keyint=4"
  "hevc_layers.mp4|-c:v libx265 -x265-params log-level=none:bframes=3:temporal-layers=1"
  "vp8.webm|-c:v libvpx"
  "vp9.webm|-c:v libvpx-vp9 -deadline realtime -cpu-used 8"
  "av1.mkv|-c:v libsvtav1 -preset 12"
  "mpeg4.avi|-c:v mpeg4 -bf 1 -q:v 8"
)
v=0
if command -v ffmpeg >/dev/null; then
  tmp="$(mktemp -d)"
  for entry in "${video_clips[@]}"; do
    name="${entry%%|*}"
    # shellcheck disable=SC2086
    if ffmpeg -hide_banner -loglevel error -y -f lavfi -i testsrc2=size=64x64:rate=25 -frames:v 8 \
      ${entry#*|} "$tmp/$name" </dev/null >/dev/null 2>&1; then
      for k in 0 1; do
        { printf "${video_headers[$k]}"; cat "$tmp/$name"; } > "$out/video/$k-$name"
        v=$((v + 1))
      done
    fi
  done
  rm -rf "$tmp"
else
  echo "seeds.sh: no ffmpeg CLI; the video target starts from its regressions only" >&2
fi

echo "seeds.sh: decode $n, wire $(ls "$out/wire" | wc -l), resize $(ls "$out/resize" | wc -l), video $v in $out"
