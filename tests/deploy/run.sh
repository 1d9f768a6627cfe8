#!/usr/bin/env bash
# tests/deploy/run.sh - the offline checks of deploy/, ending with one line
# "N passed, N failed". No Docker engine and no cluster: nothing is fetched at
# test time but Go modules (the first run builds helm and kubectl-validate from
# the Go module proxy) and two PyPI packages; afterwards everything is cached.
#
#   - the image build steps (deploy/docker/build.sh, which the Dockerfiles run):
#     both images staged, the staged binaries run with only glibc and the files
#     of the Debian packages the image installs (in a chroot when root), the
#     Dockerfiles agree with the staging;
#   - deploy/k8s and the rendered chart validated against the Kubernetes
#     $K8S_VERSION API schemas by kubectl-validate (embedded schemas, offline);
#   - the images record the commit: the Dockerfiles' ARG COMMIT and OCI labels,
#     a binary staged with COMMIT reporting it, `make images` passing it;
#   - helm lint; the chart with redis.existingSecret renders the same objects as
#     deploy/k8s; the pieces of the pod fit together (ports, probes, mounts);
#     every values file of tests/deploy/values rendered, linted and validated;
#     the values schema refusing unknown keys; no Secret unless a password is
#     given; a mount without a volume refused; the PodMonitor and PrometheusRule
#     (against tests/deploy/crds) holding deploy/prometheus/alerts.yaml;
#   - the sidecar in a team's own app: tests/deploy/fixtures/app-chart (a chart
#     that depends on this one) and fixtures/kustomize-app (the kustomize
#     Component; `kubectl kustomize`, or kustomize built once where kubectl is
#     missing), each validated and holding the chart's own sidecar;
#   - `idemproxy check` on the config of the ConfigMaps;
#   - every query of the Grafana dashboard and the alert rules names a metric
#     /metrics exports (a fixture scrape; IDEMPROXY_METRICS=FILE for another);
#   - negative checks: each checker is shown to fail on a broken copy, with the
#     error that breakage should give (a failure for another reason fails).
#
# Tools go to $IDEMPROXY_TOOLS (default ~/.cache/idemproxy/tools), outside the
# work tree, so a fresh clone on the same machine (CI) reuses them. The first
# build is download-bound (~15 min on a fresh machine, seconds afterwards):
#   tests/deploy/run.sh --tools    only build the tools (e.g. early, in the background)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

HELM_VERSION=v3.22.0
HELM_K8S_MINOR=37                 # as helm's own release build sets it (its client-go is v0.37)
KUBECTL_VALIDATE_VERSION=v0.0.4
KUSTOMIZE_VERSION=v5.5.0          # built only where kubectl (which embeds kustomize) is missing
K8S_VERSION=1.30                  # newest schemas kubectl-validate v0.0.4 embeds
K8S_MIN_VERSION=1.29              # native sidecars on by default; the chart's kubeVersion
TOOLS=${IDEMPROXY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/idemproxy/tools}
IDEMPROXY_BIN=${IDEMPROXY_BIN:-build/idemproxy}
METRICS=${IDEMPROXY_METRICS:-tests/deploy/fixtures/metrics.txt}

passed=0
failed=0
tmp=$(mktemp -d)
trap 'umount "$tmp"/pod*/proc 2>/dev/null; rm -rf "$tmp"' EXIT
started=$(date +%s)

# check NAME CMD...: CMD must succeed.
# expect_fail NAME PATTERN CMD...: CMD must fail, and with the intended error:
# its output must match the extended regex PATTERN. A negative check that
# fails for another reason (a missing tool, a broken copy that breaks
# something else, a usage error) is a failed check, not a pass.
# The output of a check that goes the wrong way is shown, indented.
run_check() {
    local want=$1 name=$2 pattern=""; shift 2
    if [ "$want" = fail ]; then pattern=$1; shift; fi
    local out="$tmp/out" rc t0=$SECONDS took="" why=""
    "$@" >"$out" 2>&1
    rc=$?
    [ $((SECONDS - t0)) -ge 2 ] && took=" ($((SECONDS - t0))s)"
    if [ "$want" = fail ] && [ $rc -ne 0 ] && ! grep -Eq -- "$pattern" "$out"; then
        why=", but not with the intended error /$pattern/"
    fi
    if [ -z "$why" ] && { { [ "$want" = ok ] && [ $rc -eq 0 ]; } || { [ "$want" = fail ] && [ $rc -ne 0 ]; }; }; then
        passed=$((passed + 1))
        echo "ok   $name$took"
    else
        failed=$((failed + 1))
        echo "FAIL $name (exit $rc$why)$took"
        sed 's/^/     /' "$out" | tail -40
    fi
}
check() { run_check ok "$@"; }
expect_fail() { run_check fail "$@"; }
# broken PATTERN FILE CMD...: run CMD, but first make sure the broken copy FILE
# really holds the breakage, so a negative check never passes for a wrong reason.
broken() {
    local pattern=$1 file=$2; shift 2
    grep -q -- "$pattern" "$file" || { echo "$file does not contain '$pattern'"; return 0; }
    "$@"
}
# skip REASON: counted; tests/run fails a skip tests/suites does not declare.
skipped=0
skip() { skipped=$((skipped + 1)); echo "skip $1"; }

# --- tools ------------------------------------------------------------------

# go_tool NAME VERSION PACKAGE [LDFLAGS]: build once into $TOOLS/NAME-VERSION/NAME.
go_tool() {
    local name=$1 version=$2 pkg=$3 ldflags=${4:-}
    local dir="$TOOLS/$name-$version"
    if [ ! -x "$dir/$name" ]; then
        echo "tools: building $name $version with go install (once; cached in $dir)" >&2
        local t0; t0=$(date +%s)
        mkdir -p "$dir.tmp"
        (cd "$tmp" && GOFLAGS=-buildvcs=false GOBIN="$dir.tmp" \
            go install -ldflags "-s -w $ldflags" "$pkg@$version") >&2 || return 1
        rm -rf "$dir" && mv "$dir.tmp" "$dir"
        echo "tools: $name built in $(( $(date +%s) - t0 ))s" >&2
    fi
    echo "$dir/$name"
}

py_tools() {
    local sum; sum=$(sha256sum tests/deploy/requirements.txt | cut -c1-12)
    local dir="$TOOLS/py-$sum"
    if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c "import yaml, promql_parser" 2>/dev/null; then
        echo "tools: preparing $dir (tests/deploy/requirements.txt)" >&2
        rm -rf "$dir"
        python3 -m venv "$dir" >&2 &&
            "$dir/bin/pip" install -q --disable-pip-version-check -r tests/deploy/requirements.txt >&2 ||
            return 1
    fi
    echo "$dir/bin/python"
}

command -v go >/dev/null || { echo "FAIL go is not installed (needed to build helm and kubectl-validate)"; echo "0 passed, 1 failed"; exit 1; }
helm_ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$HELM_K8S_MINOR
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM_K8S_MINOR"
helm_tool() { go_tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "$helm_ldflags"; }
kv_tool() { go_tool kubectl-validate "$KUBECTL_VALIDATE_VERSION" sigs.k8s.io/kubectl-validate; }
# The first run builds both at once: the module downloads of one overlap the compiling of the other.
if [ ! -x "$TOOLS/helm-$HELM_VERSION/helm" ] && [ ! -x "$TOOLS/kubectl-validate-$KUBECTL_VALIDATE_VERSION/kubectl-validate" ]; then
    helm_tool >/dev/null &
    kv_tool >/dev/null
    wait
fi
HELM=$(helm_tool) || HELM=""
KV=$(kv_tool) || KV=""
PY=$(py_tools) || PY=""
if [ "${1:-}" = "--tools" ]; then
    echo "helm: ${HELM:-FAILED}"; echo "kubectl-validate: ${KV:-FAILED}"; echo "python: ${PY:-FAILED}"
    [ -n "$HELM" ] && [ -n "$KV" ] && [ -n "$PY" ]
    exit
fi
check "helm $HELM_VERSION is built" test -n "$HELM"
check "kubectl-validate $KUBECTL_VALIDATE_VERSION is built" test -n "$KV"
check "python tools (PyYAML, promql-parser) are installed" test -n "$PY"
[ -n "$HELM" ] || HELM=false
[ -n "$KV" ] || KV=false
[ -n "$PY" ] || PY=false
echo "tools ready after $(( $(date +%s) - started ))s"

# kubectl-validate offline: the embedded schemas of --version, never a cluster.
# validate checks against both the oldest supported and the newest version.
validate_at() { local v=$1; shift; env -u KUBECONFIG HOME="$tmp/home" "$KV" --version "$v" "$@"; }
validate() { validate_at "$K8S_MIN_VERSION" "$@" && validate_at "$K8S_VERSION" "$@"; }
helm_() { env HOME="$tmp/home" XDG_CACHE_HOME="$tmp/home/cache" XDG_CONFIG_HOME="$tmp/home/config" \
    XDG_DATA_HOME="$tmp/home/data" "$HELM" "$@"; }
chart=deploy/helm/idemproxy
render() { helm_ template idemproxy "$chart" --kube-version "$K8S_VERSION.0" "$@"; }
render_to() { local out=$1; shift; render "$@" >"$out" && test -s "$out"; }
mkdir -p "$tmp/home"

