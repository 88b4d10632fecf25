#!/usr/bin/env bash
# Build sbx's base images locally (no registry is reachable): each as a
# `docker save` tarball in $SBX_ARCHIVES (what sbx's image cache loads by
# name where no daemon runs: policy.images.archives), and, when a Docker
# daemon answers, imported through the Engine API with curl, so a docker CLI
# newer than the daemon's API cannot get in the way.
#
# Usage: scripts/build-images.sh [--force] [busybox] [debian]
#   --force   rebuild and re-import even if the image exists (sbx-debian is
#             re-debootstrapped from the cached packages, no download)
#   names     build only these (default: all)
# Env:   DOCKER_HOST        unix:///path/to/docker.sock (default /var/run/docker.sock)
#        SBX_CACHE          cache directory (default /var/cache/sbx); delete it
#                           to fetch fresh packages from the mirror
#        SBX_DEBIAN_MIRROR  override the mirror otherwise taken from apt's sources
#        SBX_ARCHIVES       where the tarballs go (default /var/lib/sbx/images)
set -euo pipefail
umask 022

# log, die and busy (a long step that says it still runs)
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/steps.sh" || exit 1

force=0
want=()
while [ $# -gt 0 ]; do
    case "$1" in
        --force) force=1 ;;
        busybox|debian) want+=("$1") ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
    shift
