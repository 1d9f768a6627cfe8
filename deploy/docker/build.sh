#!/usr/bin/env bash
# deploy/docker/build.sh - the build steps of the container images, as a script
# the Dockerfiles run in their build stage and CI runs on the host
# (tests/deploy/run.sh), so the steps are tested without a Docker engine.
#
#   deploy/docker/build.sh idemproxy STAGE   build build/idemproxy and stage it
#   deploy/docker/build.sh worker STAGE      build the C example worker and stage it
#   deploy/docker/build.sh --no-install ...  skip apt-get (the deps are there)
#   COMMIT=abc123 deploy/docker/build.sh ...  the commit `idemproxy version` and
#                                            build_info{commit} report (the Dockerfile's
#                                            build argument: the image has no .git);
#                                            unset or empty: make asks git
#
# It installs the Debian 12 build dependencies that are missing, runs make, and
# writes what the runtime stage needs:
#   STAGE/usr/local/bin/<binary>   stripped; the runtime stage copies STAGE onto /
#   STAGE.packages                 the Debian packages the runtime stage installs
#                                  with apt-get, one a line: the package of each
#                                  shared library ldd lists (glibc's, libc6, is in
#                                  the base image), and for idemproxy ca-certificates
# The libraries are installed as packages, not copied as loose files, so image
# scanners see them (dpkg's database) and `apt-get upgrade` (a rebuild) updates
# them; their licences come with them (/usr/share/doc/<package>/copyright).
set -euo pipefail

install=1
if [ "${1:-}" = "--no-install" ]; then install=0; shift; fi
what=${1:?usage: build.sh [--no-install] idemproxy|worker STAGE}
stage=${2:?usage: build.sh [--no-install] idemproxy|worker STAGE}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
commit=${COMMIT:-}
# It becomes a C string (build/gen/git_commit.h): a commit id or a describe-like name.
if ! [[ "$commit" =~ ^[0-9A-Za-z._+-]*$ ]]; then
    echo "build.sh: COMMIT '$commit' is not a commit id (letters, digits, . _ + -)" >&2
    exit 2
fi

case "$what" in
idemproxy)
    pkgs="make gcc libc6-dev pkg-config protobuf-c-compiler libhiredis-dev libev-dev
          libprotobuf-c-dev libyaml-dev libjson-c-dev libmicrohttpd-dev libssl-dev
          libcurl4-openssl-dev
          ca-certificates"
    bin=build/idemproxy
    build() { make -j"$(nproc)" ${commit:+COMMIT="$commit"} build/idemproxy; } ;;
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

# 3. The staging tree, and the runtime packages.
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
packages=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r soname path; do
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
    echo "build.sh: $soname from $pkg" >&2
    echo "$pkg"
done) || exit 1

# 4. idemproxy: the system CA store. Without redis.tls.ca_file, proxy/link.c calls
# SSL_CTX_set_default_verify_paths, which reads OPENSSLDIR/cert.pem (Debian's
# libssl3: /usr/lib/ssl/cert.pem, a link the openssl package makes to the bundle
# ca-certificates builds; ca-certificates depends on openssl). The slim base has
# neither: installed, rediss:// to a managed Redis whose certificate a public CA
# signed works with no ca_file.
[ "$what" = idemproxy ] && packages="$packages ca-certificates"
printf '%s\n' $packages | sort -u >"$stage.packages"
echo "build.sh: runtime packages ($stage.packages):" $(cat "$stage.packages") >&2

echo "build.sh: $what staged in $stage ($(du -sh "$stage" | cut -f1))" >&2
