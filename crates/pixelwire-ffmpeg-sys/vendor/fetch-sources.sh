#!/bin/sh
# Downloads the vendored tarballs again from the Debian archive and checks
# them against the sums in SOURCES.md. Documentation only: the build never
# runs this. Usage: ./fetch-sources.sh [DIR] (default: a fresh temp dir).
set -eu
dir=${1:-$(mktemp -d)}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cd "$dir"
for path in f/ffmpeg/ffmpeg_9.0.2.orig.tar.xz f/ffmpeg/ffmpeg_9.0.2.orig.tar.xz.asc \
    d/dav1d/dav1d_1.5.4.orig.tar.xz d/dav1d/dav1d_1.5.4.orig.tar.xz.asc; do
    curl -fsSLO "$mirror/pool/main/$path"
done
sha256sum -c <<'SUMS'
8c3850283eb25fa026482078a04051e0be17347b09ef81a0849bec15a96e002e  ffmpeg_9.0.2.orig.tar.xz
d617fd94ea354dadd2a8bb16243d37c44e1e9729b06b6ad58fe30bfb0fa943f2  ffmpeg_9.0.2.orig.tar.xz.asc
686616b7c69eb88d44459391ab25cac13b6647a3b288835c5784e71c1514a5c5  dav1d_1.5.4.orig.tar.xz
b7e9664c8d847b2e88b059843b9977a74df2a7c7d911b094821dc236671bf9fc  dav1d_1.5.4.orig.tar.xz.asc
SUMS
echo "verified in $dir"