done
[ ${#want[@]} -gt 0 ] || want=(busybox debian)

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, root-owned files in the images)"

docker_host=${DOCKER_HOST:-unix:///var/run/docker.sock}
case "$docker_host" in
    unix:///*) sock=${docker_host#unix://} ;;
    *) die "DOCKER_HOST must be unix:///path (got $docker_host)" ;;
esac

cache=${SBX_CACHE:-/var/cache/sbx}
archives=${SBX_ARCHIVES:-/var/lib/sbx/images}
mkdir -p "$cache" "$archives"
# Two concurrent runs would race on the cache and on the image tags.
exec 9>"$cache/build-images.lock"
flock 9

tmp=$(mktemp -d /var/tmp/sbx-images.XXXXXX)
cleanup() {
    # debootstrap mounts proc/sys inside the target; if it died half-way they
    # may still be there, and rm -rf must never walk into the host's /proc.
    # (Runs under set -e, so nothing here may fail.)
    local m
    findmnt -rn -o TARGET 2>/dev/null | grep -F "$tmp/" | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done || true
    rm -rf --one-file-system "$tmp" || true
}
trap cleanup EXIT

# --- Engine API helpers -----------------------------------------------------
api() { curl -sS --unix-socket "$sock" "$@"; }

have_docker=0
if [ "$(api --max-time 5 http://localhost/_ping 2>/dev/null)" = OK ]; then
    have_docker=1
else
    log "no Docker daemon answers on $sock: building the image archives only (sbx's local backend loads them)"
fi

# Prints the image's inspect JSON; fails when it does not exist.
image_json() { api -f "http://localhost/images/$1/json" 2>/dev/null; }

# A single field from inspect JSON without needing jq. "Config" is matched with
# its leading quote so "ContainerConfig" (which comes first) is skipped.
json_size() { grep -o '"Size":[0-9]*' | head -n1 | cut -d: -f2; }
json_cmd()  { sed -n 's/.*"Config":{//p' | grep -o '"Cmd":\[[^]]*\]' | head -n1 | cut -d: -f2-; }

# import_tar TAR REPO TAG CHANGE... : POST /images/create?fromSrc=- with the
# tar as body, each CHANGE a Dockerfile instruction applied at import time.
import_tar() {
    local tar=$1 repo=$2 tag=$3 out
    shift 3
    local q=(--url-query "fromSrc=-" --url-query "repo=$repo" --url-query "tag=$tag")
    local c
    for c in "$@"; do q+=(--url-query "changes=$c"); done
    # -T streams the file instead of loading it into memory like --data-binary
    # would; "Expect:" avoids a pointless 100-continue round trip.
    log "importing $repo:$tag into the Docker daemon ($(numfmt --to=iec --suffix=B "$(stat -c %s "$tar")"))"
    out=$(api -X POST -T "$tar" -H 'Content-Type: application/x-tar' -H 'Expect:' \
        -w '\nHTTP %{http_code}' "${q[@]}" http://localhost/images/create) \
        || die "import of $repo:$tag failed (curl)"
    # Bad requests fail with a status code; failures once the progress stream
    # has started still say 200 but carry an "error" object.
    if [ "${out##*$'\n'}" != "HTTP 200" ] || grep -q '"error"' <<<"$out"; then
        die "import of $repo:$tag failed: $out"
    fi
    # Podman's compatible API ignores "tag" on import and names the image
    # repo:latest: tag the imported id as asked.
    if ! image_json "$repo:$tag" >/dev/null 2>&1; then
        local id
        id=$(grep -o 'sha256:[0-9a-f]\{64\}' <<<"$out" | tail -n1)
        [ -n "$id" ] || id=$(image_id "$repo:latest")
        api -f -X POST "http://localhost/images/$id/tag?repo=$repo&tag=$tag" >/dev/null \
            || die "cannot tag $id as $repo:$tag"
    fi
}

# check_image REF CMD: succeeds (and reports the size) if REF exists with the
# expected default command, i.e. the "changes" import parameter took effect.
check_image() {
    local ref=$1 want_cmd=$2 json size cmd
    json=$(image_json "$ref") || { log "$ref does not exist"; return 1; }
    cmd=$(json_cmd <<<"$json")
    if [ "$cmd" != "$want_cmd" ]; then
        log "$ref has Cmd '${cmd:-none}', expected '$want_cmd'"
        return 1
    fi
    size=$(json_size <<<"$json")
    log "$ref: $(numfmt --to=iec --suffix=B "$size") ($size bytes), Cmd $cmd"
}

image_id() { image_json "$1" | grep -o '"Id":"[^"]*"' | head -n1 | cut -d'"' -f4; }

# After a forced re-import the previous image is left untagged; drop it unless
# a container still uses it (then the daemon refuses, which is fine).
drop_old() {
    local old=$1 ref=$2
    [ -n "$old" ] && [ "$old" != "$(image_id "$ref")" ] || return 0
    if api -f -X DELETE "http://localhost/images/$old" >/dev/null 2>&1; then
        log "removed previous $ref image ${old:7:12}"
    fi
}

archive_of() { printf '%s/%s.tar' "$archives" "${1//\//_}"; }

# sync_archive REF: with a daemon, makes REF's archive the daemon's own image
# (GET /images/REF/get, a docker save tarball), so a bare name is the same
# image id whether sbx finds the archive or asks the daemon.
sync_archive() {
    [ "$have_docker" -eq 1 ] || return 0
    local ref=$1 out id have
    out=$(archive_of "$ref")
    id=$(image_id "$ref")
    [ -n "$id" ] || die "$ref is not on the daemon"
    have=$(tar -xOf "$out" manifest.json 2>/dev/null | grep -o '"Config":"[^"]*"' | head -n1 | grep -o '[0-9a-f]\{64\}' || true)
    [ "sha256:$have" != "$id" ] || return 0
    log "exporting $ref from the daemon into $out"
    busy "exporting $ref" -- api -f -o "$out.tmp" "http://localhost/images/$ref/get" || die "cannot export $ref from the daemon"
    mv "$out.tmp" "$out"
    log "$ref archive: the daemon's image ${id:7:12} ($out)"
}

# needs_build REF CMD: 0 if REF must be (re)built: forced; with a daemon,
# missing there or not what this script would produce (an image the daemon
# has as built only has its archive brought up to date); without one, its
# archive missing.
needs_build() {
    [ "$force" -eq 0 ] || return 0
    if [ "$have_docker" -eq 1 ]; then
        image_json "$1" >/dev/null || { log "$1 is not on the daemon"; return 0; }
        check_image "$1" "$2" || { log "rebuilding $1"; return 0; }
        sync_archive "$1"
        log "$1 exists, skipping (use --force to rebuild)"
        return 1
    fi
    [ -s "$(archive_of "$1")" ] || { log "$1: no archive yet"; return 0; }
    log "$1 archive exists, skipping (use --force to rebuild)"
    return 1
}

# write_archive ROOTFS_TAR REF CMD_JSON: a `docker save` tarball of one layer
# (manifest.json, the config named by its digest, the layer) at archive_of REF.
write_archive() {
    local layer=$1 ref=$2 cmd=$3 dir diff cfg cfgsum arch out
    out=$(archive_of "$ref")
    dir=$(mktemp -d "$tmp/archive.XXXXXX")
    diff=$(sha256sum "$layer" | cut -d' ' -f1)
    arch=$(dpkg --print-architecture)
    mkdir -p "$dir/$diff"
    ln "$layer" "$dir/$diff/layer.tar" 2>/dev/null || cp "$layer" "$dir/$diff/layer.tar"
    cfg=$(printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"sbx scripts/build-images.sh"}]}' \
        "$arch" "$cmd" "$diff")
    cfgsum=$(printf '%s' "$cfg" | sha256sum | cut -d' ' -f1)
    printf '%s' "$cfg" >"$dir/$cfgsum.json"
    printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfgsum" "$ref" "$diff" >"$dir/manifest.json"
    tar --numeric-owner --owner=0 --group=0 -C "$dir" -cf "$out.tmp" manifest.json "$cfgsum.json" "$diff/layer.tar"
    mv "$out.tmp" "$out"
    rm -rf "$dir"
    log "$ref archive: $out"
}

