#!/usr/bin/env bash
# deploy/docker/build.sh - the build steps of the container images, as a script
# the Dockerfiles run in their build stage and CI runs on the host
# (tests/deploy/run.sh), so the steps are tested without a Docker engine.
#
#   deploy/docker/build.sh idemproxy STAGE   build build/idemproxy and stage it
#   deploy/docker/build.sh worker STAGE      build the C example worker and stage it
#   deploy/docker/build.sh --no-install ...  skip apt-get (the deps are there)
#
# It installs the Debian 12 build dependencies that are missing, runs make, and
# fills STAGE with a tree the runtime stage copies onto / as it is:
#   STAGE/usr/local/bin/<binary>                       stripped
#   STAGE/usr/lib/<multiarch>/<soname>                 each shared library ldd
#                                                      lists, except glibc's
#   STAGE/usr/share/doc/<package>/copyright            the licence of each
#   STAGE/etc/ssl/certs/ca-certificates.crt            idemproxy: Debian's CA bundle,
#   STAGE/usr/lib/ssl/cert.pem -> that bundle          where OpenSSL looks by default
# glibc (libc6: libc, libm, ld-linux, ...) is left out: the runtime base image
# has it. The libraries go where their Debian packages put them (usr-merged
# paths), so the loader finds them without LD_LIBRARY_PATH or ldconfig.
set -euo pipefail

install=1
if [ "${1:-}" = "--no-install" ]; then install=0; shift; fi
what=${1:?usage: build.sh [--no-install] idemproxy|worker STAGE}
stage=${2:?usage: build.sh [--no-install] idemproxy|worker STAGE}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

case "$what" in
idemproxy)
    pkgs="make gcc libc6-dev pkg-config protobuf-c-compiler libhiredis-dev libev-dev
          libnanomsg-dev libprotobuf-c-dev libyaml-dev libjson-c-dev libmicrohttpd-dev libssl-dev
          ca-certificates"
    bin=build/idemproxy
    build() { make -j"$(nproc)" build/idemproxy; } ;;
worker)
    pkgs="make gcc libc6-dev pkg-config protobuf-c-compiler libnanomsg-dev libprotobuf-c-dev"
    bin=clients/c/build/example_worker
    build() { make -j"$(nproc)" -C clients/c build/example_worker; } ;;
*)
    echo "build.sh: unknown image '$what' (idemproxy or worker)" >&2
    exit 2 ;;
esac

# 1. Build dependencies: only what is missing (a no-op on a prepared machine).
if [ "$install" = 1 ]; then
    missing=""
    for p in $pkgs binutils; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        echo "build.sh: installing$missing" >&2
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
fi

# 2. The binary.
build
[ -x "$bin" ] || { echo "build.sh: $bin was not built" >&2; exit 1; }

# 3. The staging tree.
rm -rf "$stage"
mkdir -p "$stage/usr/local/bin"
name=$(basename "$bin")
cp "$bin" "$stage/usr/local/bin/$name"
strip --strip-unneeded "$stage/usr/local/bin/$name"

# "libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)": every library the
# loader resolves, transitively. A "not found" is an error here, not in the image.
if ldd "$bin" | grep -q 'not found'; then
    ldd "$bin" >&2
    echo "build.sh: $bin has unresolved libraries" >&2
    exit 1
fi
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r soname path; do
    real=$(readlink -f "$path")
    # The package that owns it: dpkg knows the path as packaged (/lib/... or /usr/lib/...).
    pkg=$(dpkg -S "$path" 2>/dev/null || dpkg -S "$real" 2>/dev/null ||
          dpkg -S "${real#/usr}" 2>/dev/null || true)
    pkg=${pkg%%:*}
    if [ -z "$pkg" ]; then
        echo "build.sh: $path belongs to no Debian package; refusing to guess" >&2
        exit 1
    fi
    [ "$pkg" = libc6 ] && continue
    dir=$(dirname "$real")
    case "$dir" in /usr/*) ;; *) dir="/usr$dir" ;; esac   # never create /lib in the image
    mkdir -p "$stage$dir"
    cp -L "$real" "$stage$dir/$soname"
    if [ -f "/usr/share/doc/$pkg/copyright" ]; then
        mkdir -p "$stage/usr/share/doc/$pkg"
        cp "/usr/share/doc/$pkg/copyright" "$stage/usr/share/doc/$pkg/copyright"
    fi
    echo "build.sh: staged $soname ($pkg)" >&2
done

# 4. idemproxy: the system CA store. Without redis.tls.ca_file, proxy/link.c calls
# SSL_CTX_set_default_verify_paths, which reads OPENSSLDIR/cert.pem (Debian's
# libssl3: /usr/lib/ssl/cert.pem, a link the openssl package makes to the bundle
# ca-certificates builds). The slim base has neither package, and the runtime stage
# installs nothing: the bundle and the link are staged, so rediss:// to a managed
# Redis whose certificate a public CA signed works with no ca_file.
if [ "$what" = idemproxy ]; then
    bundle=/etc/ssl/certs/ca-certificates.crt
    grep -q "BEGIN CERTIFICATE" "$bundle" 2>/dev/null ||
        { echo "build.sh: no CA bundle at $bundle (package ca-certificates)" >&2; exit 1; }
    mkdir -p "$stage/etc/ssl/certs" "$stage/usr/lib/ssl" "$stage/usr/share/doc/ca-certificates"
    cp "$bundle" "$stage/etc/ssl/certs/ca-certificates.crt"
    ln -s /etc/ssl/certs/ca-certificates.crt "$stage/usr/lib/ssl/cert.pem"
    cp /usr/share/doc/ca-certificates/copyright "$stage/usr/share/doc/ca-certificates/copyright"
    echo "build.sh: staged the CA bundle ($(grep -c "BEGIN CERTIFICATE" "$bundle") certificates)" >&2
fi

echo "build.sh: $what staged in $stage ($(du -sh "$stage" | cut -f1))" >&2