# --- images -----------------------------------------------------------------

stage=build/docker
multiarch=$(gcc -print-multiarch 2>/dev/null || dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
# The image's build stage has no .git: the commit comes as a build argument
# (COMMIT), which build.sh hands to make. Staged here with one git never made, so
# the staged binary shows it got through; build/idemproxy is rebuilt with the
# real commit after the image checks.
image_commit=feedc0de1234
check "docker build steps: idemproxy image staged (COMMIT=$image_commit, as the Dockerfile's build argument)" \
    env COMMIT=$image_commit deploy/docker/build.sh idemproxy "$stage/idemproxy"
check "docker build steps: worker image staged" deploy/docker/build.sh worker "$stage/worker"
# The runtime stage without Docker: a root holding glibc (as the slim base has
# it), the files of the packages the runtime stage installs (STAGE.packages, as
# apt-get would unpack them) and the staged tree.
make_root() {  # make_root DIR STAGED_TREE
    mkdir -p "$1" && cp -a "$2/." "$1/" || return 1
    local f pkgs
    pkgs=$(cat "$2.packages") || return 1
    # What apt-get install also does for ca-certificates: openssl, its dependency
    # (OPENSSLDIR/cert.pem), and the bundle its postinst builds.
    case " $(echo $pkgs) " in *" ca-certificates "*) pkgs="$pkgs openssl" ;; esac
    for f in $(dpkg -L libc6); do
        case "$f" in
        */lib*/*.so*|*/lib*/ld-linux*)
            if [ -f "$f" ] || [ -L "$f" ]; then
                mkdir -p "$1$(dirname "$f")" && cp -a "$f" "$1$f" || return 1
            fi ;;
        esac
    done
    for f in $(dpkg -L $pkgs); do
        if { [ -f "$f" ] || [ -L "$f" ]; } && [ ! -d "$f" ]; then
            mkdir -p "$1$(dirname "$f")" && cp -a "$f" "$1$f" || return 1
        fi
    done
    case " $(echo $pkgs) " in *" ca-certificates "*)
        mkdir -p "$1/etc/ssl/certs" && cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/" || return 1 ;;
    esac
}
make_root "$tmp/root-px" "$stage/idemproxy" && make_root "$tmp/root-w" "$stage/worker"
libpath() { echo "$1/usr/lib/$multiarch:$1/lib/$multiarch"; }
check "staged idemproxy --version runs on the packages' libraries" \
    env LD_LIBRARY_PATH="$(libpath "$tmp/root-px")" "$tmp/root-px/usr/local/bin/idemproxy" --version
check "staged example_worker --help runs on the packages' libraries" \
    env LD_LIBRARY_PATH="$(libpath "$tmp/root-w")" "$tmp/root-w/usr/local/bin/example_worker" --help
# version_is WANT CMD...: CMD prints exactly WANT.
version_is() {
    local want=$1 got; shift
    got=$("$@") || return 1
    echo "$got"
    [ "$got" = "$want" ] || { echo "want: $want"; return 1; }
}
check "the staged idemproxy reports the commit of the build argument (idemproxy version)" \
    version_is "idemproxy $(sed -n 's/^#define PX_VERSION "\(.*\)"/\1/p' proxy/px.h) (commit $image_commit)" \
    env LD_LIBRARY_PATH="$(libpath "$tmp/root-px")" "$tmp/root-px/usr/local/bin/idemproxy" version
expect_fail "negative: build.sh refuses a COMMIT that is no commit id (it becomes a C string)" \
    "COMMIT 'a\"b' is not a commit id" env COMMIT='a"b' deploy/docker/build.sh --no-install idemproxy "$tmp/stage-bad"
# make images: docker build with the commit and version as build arguments (no
# Docker here: DOCKER=echo prints the commands it would run).
images_pass_commit() {
    local out want_commit; want_commit=$(git rev-parse --short=12 HEAD) || return 1
    out=$(make -s --no-print-directory images DOCKER=echo) || return 1
    echo "$out"
    [ "$(grep -c -- "--build-arg COMMIT=$want_commit --build-arg VERSION=0.1.0 " <<<"$out")" = 2 ] &&
        grep -q -- '-f deploy/docker/Dockerfile -t idemproxy:0.1.0 \.$' <<<"$out" &&
        grep -q -- '-f deploy/docker/Dockerfile.worker -t idemproxy-example-worker:0.1.0 \.$' <<<"$out"
}
check "make images passes the git commit and PX_VERSION to both docker builds" images_pass_commit

