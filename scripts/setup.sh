#!/usr/bin/env bash
# Prepare a Debian 12 host for building and testing sbx: packages, a running
# dockerd (where one can run), and the base images. Safe to run repeatedly.
# Where no Docker daemon can run (or with --no-docker), the images are built
# as archives only, which sbx's local backend loads: sbx needs no daemon.
#
# Usage: scripts/setup.sh [--no-images] [--no-sdks] [--podman] [--force-images] [--no-docker]
# Env:   SBX_SETUP_EXTRA_PACKAGES  extra Debian packages (space separated)
#        DOCKER_HOST               unix:///path/to/docker.sock (default /var/run/docker.sock)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# log, die and busy (a long step that says it still runs)
. "$here/lib/steps.sh" || exit 1

with_images=1
with_sdks=1
with_podman=0
with_docker=1
image_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-images) with_images=0 ;;
        --no-sdks) with_sdks=0 ;;
        --podman) with_podman=1 ;;
        --no-docker) with_docker=0 ;;
        --force-images) image_args+=(--force) ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option: $1" ;;
    esac
    shift
done

[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages, starts dockerd)"

packages=(
    # build
    build-essential pkg-config lua5.4 liblua5.4-dev libcurl4-openssl-dev
    libcjson-dev libssl-dev libuv1-dev libwebsockets-dev libwebsockets-evlib-uv
    # sbx-agent: static for x86_64 (musl) and aarch64 (the cross compiler)
    musl-tools gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    libarchive-dev
    libseccomp-dev
    # runtime
    docker.io iptables ca-certificates
    # the local backend: namespaces (bubblewrap), a user's id range (uidmap)
    bubblewrap uidmap
    # image building
    busybox-static debootstrap
    # tests
    valgrind procps psmisc curl socat openssl python3 python3-boto3 python3-botocore
    luarocks man-db groff-base
    # the style checks: C (.clang-format) and Lua (.luacheckrc)
    clang-format lua-check
    # the aarch64 agent runs under qemu-user in the tests
    qemu-user-static
    # image tests: a loopback registry, fixtures pushed to it, its token issuer
    docker-registry skopeo python3-jwt python3-cryptography zstd
)
[ "$with_podman" -eq 1 ] && packages+=(podman catatonit)
# kubectl drives the Kubernetes stand-in in the tests: Debian's
# kubernetes-client, unless a kubectl is already installed (another
# package's /usr/bin/kubectl would conflict with it).
command -v kubectl >/dev/null 2>&1 || packages+=(kubernetes-client)
# Word splitting is the point: the variable is a space separated list.
# shellcheck disable=SC2206
packages+=(${SBX_SETUP_EXTRA_PACKAGES:-})

# --- packages ---------------------------------------------------------------
missing=()
for p in "${packages[@]}"; do
    # "install ok installed" is the only state that means usable; half-configured
    # or removed-with-config packages must be (re)installed too.
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "packages: installing ${#missing[@]} (${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    log "packages: apt-get update"
    busy "updating the package lists" -- apt-get update -qq
    log "packages: apt-get install (a few minutes on a fresh system)"
    busy "installing ${#missing[@]} packages" /dev/null -- apt-get install -y -qq --no-install-recommends "${missing[@]}"
    log "packages: installed"
else
    log "all ${#packages[@]} packages already installed"
fi

# --- dockerd ----------------------------------------------------------------
docker_host=${DOCKER_HOST:-unix:///var/run/docker.sock}
case "$docker_host" in
    unix:///*) sock=${docker_host#unix://} ;;
    *) die "DOCKER_HOST must be unix:///path (got $docker_host)" ;;
esac

ping_docker() {
    [ "$(curl -sf --max-time 5 --unix-socket "$sock" http://localhost/_ping 2>/dev/null)" = OK ]
}

dockerd_log=/var/log/sbx-dockerd.log
if ping_docker; then
    log "docker daemon answers on $sock"
elif [ "$with_docker" -eq 0 ]; then
    log "not starting dockerd (--no-docker): sbx will use its local backend"