make_tar() { tar --numeric-owner --owner=0 --group=0 -C "$1" -cf "$2" .; }

path_env='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# --- sbx-busybox:latest -----------------------------------------------------
build_busybox() {
    local ref=sbx-busybox:latest want_cmd='["sh"]'
    needs_build "$ref" "$want_cmd" || return 0
    local t0=$SECONDS root=$tmp/busybox old
    old=$( [ "$have_docker" -eq 1 ] && image_id "$ref" || true)
    log "building $ref"

    # Must be the static build: the image has no libc.
    local bb=/bin/busybox
    [ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" = "install ok installed" ] \
        || die "busybox-static is not installed (run scripts/setup.sh)"

    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,root,work,tmp,proc,sys,dev,var/tmp}
    chmod 700 "$root/root"
    chmod 1777 "$root/tmp" "$root/var/tmp"
    install -m 755 "$bb" "$root/bin/busybox"
    # Symlinks from the applet list rather than "busybox --install" in a
    # chroot, which needs /proc/self/exe to find itself.
    local applet
    while read -r applet; do
        [ "$applet" = bin/busybox ] && continue
        mkdir -p "$root/$(dirname "$applet")"
        ln -sfn /bin/busybox "$root/$applet"
    done < <("$bb" --list-full)
    [ -L "$root/bin/sh" ] || die "busybox has no sh applet"
    [ ! -e "$root/bin/bash" ] || die "busybox image unexpectedly has bash"

    cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat >"$root/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
EOF

    make_tar "$root" "$tmp/busybox.tar"
    write_archive "$tmp/busybox.tar" "$ref" "$want_cmd"
    if [ "$have_docker" -eq 1 ]; then
        import_tar "$tmp/busybox.tar" sbx-busybox latest "CMD $want_cmd" "$path_env"
        check_image "$ref" "$want_cmd" || die "$ref is not as expected after import"
        drop_old "$old" "$ref"
        sync_archive "$ref"
    fi
    log "$ref built in $((SECONDS - t0))s"
}

# --- sbx-debian:12 ----------------------------------------------------------