# Every library the loader resolves for the staged binary is in its root: the
# listed packages' or glibc's.
only_packaged_libs() {
    local tree=$1 bin=$2 bad=0 soname path
    while read -r soname path; do
        case "$path" in "$tree"/*) continue ;; esac
        echo "$soname resolves to $path: not in the listed packages"; bad=1
    done < <(LD_LIBRARY_PATH="$(libpath "$tree")" ldd "$tree/$bin" | awk '$2 == "=>" { print $1, $3 }')
    return $bad
}
check "idemproxy needs no library beyond the listed packages and glibc" only_packaged_libs "$tmp/root-px" usr/local/bin/idemproxy
check "example_worker needs no library beyond the listed packages and glibc" only_packaged_libs "$tmp/root-w" usr/local/bin/example_worker
mkdir -p "$tmp/short" && cp -a "$stage/idemproxy/." "$tmp/short/" &&
    grep -v '^libyaml-0-2$' "$stage/idemproxy.packages" >"$tmp/short.packages" &&
    make_root "$tmp/root-short" "$tmp/short"
expect_fail "negative: a package list without libyaml-0-2 is caught" 'libyaml-0\.so\.2 resolves to' \
    only_packaged_libs "$tmp/root-short" usr/local/bin/idemproxy

# The system CA store in the idemproxy image (a rediss:// url with no ca_file):
# Debian's bundle, and OPENSSLDIR/cert.pem, where SSL_CTX_set_default_verify_paths
# looks, pointing at it (the packages ca-certificates and openssl). The pod smoke
# tests below show OpenSSL reading it.
ca_store() {  # ca_store TREE
    local tree=$1 dir n
    dir=$(strings "$tree"/usr/lib/"$multiarch"/libcrypto.so.* | sed -n 's/^OPENSSLDIR: "\(.*\)"$/\1/p' | head -1)
    echo "OPENSSLDIR of the packaged libcrypto: ${dir:-none}"
    [ "$(readlink "$tree$dir/cert.pem")" = /etc/ssl/certs/ca-certificates.crt ] ||
        { echo "$dir/cert.pem is not a link to /etc/ssl/certs/ca-certificates.crt"; return 1; }
    n=$(grep -c "BEGIN CERTIFICATE" "$tree/etc/ssl/certs/ca-certificates.crt" 2>/dev/null)
    echo "/etc/ssl/certs/ca-certificates.crt: ${n:-0} certificates"
    [ "${n:-0}" -ge 100 ]
}
check "the idemproxy image holds Debian's CA bundle where OpenSSL looks by default" ca_store "$tmp/root-px"
mkdir -p "$tmp/no-ca" && cp -a "$tmp/root-px/." "$tmp/no-ca/" && rm -f "$tmp/no-ca/etc/ssl/certs/ca-certificates.crt"
expect_fail "negative: a tree without the bundle is refused" 'ca-certificates\.crt: 0 certificates' ca_store "$tmp/no-ca"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
http_code() { "$PY" -c 'import sys, urllib.request as u
try: print(u.urlopen(sys.argv[1], timeout=2).status)
except Exception as e: print(getattr(e, "code", 0))' "$1"; }

# The pod without Kubernetes: one root holding glibc and both staged trees,
# idemproxy as uid 10001 and the worker as uid 10002 in group 10001 (as the
# Deployment runs them), the ipc socket in a setgid directory of group 10001
# (what fsGroup makes of the emptyDir), the Redis password in a file readable by
# that group (the Secret), and the config of deploy/k8s/configmap.yaml with only
# the Redis address and the metrics port changed. A real redis-server.
# pod_smoke tls: the same with deploy/k8s/tls/configmap.yaml, the CA and the
# client pair in the Secret's directory (mode 0440, group 10001), and a
# redis-server that speaks only TLS and wants a client certificate.
# pod_smoke tls-system-ca: the same with no ca_file in the config and the test CA
# added to the image's bundle, as a public CA is there: the system store is read.
# pod_smoke tls-system-ca-unknown: no ca_file and the bundle as staged: refused.
pod_smoke() {
    local mode=${1:-plain} pod=$tmp/pod rport mport rpid="" ppid="" wpid="" ok=1 i
    local src=$tmp/k8s-config.yaml scheme=redis tlsargs=() cliargs=()
    if [ "$mode" != plain ]; then
        pod=$tmp/pod-$mode src=$tmp/k8s-tls-config.yaml scheme=rediss
        cliargs=(--tls --cacert "$tmp/certs/ca.crt" --cert "$tmp/certs/tls.crt" --key "$tmp/certs/tls.key")
        tlsargs=(--port 0 --tls-port) # then the port
    fi
    make_root "$pod" "$stage/idemproxy" && make_root "$pod" "$stage/worker" || return 1
    install -d -o 10001 -g 10001 -m 2770 "$pod/run/idemproxy"
    # A container has /proc (the process_* metrics are read from it).
    install -d -m 0555 "$pod/proc"
    mount -t proc proc "$pod/proc" || { echo "cannot mount /proc in the pod's root"; return 1; }
    install -d -m 0755 "$pod/etc/idemproxy" "$pod/var/run/secrets/redis"
    printf 'pod-secret\n' >"$pod/var/run/secrets/redis/password"
    chown 0:10001 "$pod/var/run/secrets/redis/password" && chmod 0440 "$pod/var/run/secrets/redis/password"
    if [ "$mode" != plain ]; then
        install -d -m 0755 "$pod/var/run/secrets/redis-tls"
        install -o 0 -g 10001 -m 0440 "$tmp/certs/ca.crt" "$tmp/certs/tls.crt" "$tmp/certs/tls.key" \
            "$pod/var/run/secrets/redis-tls/" || return 1
        # The server's certificate, for 127.0.0.1, from the same CA.
        printf 'subjectAltName=IP:127.0.0.1\n' >"$tmp/certs/server.ext"
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$tmp/certs/server.key" \
            -out "$tmp/certs/server.csr" -subj /CN=redis 2>/dev/null &&
            openssl x509 -req -in "$tmp/certs/server.csr" -CA "$tmp/certs/ca.crt" -CAkey "$tmp/certs/ca.key" \
                -CAcreateserial -extfile "$tmp/certs/server.ext" -out "$tmp/certs/server.crt" -days 2 2>/dev/null ||
            { echo "cannot make the server's certificate"; return 1; }
    fi
    rport=$(free_port) && mport=$(free_port) || return 1
    [ "$mode" != plain ] && tlsargs+=("$rport" --tls-cert-file "$tmp/certs/server.crt" --tls-key-file "$tmp/certs/server.key"
        --tls-ca-cert-file "$tmp/certs/ca.crt" --tls-auth-clients yes)
    sed -e "s#url: $scheme://redis:6379#url: $scheme://127.0.0.1:$rport#" \
        -e "s#listen: 0.0.0.0:9464#listen: 0.0.0.0:$mport#" \
        "$src" >"$pod/etc/idemproxy/idemproxy.yaml"
    if [ "$mode" = tls-system-ca ] || [ "$mode" = tls-system-ca-unknown ]; then
        sed -i '/^ *ca_file:/d' "$pod/etc/idemproxy/idemproxy.yaml"
        [ "$mode" = tls-system-ca ] && cat "$tmp/certs/ca.crt" >>"$pod/etc/ssl/certs/ca-certificates.crt"
    fi
    grep -q "$scheme://127.0.0.1:$rport" "$pod/etc/idemproxy/idemproxy.yaml" &&
        grep -q "0.0.0.0:$mport" "$pod/etc/idemproxy/idemproxy.yaml" || { echo "config not rewritten"; return 1; }
    # Each under timeout: nothing outlives a check that goes wrong.
    timeout -k 5 90 redis-server --port "$rport" "${tlsargs[@]}" --bind 127.0.0.1 --save '' --appendonly no \
        --requirepass pod-secret --dir "$tmp" >"$tmp/redis.log" 2>&1 &
    rpid=$!
    HOSTNAME=pod-1 timeout --foreground -k 5 60 chroot --userspec=10001:10001 "$pod" /usr/local/bin/idemproxy \
        -c /etc/idemproxy/idemproxy.yaml >"$tmp/idemproxy.log" 2>&1 &
    ppid=$!
    IDEMPROXY_ENDPOINT=ipc:///run/idemproxy/app.sock timeout --foreground -k 5 60 chroot --userspec=10002:10001 "$pod" \
        /usr/local/bin/example_worker >"$tmp/worker.out" 2>"$tmp/worker.err" &
    wpid=$!
    for i in $(seq 100); do [ "$(http_code "http://127.0.0.1:$mport/readyz")" = 200 ] && break; sleep 0.1; done
    if [ "$(http_code "http://127.0.0.1:$mport/readyz")" != 200 ]; then
        echo "/readyz never 200 (Redis: $mode, a password from password_file)"; ok=0
    fi
    # Refused as it should be: the rest (copies, metrics, drain) would only wait out
    # its timeouts (about 100 s of CI time); stop here with the log.
    if [ "$mode" = tls-system-ca-unknown ] && [ "$ok" = 0 ]; then
        kill -TERM "$wpid" "$ppid" "$rpid" 2>/dev/null; wait "$wpid" "$ppid" "$rpid" 2>/dev/null
        umount "$pod/proc"
        echo "--- idemproxy log"; tail -20 "$tmp/idemproxy.log"
        return 1
    fi
    if ! HOSTNAME=pod-1 chroot --userspec=10001:10001 "$pod" /usr/local/bin/idemproxy health \
            -c /etc/idemproxy/idemproxy.yaml; then
        echo "the HEALTHCHECK command says unhealthy while idemproxy runs"; ok=0
    fi
    for i in 1 2; do
        redis-cli -p "$rport" "${cliargs[@]}" -a pod-secret --no-auth-warning \
            XADD room '*' payload '{"eventId":"smoke-1"}' >/dev/null || ok=0
    done
    # The copy leaves as a duplicate once the first is done (a busy copy is
    # looked at again later): wait for that, and for the group's numbers from
    # the first XINFO GROUPS (1 s after the start), then count what the worker got.
    scrape() { "$PY" -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=2).read().decode())' \
        "http://127.0.0.1:$mport/metrics" >"$tmp/live-metrics.txt"; }
    for i in $(seq 150); do
        scrape && grep -q 'idemproxy_outcomes_total{stream="room",group="game-server",outcome="duplicate"} 1$' "$tmp/live-metrics.txt" &&
            grep -q '^idemproxy_group_lag{stream="room",group="game-server"} 0$' "$tmp/live-metrics.txt" && break
        sleep 0.1
    done
    grep -q 'idemproxy_outcomes_total{stream="room",group="game-server",outcome="duplicate"} 1$' "$tmp/live-metrics.txt" ||
        { echo "/metrics does not count the copy as a duplicate within 15 s"; ok=0; }
    grep -q 'idemproxy_outcomes_total{stream="room",group="game-server",outcome="acked"} 1$' "$tmp/live-metrics.txt" ||
        { echo "/metrics does not count the first as acked"; ok=0; }
    grep -q '^idemproxy_group_lag{stream="room",group="game-server"} 0$' "$tmp/live-metrics.txt" ||
        { echo "/metrics has no group lag of 0 within 15 s"; ok=0; }
    if [ "$(grep -c '^smoke-1 ' "$tmp/worker.out")" != 1 ]; then
        echo "the worker got smoke-1 $(grep -c '^smoke-1 ' "$tmp/worker.out") times, want 1"; ok=0
    fi
    kill -TERM "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null
    kill -TERM "$ppid" 2>/dev/null
    if ! wait "$ppid"; then echo "idemproxy did not exit 0 on SIGTERM"; ok=0; fi
    if HOSTNAME=pod-1 chroot --userspec=10001:10001 "$pod" /usr/local/bin/idemproxy health \
            -c /etc/idemproxy/idemproxy.yaml 2>/dev/null; then
        echo "the HEALTHCHECK command says healthy after idemproxy stopped"; ok=0
    fi
    kill "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null
    umount "$pod/proc" || ok=0
    if [ "$ok" != 1 ]; then
        echo "--- idemproxy log"; tail -20 "$tmp/idemproxy.log"
        echo "--- worker"; tail -n 5 "$tmp/worker.out" "$tmp/worker.err"
        return 1
    fi
    echo "one delivery for two copies; healthy while running, unhealthy after SIGTERM"
}

if [ "$(id -u)" = 0 ] && command -v chroot >/dev/null; then
    check "idemproxy --version in a root of glibc + the packages + the staged tree" chroot "$tmp/root-px" /usr/local/bin/idemproxy --version
    check "example_worker --help in a root of glibc + the packages + the staged tree" chroot "$tmp/root-w" /usr/local/bin/example_worker --help
    rm -f "$tmp/root-px/usr/lib/$multiarch/libyaml-0.so.2"
    expect_fail "negative: idemproxy fails in that root without one packaged library" 'libyaml-0\.so\.2: cannot open shared object file' \
        chroot "$tmp/root-px" /usr/local/bin/idemproxy --version
    chroot_ok=1
else
    skip "chroot checks of the staged trees (need root)"
    chroot_ok=0
fi
check "Dockerfile: build stage runs build.sh with ARG COMMIT, non-root runtime, health check, staged entrypoint, OCI labels" \
    "$PY" tests/deploy/check_dockerfiles.py deploy/docker/Dockerfile idemproxy "$stage/idemproxy"
check "Dockerfile.worker: build stage runs build.sh, non-root runtime, staged entrypoint, OCI labels" \
    "$PY" tests/deploy/check_dockerfiles.py deploy/docker/Dockerfile.worker worker "$stage/worker"
sed 's/^USER .*/USER root/' deploy/docker/Dockerfile >"$tmp/Dockerfile"
cp deploy/docker/Dockerfile.dockerignore "$tmp/Dockerfile.dockerignore"
expect_fail "negative: a Dockerfile whose runtime runs as root is refused" 'USER root: want a numeric non-root uid' \
    broken "^USER root" "$tmp/Dockerfile" "$PY" tests/deploy/check_dockerfiles.py "$tmp/Dockerfile" idemproxy "$stage/idemproxy"
sed 's#--mount=type=bind,from=build,source=/stage.packages,target=/tmp/runtime-packages ##' \
    deploy/docker/Dockerfile >"$tmp/Dockerfile"
expect_fail "negative: a runtime stage that installs other than the staged package list is refused" \
    'uses a package manager other than to install /stage\.packages' \
    broken "^RUN *\\\\$" "$tmp/Dockerfile" "$PY" tests/deploy/check_dockerfiles.py "$tmp/Dockerfile" idemproxy "$stage/idemproxy"
awk '/^FROM .* AS build/ { b = 1 } /^FROM debian:12-slim$/ { b = 0 } !(b && /^ARG COMMIT/)' \
    deploy/docker/Dockerfile >"$tmp/Dockerfile"
expect_fail "negative: an idemproxy build stage without ARG COMMIT is refused (the binary would report no commit)" \
    'the build stage has no ARG COMMIT' \
    broken 'COMMIT="\$COMMIT" deploy/docker/build.sh' "$tmp/Dockerfile" \
    "$PY" tests/deploy/check_dockerfiles.py "$tmp/Dockerfile" idemproxy "$stage/idemproxy"
sed '/org\.opencontainers\.image\.revision=/d' deploy/docker/Dockerfile.worker >"$tmp/Dockerfile"
cp deploy/docker/Dockerfile.worker.dockerignore "$tmp/Dockerfile.dockerignore"
expect_fail "negative: a Dockerfile without the OCI revision label is refused" \
    'no LABEL org\.opencontainers\.image\.revision' \
    broken 'image.version="\$VERSION"' "$tmp/Dockerfile" "$PY" tests/deploy/check_dockerfiles.py "$tmp/Dockerfile" worker "$stage/worker"
sed 's/^ARG VERSION=.*/ARG VERSION=0.0.9/' deploy/docker/Dockerfile >"$tmp/Dockerfile"
cp deploy/docker/Dockerfile.dockerignore "$tmp/Dockerfile.dockerignore"
expect_fail "negative: an ARG VERSION other than proxy/px.h's PX_VERSION is refused" \
    'ARG VERSION=0\.0\.9: proxy/px\.h says PX_VERSION' \
    broken "^ARG VERSION=0.0.9" "$tmp/Dockerfile" "$PY" tests/deploy/check_dockerfiles.py "$tmp/Dockerfile" idemproxy "$stage/idemproxy"
# build/idemproxy back to the commit of the work tree (make rewrites build/gen/git_commit.h).
check "build/idemproxy rebuilt with the work tree's commit" make -s --no-print-directory build/idemproxy

# --- Kubernetes manifests ---------------------------------------------------

check "deploy/k8s validates against the Kubernetes $K8S_MIN_VERSION and $K8S_VERSION schemas" validate deploy/k8s/
expect_fail "negative: kubectl-validate rejects the native sidecar against the 1.27 schemas" 'initContainers\[0\]\.restartPolicy: Invalid value: value provided for unknown field' \
    validate_at 1.27 deploy/k8s/deployment.yaml
check "deploy/k8s: sidecar, ports, probes, mounts, grace period and PDB fit together" \
    "$PY" tests/deploy/manifests.py consistency deploy/k8s
mkdir -p "$tmp/bad1" "$tmp/bad2" "$tmp/bad3"
sed 's/^\( *\)restartPolicy: Always.*/&\n\1restartPolicyy: Always/' deploy/k8s/deployment.yaml >"$tmp/bad1/deployment.yaml"
expect_fail "negative: kubectl-validate rejects an unknown field" 'initContainers\[0\]\.restartPolicyy: Invalid value: value provided for unknown field' \
    broken restartPolicyy "$tmp/bad1/deployment.yaml" validate "$tmp/bad1/"
sed 's/^  replicas: 2$/  replicas: two/' deploy/k8s/deployment.yaml >"$tmp/bad2/deployment.yaml"
expect_fail "negative: kubectl-validate rejects a wrong type" 'spec\.replicas in body must be of type integer' \
    broken "replicas: two" "$tmp/bad2/deployment.yaml" validate "$tmp/bad2/"
cp deploy/k8s/*.yaml "$tmp/bad3/"
sed -i 's/terminationGracePeriodSeconds: 30/terminationGracePeriodSeconds: 10/' "$tmp/bad3/deployment.yaml"
expect_fail "negative: a grace period not above shutdown_grace_ms is caught" 'terminationGracePeriodSeconds 10 does not exceed shutdown_grace_ms 10000' \
    broken "terminationGracePeriodSeconds: 10" "$tmp/bad3/deployment.yaml" "$PY" tests/deploy/manifests.py consistency "$tmp/bad3"

# --- the chart --------------------------------------------------------------

check "helm lint --strict" helm_ lint --strict --kube-version "$K8S_VERSION.0" "$chart"
check "helm lint --strict with non-default values" \
    helm_ lint --strict --kube-version "$K8S_VERSION.0" "$chart" -f tests/deploy/values/custom.yaml
check "the chart renders with default values" render_to "$tmp/default.yaml"
check "the chart renders with non-default values" render_to "$tmp/custom.yaml" -f tests/deploy/values/custom.yaml
check "the rendered chart (defaults) validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/default.yaml"
check "the rendered chart (non-default values) validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/custom.yaml"
# deploy/k8s is the chart with a password from the Secret you create (idemproxy-redis).
check "the chart renders with redis.existingSecret=idemproxy-redis" \
    render_to "$tmp/k8s-values.yaml" --set redis.existingSecret=idemproxy-redis
check "the chart with redis.existingSecret=idemproxy-redis renders the same Deployment, ConfigMap, PDB and NetworkPolicy as deploy/k8s" \
    "$PY" tests/deploy/manifests.py compare deploy/k8s "$tmp/k8s-values.yaml"
check "the rendered chart (non-default values) fits together" \
    "$PY" tests/deploy/manifests.py consistency "$tmp/custom.yaml"
# app_container_is RENDERED JSON: the app container's ports, envFrom and probes are JSON.
app_container_is() {
    local got; got=$("$PY" -c 'import sys, json, yaml
d = next(o for o in yaml.safe_load_all(open(sys.argv[1])) if o and o["kind"] == "Deployment")
c = d["spec"]["template"]["spec"]["containers"][0]
print(json.dumps({k: c[k] for k in ("ports", "envFrom", "startupProbe", "livenessProbe", "readinessProbe") if k in c},
                 sort_keys=True))' "$1") || return 1
    echo "app container: $got"
    [ "$got" = "$2" ] || { echo "want:          $2"; return 1; }
}
check "non-default values: the app container has its ports, envFrom and probes (worker.*)" app_container_is "$tmp/custom.yaml" \
    '{"envFrom": [{"configMapRef": {"name": "orders-settings"}}], "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 20}, "ports": [{"containerPort": 8080, "name": "http"}], "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}}}'
check "defaults: the example worker has no ports, envFrom or probes" app_container_is "$tmp/default.yaml" '{}'
expect_fail "negative: the values schema refuses a worker port without containerPort" \
    "at '/worker/ports/0': missing property 'containerPort'" render --set 'worker.ports[0].name=http'
render --set redis.existingSecret=idemproxy-redis --set replicaCount=3 >"$tmp/three.yaml" 2>&1
expect_fail "negative: the comparison sees a changed value" '^ *\+  replicas: 3$' \
    broken "replicas: 3" "$tmp/three.yaml" "$PY" tests/deploy/manifests.py compare deploy/k8s "$tmp/three.yaml"
render --set podSecurityContext.runAsNonRot=true >"$tmp/typo.yaml" 2>&1
expect_fail "negative: kubectl-validate rejects a rendered chart with an unknown field" 'securityContext\.runAsNonRot: Invalid value: value provided for unknown field' \
    broken "runAsNonRot: true" "$tmp/typo.yaml" validate "$tmp/typo.yaml"
expect_fail "negative: the chart refuses terminationGracePeriodSeconds <= shutdown_grace_ms" 'terminationGracePeriodSeconds \(10\) must exceed config\.shutdown_grace_ms \(10000 ms\)' \
    render --set terminationGracePeriodSeconds=10
expect_fail "negative: the values schema refuses values without streams" "missing property 'streams'" render --set streams=null
printf 'streams: []\n' >"$tmp/no-streams.yaml"
expect_fail "negative: the values schema refuses an empty stream list" "at '/streams': minItems: got 0, want 1" \
    render -f "$tmp/no-streams.yaml"
expect_fail "negative: the values schema refuses a stream rule without a stream" "at '/streams/0': missing property 'stream'" \
    render --set 'streams[0].stream=' --set 'streams[0].key=#event.id'
cp -r "$chart" "$tmp/badchart"
printf '{{ .Values.replicaCount \n' >>"$tmp/badchart/templates/deployment.yaml"
expect_fail "negative: helm lint fails on a broken template" 'parse error at \(idemproxy/templates/deployment\.yaml:[0-9]+\): unclosed action' helm_ lint --strict --kube-version "$K8S_VERSION.0" "$tmp/badchart"

# --- the idemproxy config ---------------------------------------------------

# check_config FILE: `idemproxy check` passes, and warns about nothing (an
# unset ${VAR} would warn). HOSTNAME is what the pod has; check --files reads
# the password file and loads the TLS files, which the pod has mounted from its
# Secrets: files here ($tmp/certs: a CA and a client pair it signed, by openssl).
check_config() {
    local out cfg="$tmp/checked-$(basename "$1")"
    printf 'pod-secret\n' >"$tmp/password"
    sed -E -e "s#^( *password_file: *)[^ ]+#\1$tmp/password#" \
        -e "s#^( *(ca|cert|key)_file: *)[^ ]*/([^/ ]+)#\1$tmp/certs/\3#" "$1" >"$cfg"
    out=$(HOSTNAME=idemproxy-7d9c5b6f4-x2x8q "$IDEMPROXY_BIN" check -c "$cfg" --files 2>&1) || { echo "$out"; return 1; }
    echo "$out"
    ! grep -qi warning <<<"$out"
}
"$PY" tests/deploy/manifests.py config deploy/k8s "$tmp/k8s-config.yaml"
check "idemproxy check: the config of deploy/k8s/configmap.yaml" check_config "$tmp/k8s-config.yaml"
"$PY" tests/deploy/manifests.py config "$tmp/default.yaml" "$tmp/chart-config.yaml"
check "idemproxy check: the config the chart renders (defaults)" check_config "$tmp/chart-config.yaml"
"$PY" tests/deploy/manifests.py config "$tmp/k8s-values.yaml" "$tmp/k8s-values-config.yaml"
check "idemproxy check without --files: the chart's config with a password_file, its Secret not mounted (hermetic)" \
    bash -c 'grep -q password_file "$1" && "$2" check -c "$1"' _ "$tmp/k8s-values-config.yaml" "$IDEMPROXY_BIN"