else
    started=0
    # Under systemd the unit owns dockerd (and its containerd); a second,
    # hand-started daemon would fight it over the pid file and socket.
    if [ -d /run/systemd/system ] && [ "$sock" = /var/run/docker.sock ] \
        && systemctl start docker 2>/dev/null; then
        log "started docker via systemctl"
        started=1
    fi
    if [ "$started" -eq 0 ]; then
        if pid=$(pgrep -x dockerd | head -n1) && [ -n "$pid" ]; then
            # Probably still starting up (or wedged); launching another would
            # only fail on /var/run/docker.pid, so just wait for it.
            log "dockerd (pid $pid) is running but $sock does not answer yet; waiting"
        else
            log "starting dockerd (log: $dockerd_log)"
            dockerd_args=()
            [ "$sock" = /var/run/docker.sock ] || dockerd_args+=(-H "unix://$sock")
            nohup dockerd "${dockerd_args[@]}" >"$dockerd_log" 2>&1 </dev/null &
            dockerd_pid=$!
            disown
        fi
    fi
    for _ in $(seq 60); do
        ping_docker && break
        # No point waiting out the minute for a daemon that already died.
        if [ -n "${dockerd_pid:-}" ] && ! kill -0 "$dockerd_pid" 2>/dev/null; then
            break
        fi
        sleep 1
    done
    if ! ping_docker; then
        reason="did not answer within 60s"
        if [ -n "${dockerd_pid:-}" ] && ! kill -0 "$dockerd_pid" 2>/dev/null; then
            reason="exited"
        fi
        printf 'setup: warning: docker daemon on %s %s\n' "$sock" "$reason" >&2
        if [ -s "$dockerd_log" ]; then
            printf 'setup: last lines of %s:\n' "$dockerd_log" >&2
            tail -n 20 "$dockerd_log" >&2
        elif [ "$started" -eq 1 ]; then
            journalctl -u docker -n 20 --no-pager >&2 2>/dev/null || true
        fi
        # sbx itself needs no daemon (its local backend); the Docker tests do.
        log "going on without Docker: sbx will use its local backend, and the Docker tests will fail"
    else
        log "docker daemon is up on $sock"
    fi
fi

# --- node SDKs for the tests -------------------------------------------------
# The official OpenAI, Anthropic, Gemini and MCP SDKs serve as type oracles
# and as a real MCP client in the tests; the official Kubernetes client
# (@kubernetes/client-node) drives the Kubernetes stand-in.
if [ "$with_sdks" -eq 1 ]; then
    # sbx and its examples need none of this: where npm cannot reach its
    # registry (an offline first run), setup says so and goes on, and the
    # tests that use the SDKs fail saying they are missing.
    sdk_log=$(mktemp)
    sdk_ok=1
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        log "SDKs: installing nodejs and npm"
        export DEBIAN_FRONTEND=noninteractive
        if ! busy "updating the package lists" "$sdk_log" -- apt-get update -qq ||
           ! busy "installing nodejs and npm" "$sdk_log" -- apt-get install -y -qq --no-install-recommends nodejs npm; then
            sdk_ok=0
        fi
    fi
    sdk="$here/../tests/sdk"
    if [ "$sdk_ok" -eq 0 ]; then
        :
    elif [ ! -f "$sdk/node_modules/.package-lock.json" ] || [ "$sdk/package-lock.json" -nt "$sdk/node_modules/.package-lock.json" ]; then
        log "SDKs: installing the test SDKs (npm ci in tests/sdk)"
        # shellcheck disable=SC2016  # $1 is the inner shell's
        busy "installing the test SDKs" "$sdk_log" -- sh -c 'cd "$1" && npm ci --no-audit --no-fund --loglevel=error' sh "$sdk" || sdk_ok=0
    else
        log "test SDKs already installed"
    fi
    if [ "$sdk_ok" -eq 0 ]; then
        printf 'setup: warning: the test SDKs did not install; last lines:\n' >&2
        tail -n 10 "$sdk_log" >&2
        log "going on without them: sbx needs none; the tests that use them will fail (run setup again where npm reaches its registry)"
    fi
    rm -f "$sdk_log"
fi

# --- images -----------------------------------------------------------------
if [ "$with_images" -eq 1 ]; then
    log "images: sbx-busybox:latest and sbx-debian:12 (scripts/build-images.sh)"
    DOCKER_HOST="unix://$sock" "$here/build-images.sh" "${image_args[@]}"
else
    log "skipping images (--no-images)"
fi
log "done"