# The main archive URI from apt's own configuration (never hard-coded): the
# first deb source that is not the security archive.
debian_mirror() {
    if [ -n "${SBX_DEBIAN_MIRROR:-}" ]; then
        echo "$SBX_DEBIAN_MIRROR"
        return
    fi
    local m
    # One-line format: deb [options] URI suite components
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '
        $1 == "deb" {
            i = 2
            if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
            if ($i !~ /security/ && $(i + 1) !~ /-security$/) { print $i; exit }
        }') || true
    if [ -z "$m" ]; then
        # deb822 format: stanzas separated by blank lines.
        m=$(awk '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled != "no" &&
                    uris != "" && uris !~ /security/ && suites !~ /-security/) {
                    split(uris, u, " "); print u[1]; found = 1; exit
                }
                types = uris = suites = enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            { key = tolower($1); sub(/^[^:]*:[ \t]*/, "") }
            key == "types:"   { types = $0 }
            key == "uris:"    { uris = $0 }
            key == "suites:"  { suites = $0 }
            key == "enabled:" { enabled = tolower($0) }
            END { if (!found) flush() }
        ' /etc/apt/sources.list.d/*.sources 2>/dev/null) || true
    fi
    [ -n "$m" ] || die "no Debian mirror found in apt sources; set SBX_DEBIAN_MIRROR"
    echo "$m"
}

build_debian() {
    local ref=sbx-debian:12 want_cmd='["bash"]'
    needs_build "$ref" "$want_cmd" || return 0
    local t0=$SECONDS root=$tmp/debian old arch mirror
    old=$( [ "$have_docker" -eq 1 ] && image_id "$ref" || true)
    log "building $ref"
    command -v debootstrap >/dev/null || die "debootstrap is not installed (run scripts/setup.sh)"

    arch=$(dpkg --print-architecture)
    local opts=(--variant=minbase --include=procps --arch="$arch")
    # The downloaded packages are the slow, network-bound part; keep them so a
    # forced rebuild (or one after the image was deleted) works offline.
    local debs=$cache/debootstrap-bookworm-$arch-minbase-procps.tgz
    # The finished rootfs makes re-importing a deleted image take seconds.
    local rootfs=$cache/sbx-debian-12-$arch.tar

    if [ "$force" -eq 1 ] || [ ! -s "$rootfs" ]; then
        mirror=$(debian_mirror)
        if [ ! -s "$debs" ]; then
            log "downloading bookworm minbase packages from $mirror"
            busy "downloading packages" "$tmp/debootstrap.log" -- \
                debootstrap "${opts[@]}" --make-tarball="$tmp/debs.tgz" bookworm "$tmp/dl" "$mirror" \
                || { tail -n 30 "$tmp/debootstrap.log" >&2; die "debootstrap --make-tarball failed"; }
            mv "$tmp/debs.tgz" "$debs"
        else
            log "using cached packages $debs"
        fi
        log "debootstrapping rootfs (a few minutes)"
        busy "debootstrapping" "$tmp/debootstrap.log" -- \
            debootstrap "${opts[@]}" --unpack-tarball="$debs" bookworm "$root" "$mirror" \
            || { tail -n 30 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }

        # Docker supplies /dev, /proc, /sys, resolv.conf, hostname and hosts
        # at run time; the copies debootstrap took from this host must not leak.
        rm -rf --one-file-system "${root:?}"/dev/* "${root:?}"/proc/* "${root:?}"/sys/*
        rm -f "$root"/etc/resolv.conf "$root"/etc/hostname
        # Size: package lists and caches are useless in an image.
        rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
            "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/debconf/*-old \
            "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/*
        mkdir -p "$root/work"

        log "packing the rootfs"
        make_tar "$root" "$tmp/debian.tar"
        mv "$tmp/debian.tar" "$rootfs"
    else
        log "using cached rootfs $rootfs"
    fi

    write_archive "$rootfs" "$ref" "$want_cmd"
    if [ "$have_docker" -eq 1 ]; then
        import_tar "$rootfs" sbx-debian 12 "CMD $want_cmd" "$path_env"
        check_image "$ref" "$want_cmd" || die "$ref is not as expected after import"
        drop_old "$old" "$ref"
        sync_archive "$ref"
    fi
    log "$ref built in $((SECONDS - t0))s"
}

for w in "${want[@]}"; do
    "build_$w"
done