"$PY" tests/deploy/manifests.py config "$tmp/custom.yaml" "$tmp/custom-config.yaml"
check "idemproxy check: the config the chart renders (non-default values)" check_config "$tmp/custom-config.yaml"
render --set 'redis.cluster={redis-0.redis:6379,redis-1.redis:6379}' >"$tmp/cluster.yaml" 2>&1
"$PY" tests/deploy/manifests.py config "$tmp/cluster.yaml" "$tmp/cluster-config.yaml"
check "idemproxy check: the config the chart renders with redis.cluster seeds" check_config "$tmp/cluster-config.yaml"
check "the chart renders redis.cluster instead of redis.url when seeds are given" \
    bash -c "grep -q 'redis-1.redis:6379' '$tmp/cluster-config.yaml' && ! grep -q 'url:' '$tmp/cluster-config.yaml'"
expect_fail "negative: the values schema refuses a cluster seed without a port" "'redis-0\.redis' does not match pattern" \
    render --set 'redis.cluster={redis-0.redis}'
sed 's/lease_ms: 5000/lease_ms: 1000/' "$tmp/k8s-config.yaml" >"$tmp/bad-config.yaml"
expect_fail "negative: idemproxy check refuses a broken copy (lease_ms < 2 x timeout_ms)" 'streams\[0\]\.lease_ms: 1000 is less than twice redis\.timeout_ms \(1000\)' \
    broken "lease_ms: 1000" "$tmp/bad-config.yaml" check_config "$tmp/bad-config.yaml"

# --- TLS and the password (issue 16) ---------------------------------------

make_certs() {
    local d=$tmp/certs ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    mkdir -p "$d" &&
        openssl req -x509 "${ec[@]}" -keyout "$d/ca.key" -out "$d/ca.crt" -days 2 -subj /CN=test-redis-ca 2>&1 &&
        openssl req "${ec[@]}" -keyout "$d/tls.key" -out "$d/tls.csr" -subj /CN=idemproxy 2>&1 &&
        openssl x509 -req -in "$d/tls.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
            -out "$d/tls.crt" -days 2 2>&1
}
# redis_is CONFIG JSON: the config's redis section (without timeout_ms) is JSON.
redis_is() {
    local got; got=$("$PY" -c 'import sys, json, yaml
r = yaml.safe_load(open(sys.argv[1]))["redis"]; r.pop("timeout_ms", None)
print(json.dumps(r, sort_keys=True))' "$1") || return 1
    echo "redis: $got"
    [ "$got" = "$2" ] || { echo "want:  $2"; return 1; }
}
# secrets_are RENDERED JSON: the Secrets the manifests create and the Secret
# volumes of the idemproxy sidecar (name: [secretName, item keys, mount path,
# readOnly]) are JSON.
secrets_are() {
    local got; got=$("$PY" -c 'import sys, json, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
pod = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]
px = next(c for c in pod["initContainers"] if c["name"] == "idemproxy")
mounts = {m["name"]: m for m in px["volumeMounts"]}
vols = {v["name"]: [v["secret"]["secretName"], [i["key"] for i in v["secret"].get("items", [])],
                    mounts[v["name"]]["mountPath"], mounts[v["name"]].get("readOnly", False)]
        for v in pod["volumes"] if "secret" in v}
print(json.dumps({"created": sorted(o["metadata"]["name"] for o in objs if o["kind"] == "Secret"),
                  "volumes": vols}, sort_keys=True))' "$1") || return 1
    echo "secrets: $got"
    [ "$got" = "$2" ] || { echo "want:    $2"; return 1; }
}
check "openssl makes a test CA and a client pair it signed" make_certs
tlsset=(--set redis.tls.enabled=true --set redis.tls.existingSecret=idemproxy-redis-tls)
mkdir -p "$tmp/k8s-tls"
cp deploy/k8s/pdb.yaml deploy/k8s/networkpolicy.yaml deploy/k8s/tls/*.yaml "$tmp/k8s-tls/"
check "deploy/k8s/tls (the TLS variant) validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/k8s-tls/"
check "deploy/k8s/tls: the CA and client pair lie in a read-only Secret volume; the rest fits together" \
    "$PY" tests/deploy/manifests.py consistency "$tmp/k8s-tls"
"$PY" tests/deploy/manifests.py config "$tmp/k8s-tls" "$tmp/k8s-tls-config.yaml"
check "idemproxy check: the config of deploy/k8s/tls/configmap.yaml (its TLS files loaded)" \
    check_config "$tmp/k8s-tls-config.yaml"
check "the chart renders with redis.tls (mutual TLS) and redis.existingSecret" \
    render_to "$tmp/tls.yaml" "${tlsset[@]}" --set redis.tls.clientCertificate=true --set redis.existingSecret=idemproxy-redis
check "the chart with redis.tls (mutual TLS) renders the same objects as deploy/k8s/tls" \
    "$PY" tests/deploy/manifests.py compare "$tmp/k8s-tls" "$tmp/tls.yaml"
check "the rendered chart (mutual TLS) validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/tls.yaml"
"$PY" tests/deploy/manifests.py config "$tmp/tls.yaml" "$tmp/tls-config.yaml"
check "mutual TLS: url rediss://, ca_file, cert_file, key_file from the Secret, verify on" redis_is "$tmp/tls-config.yaml" \
    '{"password_file": "/var/run/secrets/redis/password", "tls": {"ca_file": "/var/run/secrets/redis-tls/ca.crt", "cert_file": "/var/run/secrets/redis-tls/tls.crt", "key_file": "/var/run/secrets/redis-tls/tls.key", "verify": true}, "url": "rediss://redis:6379"}'
check "mutual TLS: the TLS Secret's ca.crt, tls.crt and tls.key mounted read-only beside the password" secrets_are "$tmp/tls.yaml" \
    '{"created": [], "volumes": {"redis-password": ["idemproxy-redis", ["password"], "/var/run/secrets/redis", true], "redis-tls": ["idemproxy-redis-tls", ["ca.crt", "tls.crt", "tls.key"], "/var/run/secrets/redis-tls", true]}}'
check "idemproxy check: the config the chart renders with mutual TLS" check_config "$tmp/tls-config.yaml"
check "the chart renders with tests/deploy/values/tls.yaml (TLS without a client pair, no password)" \
    render_to "$tmp/tls-only.yaml" -f tests/deploy/values/tls.yaml
check "helm lint --strict with tests/deploy/values/tls.yaml" \
    helm_ lint --strict --kube-version "$K8S_VERSION.0" "$chart" -f tests/deploy/values/tls.yaml
check "the rendered chart (TLS without a client pair) validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/tls-only.yaml"
check "the rendered chart (TLS without a client pair) fits together" \
    "$PY" tests/deploy/manifests.py consistency "$tmp/tls-only.yaml"
"$PY" tests/deploy/manifests.py config "$tmp/tls-only.yaml" "$tmp/tls-only-config.yaml"
check "TLS without a client pair: redis:// made rediss://, only ca_file, server_name, no password_file" redis_is "$tmp/tls-only-config.yaml" \
    '{"tls": {"ca_file": "/var/run/secrets/redis-tls/ca.crt", "server_name": "redis.data.example.com", "verify": true}, "url": "rediss://redis-master.data.svc:6380/1"}'
check "TLS without a client pair: only ca.crt mounted, no password Secret created or mounted" secrets_are "$tmp/tls-only.yaml" \
    '{"created": [], "volumes": {"redis-tls": ["redis-ca", ["ca.crt"], "/var/run/secrets/redis-tls", true]}}'
check "idemproxy check: the config the chart renders with TLS without a client pair" check_config "$tmp/tls-only-config.yaml"
render "${tlsset[@]}" --set 'redis.cluster={redis-0.redis:6379,redis-1.redis:6379}' >"$tmp/tls-cluster.yaml" 2>&1
"$PY" tests/deploy/manifests.py config "$tmp/tls-cluster.yaml" "$tmp/tls-cluster-config.yaml"
check "TLS with redis.cluster seeds: redis.tls beside the seeds, no url" redis_is "$tmp/tls-cluster-config.yaml" \
    '{"cluster": ["redis-0.redis:6379", "redis-1.redis:6379"], "tls": {"ca_file": "/var/run/secrets/redis-tls/ca.crt", "verify": true}}'
check "idemproxy check: the config the chart renders with TLS and cluster seeds" check_config "$tmp/tls-cluster-config.yaml"
# A managed Redis signed by a public CA: no Secret, the image's CA bundle verifies.
check "the chart renders a rediss:// url with no TLS values (a public CA)" \
    render_to "$tmp/tls-public.yaml" --set redis.url=rediss://cache.example.net:6380
"$PY" tests/deploy/manifests.py config "$tmp/tls-public.yaml" "$tmp/tls-public-config.yaml"
check "a rediss:// url alone: redis.tls with verify on and no ca_file (the image's CA bundle)" \
    redis_is "$tmp/tls-public-config.yaml" \
    '{"tls": {"verify": true}, "url": "rediss://cache.example.net:6380"}'
check "a rediss:// url alone: no TLS Secret mounted" secrets_are "$tmp/tls-public.yaml" \
    '{"created": [], "volumes": {}}'
check "the rendered chart (a rediss:// url alone) fits together" \
    "$PY" tests/deploy/manifests.py consistency "$tmp/tls-public.yaml"
check "idemproxy check: the config the chart renders for a rediss:// url alone" check_config "$tmp/tls-public-config.yaml"
render_to "$tmp/tls-enabled-only.yaml" --set redis.tls.enabled=true --set redis.tls.serverName=cache.example.net >/dev/null 2>&1
"$PY" tests/deploy/manifests.py config "$tmp/tls-enabled-only.yaml" "$tmp/tls-enabled-only-config.yaml"
check "redis.tls.enabled without a Secret: redis:// made rediss://, server_name, no ca_file" \
    redis_is "$tmp/tls-enabled-only-config.yaml" \
    '{"tls": {"server_name": "cache.example.net", "verify": true}, "url": "rediss://redis:6379"}'
check "redis.tls.enabled without a Secret: no TLS Secret mounted" secrets_are "$tmp/tls-enabled-only.yaml" \
    '{"created": [], "volumes": {}}'
# No password unless one is given (issue 33): the defaults make no Secret.
check "defaults: no password_file in the config (no AUTH)" redis_is "$tmp/chart-config.yaml" '{"url": "redis://redis:6379"}'
check "defaults: no Secret created, none mounted (no placeholder password)" secrets_are "$tmp/default.yaml" '{"created": [], "volumes": {}}'
check "the chart renders with redis.password given" render_to "$tmp/pw.yaml" --set redis.password=s3cret
"$PY" tests/deploy/manifests.py config "$tmp/pw.yaml" "$tmp/pw-config.yaml"
check "redis.password given: the chart creates <fullname>-redis and mounts it as password_file" secrets_are "$tmp/pw.yaml" \
    '{"created": ["idemproxy-redis"], "volumes": {"redis-password": ["idemproxy-redis", ["password"], "/var/run/secrets/redis", true]}}'
check "redis.password given: password_file in the config" redis_is "$tmp/pw-config.yaml" \
    '{"password_file": "/var/run/secrets/redis/password", "url": "redis://redis:6379"}'
check "the rendered chart (redis.password given) validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/pw.yaml"
check "the rendered chart (redis.password given) fits together" "$PY" tests/deploy/manifests.py consistency "$tmp/pw.yaml"
check "the chart renders with tests/deploy/values/sentinel.yaml (Redis Sentinel)" \
    render_to "$tmp/sentinel.yaml" -f tests/deploy/values/sentinel.yaml
check "helm lint --strict with tests/deploy/values/sentinel.yaml" \
    helm_ lint --strict --kube-version "$K8S_VERSION.0" "$chart" -f tests/deploy/values/sentinel.yaml
check "the rendered chart (Sentinel) validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/sentinel.yaml"
check "the rendered chart (Sentinel) fits together (the sentinels' password in a read-only Secret volume)" \
    "$PY" tests/deploy/manifests.py consistency "$tmp/sentinel.yaml"
"$PY" tests/deploy/manifests.py config "$tmp/sentinel.yaml" "$tmp/sentinel-config.yaml"
check "Sentinel: redis.sentinel instead of url, the sentinels' own password_file beside the master's" \
    redis_is "$tmp/sentinel-config.yaml" \
    '{"password_file": "/var/run/secrets/redis/password", "sentinel": {"master_name": "mymaster", "password_file": "/var/run/secrets/redis-sentinel/password", "sentinels": ["redis-node-0.redis-headless:26379", "redis-node-1.redis-headless:26379", "redis-node-2.redis-headless:26379"], "username": "sentinel-reader"}}'
check "Sentinel: the existing Secret's key mounted read-only as the sentinels' password" secrets_are "$tmp/sentinel.yaml" \
    '{"created": [], "volumes": {"redis-password": ["redis", ["redis-password"], "/var/run/secrets/redis", true], "redis-sentinel-password": ["redis-sentinel", ["sentinel-password"], "/var/run/secrets/redis-sentinel", true]}}'
check "idemproxy check: the config the chart renders with Redis Sentinel" check_config "$tmp/sentinel-config.yaml"
render_to "$tmp/sentinel-pw.yaml" --set redis.sentinel.masterName=mymaster \
    --set 'redis.sentinel.sentinels={redis:26379}' --set redis.sentinel.password=s3cret >/dev/null 2>&1
check "Sentinel with redis.sentinel.password: the chart creates and mounts <fullname>-redis-sentinel" \
    secrets_are "$tmp/sentinel-pw.yaml" \
    '{"created": ["idemproxy-redis-sentinel"], "volumes": {"redis-sentinel-password": ["idemproxy-redis-sentinel", ["password"], "/var/run/secrets/redis-sentinel", true]}}'
expect_fail "negative: the values schema refuses redis.sentinel.masterName without sentinels" \
    "at '/redis/sentinel/sentinels': minItems: got 0, want 1" render --set redis.sentinel.masterName=mymaster
expect_fail "negative: the values schema refuses a sentinel without a port" "'redis-0\.redis' does not match pattern" \
    render --set redis.sentinel.masterName=m --set 'redis.sentinel.sentinels={redis-0.redis}'
expect_fail "negative: the values schema refuses the config's spelling master_name in the chart's values" \
    "at '/redis/sentinel': additional properties 'master_name' not allowed" render --set redis.sentinel.master_name=m
expect_fail "negative: the chart refuses redis.sentinel with redis.cluster" \
    'redis\.sentinel\.masterName and redis\.cluster are both set' \
    render --set redis.sentinel.masterName=m --set 'redis.sentinel.sentinels={s:26379}' --set 'redis.cluster={c:6379}'
expect_fail "negative: the chart refuses redis.sentinel.username without a sentinel password" \
    'redis\.sentinel\.username needs a password' \
    render --set redis.sentinel.masterName=m --set 'redis.sentinel.sentinels={s:26379}' --set redis.sentinel.username=u
expect_fail "negative: the values schema refuses redis.tls.clientCertificate without a Secret name" \
    "at '/redis/tls/existingSecret': minLength: got 0, want 1" render --set redis.tls.enabled=true \
    --set redis.tls.clientCertificate=true
expect_fail "negative: the values schema refuses a redis.tls.verify that is not a boolean" \
    "at '/redis/tls/verify': got string, want boolean" render "${tlsset[@]}" --set redis.tls.verify=maybe
expect_fail "negative: the values schema refuses an unknown key in redis.tls" \
    "at '/redis/tls': additional properties 'caFile' not allowed" render "${tlsset[@]}" --set redis.tls.caFile=ca.pem
expect_fail "negative: the chart refuses redis.tls.enabled with a unix:// url" \
    'redis\.tls\.enabled needs a redis:// or rediss:// url, not unix://' render "${tlsset[@]}" --set redis.url=unix:///run/redis.sock
expect_fail "negative: the chart refuses redis.username without a password" \
    'redis\.username needs a password: set redis\.password or redis\.existingSecret' \
    render --set redis.password= --set redis.username=orders
mkdir -p "$tmp/bad-tls"
cp "$tmp/k8s-tls/"*.yaml "$tmp/bad-tls/"
sed -i 's/^\( *\)- key: ca\.crt$/\1- key: ca.pem/; s/^\( *\)path: ca\.crt$/\1path: ca.pem/' "$tmp/bad-tls/deployment.yaml"
expect_fail "negative: a ca_file outside the TLS Secret's items is caught" \
    'the Secret volume redis-tls has no item with path ca\.crt \(tls\.ca_file\)' \
    broken "path: ca.pem" "$tmp/bad-tls/deployment.yaml" "$PY" tests/deploy/manifests.py consistency "$tmp/bad-tls"

# --- the chart as platform teams deploy it (issue 33) ------------------------

kinds_are() {  # kinds_are RENDERED "KIND ...": the kinds of the objects, sorted
    local got; got=$(grep '^kind:' "$1" | sed 's/^kind: //' | sort | tr '\n' ' ' | sed 's/ $//')
    echo "kinds: $got"
    [ "$got" = "$2" ] || { echo "want:  $2"; return 1; }
}
# The values schema: an unknown key is refused wherever the chart knows the shape.
expect_fail "negative: the values schema refuses a misspelt top-level key (replicaCont)" \
    "at '': additional properties 'replicaCont' not allowed" render --set replicaCont=3
expect_fail "negative: the values schema refuses an unknown key in worker" \
    "at '/worker': additional properties 'volumeMount' not allowed" render --set 'worker.volumeMount[0].name=data'
expect_fail "negative: the values schema refuses a key of the config the chart sets itself (config.redis.url)" \
    "at '/config/redis': additional properties 'url' not allowed" render --set config.redis.url=redis://other:6379
expect_fail "negative: the values schema refuses a misspelt stream option" \
    "at '/streams/0': additional properties 'lease_msec' not allowed" render --set 'streams[0].lease_msec=5000'
expect_fail "negative: the values schema refuses an unknown key in podMonitor" \
    "at '/podMonitor': additional properties 'enable' not allowed" render --set podMonitor.enable=true
# The schema's config and stream keys are those docs/configuration.md documents,
# less what the chart sets: neither gains a key the other lacks.
schema_keys_match_docs() {  # schema_keys_match_docs SCHEMA
    "$PY" - "$1" docs/configuration.md <<'EOF'
import json, re, sys
schema = json.load(open(sys.argv[1]))["properties"]
docs = set(re.findall(r"^### `([a-z_]+(?:\[\])?\.[a-z_]+)`", open(sys.argv[2]).read(), re.M))
chart_sets = {"redis.url", "redis.cluster", "redis.sentinel", "redis.password_file", "redis.username",
              "redis.tls", "app.endpoint", "metrics.listen"}
got = {f"{sec}.{k}" for sec, v in schema["config"]["properties"].items() if "properties" in v
       for k in v["properties"]}
got |= {f"streams[].{k}" for k in schema["streams"]["items"]["properties"]}
want = docs - chart_sets
for k in sorted(want - got): print(f"docs/configuration.md documents {k}; the values schema lacks it")
for k in sorted(got - want): print(f"the values schema allows {k}; docs/configuration.md does not document it")
print(f"{len(got)} keys of config and streams in the schema, {len(want)} documented")
sys.exit(1 if got != want else 0)
EOF
}
check "the values schema's config and stream keys are those of docs/configuration.md" \
    schema_keys_match_docs "$chart/values.schema.json"
sed '/^ *"lease_ms": {},$/d' "$chart/values.schema.json" >"$tmp/schema-drift.json"
expect_fail "negative: a values schema that lacks a documented stream option is caught" \
    'docs/configuration\.md documents streams\[\]\.lease_ms; the values schema lacks it' \
    schema_keys_match_docs "$tmp/schema-drift.json"

# Volumes: worker.volumeMounts and extraVolumeMounts name volumes of the pod.
check "the chart renders with tests/deploy/values/volumes.yaml (extraVolumes, worker.volumeMounts, extraVolumeMounts)" \
    render_to "$tmp/volumes.yaml" -f tests/deploy/values/volumes.yaml
check "helm lint --strict with tests/deploy/values/volumes.yaml" \
    helm_ lint --strict --kube-version "$K8S_VERSION.0" "$chart" -f tests/deploy/values/volumes.yaml
check "the rendered chart (extra volumes) validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/volumes.yaml"
check "the rendered chart (extra volumes) fits together: every mount names a volume of the pod" \
    "$PY" tests/deploy/manifests.py consistency "$tmp/volumes.yaml"
expect_fail "negative: the chart refuses worker.volumeMounts naming no volume of the pod" \
    'worker\.volumeMounts\[0\] mounts volume "data", which the pod does not have \(its volumes: config, socket\): add it to extraVolumes' \
    render --set 'worker.volumeMounts[0].name=data' --set 'worker.volumeMounts[0].mountPath=/data'
expect_fail "negative: the chart refuses extraVolumeMounts naming no volume of the pod" \
    'extraVolumeMounts\[0\] mounts volume "ca", which the pod does not have' \
    render --set 'extraVolumeMounts[0].name=ca' --set 'extraVolumeMounts[0].mountPath=/etc/ca'
sed '/^      volumes:$/,$ s/^\( *\)\(- \)\{0,1\}name: data$/\1\2name: date/' "$tmp/volumes.yaml" >"$tmp/volumes-bad.yaml"
expect_fail "negative: a mount whose volume is missing is caught in rendered manifests" \
    "container orders-worker mounts volume 'data', which the pod does not have" \
    broken "name: date" "$tmp/volumes-bad.yaml" "$PY" tests/deploy/manifests.py consistency "$tmp/volumes-bad.yaml"

# Monitoring for the Prometheus Operator: kubectl-validate checks the PodMonitor and
# the PrometheusRule against tests/deploy/crds (the operator's CRDs, trimmed).
crds=(--local-crds tests/deploy/crds)
check "the chart renders with tests/deploy/values/monitoring.yaml (PodMonitor, PrometheusRule)" \
    render_to "$tmp/monitoring.yaml" -f tests/deploy/values/monitoring.yaml
check "helm lint --strict with tests/deploy/values/monitoring.yaml" \
    helm_ lint --strict --kube-version "$K8S_VERSION.0" "$chart" -f tests/deploy/values/monitoring.yaml
check "the rendered chart (monitoring) validates, the PodMonitor and PrometheusRule against their CRDs" \
    validate "${crds[@]}" "$tmp/monitoring.yaml"
check "the rendered chart (monitoring) fits together" "$PY" tests/deploy/manifests.py consistency "$tmp/monitoring.yaml"
# monitoring_fits RENDERED ALERTS: the PodMonitor scrapes the port named metrics of
# the pods it selects, and the PrometheusRule's groups are ALERTS' groups.
monitoring_fits() {
    "$PY" - "$1" "$2" <<'EOF'
import sys, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
kinds = {o["kind"]: o for o in objs}
bad = []
pm, rule = kinds.get("PodMonitor"), kinds.get("PrometheusRule")
if not pm or not rule:
    sys.exit(f"want a PodMonitor and a PrometheusRule, got {sorted(kinds)}")
want = yaml.safe_load(open(sys.argv[2]))["groups"]
if rule["spec"]["groups"] != want:
    bad.append(f"the PrometheusRule's groups are not those of {sys.argv[2]}")
sel = pm["spec"]["selector"].get("matchLabels") or {}
for d in (o for o in objs if o["kind"] == "Deployment"):
    pod = d["spec"]["template"]
    labels = pod["metadata"].get("labels") or {}
    if not sel or any(labels.get(k) != v for k, v in sel.items()):
        bad.append(f"the PodMonitor's selector {sel} does not select the pods of {d['metadata']['name']}")
    ports = [p.get("name") for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
             for p in c.get("ports") or []]
    for ep in pm["spec"]["podMetricsEndpoints"]:
        if ep.get("port") not in ports:
            bad.append(f"the PodMonitor scrapes port {ep.get('port')!r}; the pod's ports: {ports}")
print("\n".join(bad) or f"PodMonitor selects {sel}, port metrics; PrometheusRule: {sum(len(g['rules']) for g in want)} rules of {sys.argv[2]}")
sys.exit(1 if bad else 0)
EOF
}
check "monitoring: the PodMonitor scrapes the sidecar's metrics port; the PrometheusRule holds deploy/prometheus/alerts.yaml" \
    monitoring_fits "$tmp/monitoring.yaml" deploy/prometheus/alerts.yaml
check "deploy/prometheus/alerts.yaml is the chart's files/alerts.yaml (one file: a symbolic link)" \
    test "$(readlink -f deploy/prometheus/alerts.yaml)" = "$(readlink -f "$chart/files/alerts.yaml")"
sed 's/^\( *\)podMetricsEndpoints:/\1podMetricEndpoints:/' "$tmp/monitoring.yaml" >"$tmp/monitoring-bad.yaml"
expect_fail "negative: kubectl-validate rejects a misspelt PodMonitor field (the CRD's schema is used)" \
    'spec\.podMetricEndpoints: Invalid value: value provided for unknown field' \
    broken podMetricEndpoints "$tmp/monitoring-bad.yaml" validate_at "$K8S_VERSION" "${crds[@]}" "$tmp/monitoring-bad.yaml"
sed 's/^\( *\)- alert: IdemproxyRedisDown$/\1- alert: IdemproxyRedisGone/' "$tmp/monitoring.yaml" >"$tmp/monitoring-drift.yaml"
expect_fail "negative: a PrometheusRule that differs from deploy/prometheus/alerts.yaml is caught" \
    "the PrometheusRule's groups are not those of deploy/prometheus/alerts\.yaml" \
    broken IdemproxyRedisGone "$tmp/monitoring-drift.yaml" monitoring_fits "$tmp/monitoring-drift.yaml" deploy/prometheus/alerts.yaml
check "defaults: no PodMonitor, no PrometheusRule, no Secret (monitoring is optional)" \
    kinds_are "$tmp/default.yaml" "ConfigMap Deployment NetworkPolicy PodDisruptionBudget"

# NOTES.txt (helm install prints it; helm template and lint do not render it): in a
# copy of the chart, rendered through tpl into a ConfigMap.
notes_say() {  # notes_say PATTERN VALUES...: the notes render and match PATTERN
    local pattern=$1 c="$tmp/notes-chart"; shift
    rm -rf "$c" && cp -r "$chart" "$c" && cp "$c/templates/NOTES.txt" "$c/files/notes.txt" &&
        printf '%s\n' 'apiVersion: v1' 'kind: ConfigMap' 'metadata: {name: notes}' \
            'data: {notes: {{ tpl (.Files.Get "files/notes.txt") . | quote }}}' >"$c/templates/notes.yaml" &&
        helm_ template idemproxy "$c" --kube-version "$K8S_VERSION.0" --show-only templates/notes.yaml "$@" >"$tmp/notes.yaml" &&
        "$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["data"]["notes"])' "$tmp/notes.yaml" >"$tmp/notes.txt" || return 1
    cat "$tmp/notes.txt"
    grep -Eq -- "$pattern" "$tmp/notes.txt"
}
check "NOTES.txt (defaults): the Deployment's pods, and no password: no AUTH" \
    notes_say 'No password configured .*: idemproxy sends no AUTH'
check "NOTES.txt (deployment.enabled=false): the sidecar's ConfigMap and Secret, no Deployment" \
    notes_say "the idemproxy sidecar's ConfigMap and Secret, no Deployment" --set deployment.enabled=false --set redis.password=s3cret

# The sidecar in a team's own chart: tests/deploy/fixtures/app-chart depends on
# this chart (file://), renders a Deployment of its own and adds the sidecar with
# the idemproxy.sidecar.* templates; the chart itself renders no Deployment.
cp -r tests/deploy/fixtures/app-chart "$tmp/app-chart"
sed -i "s#^\( *repository: \)file://.*#\1file://$root/$chart#" "$tmp/app-chart/Chart.yaml"
check "a chart that depends on this one: helm dependency build (file://)" helm_ dependency build "$tmp/app-chart"
check "helm lint --strict: the chart that adds the sidecar to its own Deployment" \
    helm_ lint --strict --kube-version "$K8S_VERSION.0" "$tmp/app-chart"
render_app() { helm_ template shop "$tmp/app-chart" --kube-version "$K8S_VERSION.0" >"$tmp/app.yaml" && test -s "$tmp/app.yaml"; }
check "the chart that adds the sidecar renders" render_app
check "its manifests (its Deployment with the sidecar, the sidecar's ConfigMap, monitoring) validate" \
    validate "${crds[@]}" "$tmp/app.yaml"
check "its Deployment fits together: the sidecar's config, password, socket, probes and ports" \
    "$PY" tests/deploy/manifests.py consistency "$tmp/app.yaml"
"$PY" -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(open(sys.argv[1]))["idemproxy"] | {"deployment": {"enabled": True}}, open(sys.argv[2], "w"))' \
    tests/deploy/fixtures/app-chart/values.yaml "$tmp/app-idemproxy-values.yaml"
render_to "$tmp/app-standalone.yaml" -f "$tmp/app-idemproxy-values.yaml" --set fullnameOverride=shop-idemproxy >/dev/null 2>&1
check "the sidecar its templates add is the one the chart's own Deployment runs with the same values" \
    "$PY" tests/deploy/manifests.py sidecar "$tmp/app-standalone.yaml" "$tmp/app.yaml"
check "the monitoring of the chart that adds the sidecar selects its pods" \
    monitoring_fits "$tmp/app.yaml" deploy/prometheus/alerts.yaml
render_to "$tmp/no-deployment.yaml" --set deployment.enabled=false >/dev/null 2>&1
check "deployment.enabled=false: only the sidecar's ConfigMap (no Deployment, PDB, NetworkPolicy)" \
    kinds_are "$tmp/no-deployment.yaml" "ConfigMap"
expect_fail "negative: deployment.enabled=false with a PodMonitor needs podMonitor.selector" \
    'podMonitor\.selector: with deployment\.enabled false, name your app.s pod labels' \
    render --set deployment.enabled=false --set podMonitor.enabled=true

# The sidecar for plain manifests: the kustomize Component deploy/kustomize/idemproxy,
# in tests/deploy/fixtures/kustomize-app (a Deployment of a team's own, its overlay).
if command -v kubectl >/dev/null; then
    kustomize_() { kubectl kustomize "$@"; }
else
    KUSTOMIZE=$(go_tool kustomize "$KUSTOMIZE_VERSION" sigs.k8s.io/kustomize/kustomize/v5) || KUSTOMIZE=false
    kustomize_() { "$KUSTOMIZE" build "$@"; }
fi
render_kustomize() { kustomize_ tests/deploy/fixtures/kustomize-app >"$tmp/kustomize.yaml" && test -s "$tmp/kustomize.yaml"; }
check "kustomize: the overlay with the idemproxy Component renders" render_kustomize
check "kustomize: the rendered overlay validates against the $K8S_MIN_VERSION and $K8S_VERSION schemas" \
    validate "$tmp/kustomize.yaml"
check "kustomize: the Deployment with the Component fits together" \
    "$PY" tests/deploy/manifests.py consistency "$tmp/kustomize.yaml"
check "kustomize: the Component's sidecar is the one the chart renders with its defaults" \
    "$PY" tests/deploy/manifests.py sidecar "$tmp/default.yaml" "$tmp/kustomize.yaml"
# (kustomize takes a component by a relative path only: a copy beside the overlay)
mkdir -p "$tmp/kustomize-nopatch" && cp -r deploy/kustomize/idemproxy "$tmp/kustomize-component"
cp tests/deploy/fixtures/kustomize-app/deployment.yaml tests/deploy/fixtures/kustomize-app/idemproxy.yaml "$tmp/kustomize-nopatch/"
sed -e "s#\.\./\.\./\.\./\.\./deploy/kustomize/idemproxy#../kustomize-component#" -e '/^patches:/,$d' \
    tests/deploy/fixtures/kustomize-app/kustomization.yaml >"$tmp/kustomize-nopatch/kustomization.yaml"
kustomize_ "$tmp/kustomize-nopatch" >"$tmp/kustomize-nopatch.yaml" 2>&1
expect_fail "negative: without the app container's patch, the missing socket mount is caught" \
    'container shop does not mount the socket emptyDir at /run/idemproxy' \
    broken "name: idemproxy" "$tmp/kustomize-nopatch.yaml" "$PY" tests/deploy/manifests.py consistency "$tmp/kustomize-nopatch.yaml"

# --- the two images as the pod runs them ------------------------------------

if [ "$chroot_ok" = 1 ] && command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    check "pod smoke test: staged idemproxy + worker as uids 10001/10002, password_file, real Redis" pod_smoke
    check "the live /metrics of that pod passes the dashboard and alert check" \
        "$PY" tests/deploy/check_dashboard.py -q --metrics "$tmp/live-metrics.txt" \
        deploy/grafana/idemproxy.json deploy/prometheus/alerts.yaml
    check "the live /metrics of that pod: build_info carries the commit of the build argument" \
        grep -F "idemproxy_build_info{version=\"0.1.0\",commit=\"$image_commit\"} 1" "$tmp/live-metrics.txt"
    check "pod smoke test over mutual TLS: the config of deploy/k8s/tls, its Secret's files, a TLS-only Redis" pod_smoke tls
    check "pod smoke test over mutual TLS with no ca_file: the server's CA found in the image's CA bundle" \
        pod_smoke tls-system-ca
    expect_fail "negative: with no ca_file and a CA the image's bundle lacks, the handshake is refused" \
        'link lost: TLS handshake: certificate verify failed' pod_smoke tls-system-ca-unknown
else
    skip "pod smoke test (needs root, chroot and redis-server)"
fi

# --- dashboard and alerts ---------------------------------------------------

check "every query of the dashboard and the alert rules names a metric of $METRICS" \
    "$PY" tests/deploy/check_dashboard.py -q --metrics "$METRICS" \
    deploy/grafana/idemproxy.json deploy/prometheus/alerts.yaml
check "check_dashboard.py: its own good and bad cases" "$PY" tests/deploy/test_check_dashboard.py
sed 's/idemproxy_inflight/idemproxy_in_flight/' deploy/grafana/idemproxy.json >"$tmp/dash.json"
expect_fail "negative: a dashboard naming a metric /metrics lacks is refused" 'idemproxy_in_flight: not exported by /metrics' \
    broken idemproxy_in_flight "$tmp/dash.json" "$PY" tests/deploy/check_dashboard.py -q --metrics "$METRICS" "$tmp/dash.json"

echo "deploy checks took $(( $(date +%s) - started ))s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
